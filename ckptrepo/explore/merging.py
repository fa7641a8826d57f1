"""Weight-space merges over commits, one tensor at a time (``Repo.merge_weights``).

``check`` compares the inputs' layouts (the catalog's rows: names, dtypes, shapes, tensor ids)
before any merge arithmetic: every input, and the base, must hold the same tensor names, each with
one dtype and shape, and every tensor that is not merged (integer, bool and other non-float
tensors: step counters, position ids) must be equal everywhere (compared by tensor id, else by
its bytes); else MergeMismatch naming the tensor, before anything is written.

``stream`` turns the plan into ``ingest.sources.LazySource`` s, one per tensor in the first
input's order: when the commit's ingest reaches a tensor it gets the merged bytes (read from each
input's chunks, verified, merged by ``explore.merge`` in fp32, cast back), and drops them once
that tensor's chunks are in packs. A thread computes the next tensor meanwhile, so memory holds
the inputs of one tensor, its result and the previous result being ingested: a few tensors, never
a model. A tensor every input (and the base, for the methods that use one) holds under one
tensor id is the formula's exact value already: it is copied, not recomputed, and its chunks
deduplicate against the stored ones; so are the tensors that are not merged (from the first
input). The non-tensor skeleton is the first input's.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckptrepo import dtypes
from ckptrepo.chunks.store import ChunkReader
from ckptrepo.errors import MergeMismatch
from ckptrepo.explore import fused
from ckptrepo.explore.merge import MergeSpec
from ckptrepo.ingest.sources import Digest, LazySource
from ckptrepo.locations import ChunkLocation
from ckptrepo.rows import TensorRow

if TYPE_CHECKING:
    import torch

Items = dict[str, tuple[TensorRow, list[ChunkLocation]]]

# Float formats merged in fp32 and cast back; every other dtype is copied and must be equal.
_NOT_MERGED = frozenset({"float4_e2m1fn_x2", "float8_e8m0fnu"})


@dataclass(frozen=True)
class Input:
    """One commit of a merge: how the caller named it (for messages), its id, skeleton and tensor
    layout (``restore.layout.layout_of``)."""

    label: str
    commit_id: str
    skeleton: Any
    items: Items


@dataclass(frozen=True)
class Plan:
    """What ``check`` found: the tensors in order, each merged (``merge``) or copied from the first
    input (``copy``: not a float, or one tensor id everywhere)."""

    spec: MergeSpec
    inputs: tuple[Input, ...]
    base: Input | None
    names: tuple[str, ...]
    merge: frozenset[str]

    @property
    def skeleton(self) -> Any:
        return self.inputs[0].skeleton


def merged_dtype(name: str) -> bool:
    """Whether tensors of stored dtype ``name`` are merged (real floats) or copied."""
    return dtypes.dtype(name).is_floating_point and name not in _NOT_MERGED


def check(spec: MergeSpec, inputs: Sequence[Input], base: Input | None, reader: ChunkReader,
          pool: Executor) -> Plan:
    """The merge plan of ``inputs`` (and ``base``), or MergeMismatch naming the first tensor that is
    missing from one of them, differs in dtype or shape, or is a tensor that is not merged and
    differs in value (read and compared only when the tensor ids differ). Nothing is written."""
    first = inputs[0]
    others = [*inputs[1:], *([base] if base is not None else [])]
    for other in others:
        for a, b in ((first, other), (other, first)):
            missing = [n for n in a.items if n not in b.items]
            if missing:
                more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
                raise MergeMismatch(name=missing[0], why=f"is in {a.label} but not in {b.label}{more}")
    merge: set[str] = set()
    for name, (row, _) in first.items.items():
        rows = [(x.label, x.items[name][0]) for x in others]
        for label, theirs in rows:
            if theirs.dtype != row.dtype:
                raise MergeMismatch(name=name, why=f"is {row.dtype} in {first.label} but {theirs.dtype} in {label}")
            if list(theirs.shape) != list(row.shape):
                raise MergeMismatch(name=name, why=f"has shape {list(row.shape)} in {first.label} but "
                                                   f"{list(theirs.shape)} in {label}")
        if len({row.tensor_id, *(r.tensor_id for _, r in rows)}) == 1:
            continue  # one tensor everywhere: copied (the formula's exact value)
        if merged_dtype(row.dtype):
            merge.add(name)
        else:
            _require_equal(name, row.dtype, [first, *others], reader, pool)
    return Plan(spec, tuple(inputs), base, tuple(first.items), frozenset(merge))


def _require_equal(name: str, dtype: str, commits: Sequence[Input], reader: ChunkReader, pool: Executor) -> None:
    """MergeMismatch unless tensor ``name`` (not merged) has the same bytes in every commit."""
    import numpy as np

    from ckptrepo import state as st

    def raw(commit: Input) -> np.ndarray[Any, Any]:
        return np.frombuffer(st.tensor_bytes(read(commit, name, reader, pool)), dtype=np.uint8)

    first = raw(commits[0])
    for other in commits[1:]:
        if not np.array_equal(raw(other), first):
            raise MergeMismatch(name=name, why=(
                f"is a {dtype} tensor, which is copied, not merged, and it differs between {commits[0].label} "
                f"and {other.label}"))


def read(commit: Input, name: str, reader: ChunkReader, pool: Executor, buffers: _Buffers | None = None,
         known: dict[str, memoryview] | None = None) -> torch.Tensor:
    """Tensor ``name`` of ``commit``, every chunk verified (IntegrityError naming commit and tensor),
    decoded into a buffer of ``buffers`` (else a new one). ``known``: chunks read already (their
    verified bytes by id), the delta bases of this one's chunks where they are (a fine-tune's
    chunks are deltas against its parent's: ``ChunkReader.read_into``); this tensor's chunks are
    added to it."""
    import torch

    from ckptrepo.chunks.tensors import assemble, read_runs
    from ckptrepo.errors import IntegrityError

    row, locs = commit.items[name]
    if sum(c.raw_length for c in locs) != row.nbytes or len(locs) != len(row.chunk_ids):
        raise IntegrityError(detail=f"tensor {name!r} of commit {commit.commit_id[:10]} has missing chunks")
    buf = buffers.take(row.nbytes) if buffers is not None else torch.empty(row.nbytes, dtype=torch.uint8)
    view = buf.numpy().data if row.nbytes else memoryview(bytearray())
    work, offset = [], 0
    for loc in locs:
        work.append((name, loc, view[offset : offset + loc.raw_length]))
        offset += loc.raw_length
    read_runs(reader, pool, work, commit_id=commit.commit_id, known=known)
    if known is not None and row.boxes is None:
        known.update((loc.chunk_id, out) for _, loc, out in work)
    return assemble(buf, row.dtype, list(row.shape), row.boxes)


class _Buffers:
    """Byte buffers that tensors are read into, reused from one tensor to the next of the same size
    (a model repeats its layers' shapes): decoding into fresh memory costs its page faults, about
    as much as decoding. An idle buffer is kept only while a later tensor still needs its size
    (``sizes``: every read the merge will make, in bytes), so none outlives the last one. Thread-safe."""

    def __init__(self, sizes: Iterable[int]) -> None:
        self._wanted = Counter(sizes)
        self._idle: dict[int, list[torch.Tensor]] = {}
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor:
        import torch

        with self._lock:
            if self._wanted[nbytes] > 0:
                self._wanted[nbytes] -= 1
            idle = self._idle.get(nbytes)
            if idle:
                return idle.pop()
        return torch.empty(nbytes, dtype=torch.uint8)

    def give(self, tensor: torch.Tensor) -> None:
        """Return the buffer ``tensor`` was read into (a tensor ``read`` gave, or one over its memory)."""
        import torch

        storage = tensor.untyped_storage()
        nbytes = storage.nbytes()
        with self._lock:
            idle = self._idle.setdefault(nbytes, [])
            if len(idle) < self._wanted[nbytes]:
                idle.append(torch.empty(0, dtype=torch.uint8).set_(storage))


def sizes(plan: Plan) -> list[int]:
    """The bytes of every tensor a merge reads whole, one entry per read (``_Buffers``)."""
    out = []
    commits = fused.commits_of(plan.spec, plan.inputs, plan.base)
    for name in plan.names:
        nbytes = plan.inputs[0].items[name][0].nbytes
        whole = name in plan.merge and not fused.fusable(plan.spec, commits, name)
        out.extend([nbytes] * (len(commits) if whole else 1))
    return out


def merged_tensor(plan: Plan, name: str, reader: ChunkReader, pool: Executor, buffers: _Buffers | None = None,
                  scratch: fused.Scratch | None = None, digests: list[Digest] | None = None) -> torch.Tensor:
    """Tensor ``name`` of the merge: the inputs' merged chunk by chunk (``explore.fused``) or whole
    (``explore.merge.merged``), or the first input's copied (``Plan.merge``). With ``buffers``,
    read into them, and those the result does not use given back. ``digests`` (an empty list):
    filled with the result's chunk digests when it is merged chunk by chunk (``fused_tensor``)."""
    import torch

    from ckptrepo.explore.merge import merged

    if name not in plan.merge:
        return read(plan.inputs[0], name, reader, pool, buffers)
    commits = fused.commits_of(plan.spec, plan.inputs, plan.base)
    if fused.fusable(plan.spec, commits, name):
        nbytes = plan.inputs[0].items[name][0].nbytes
        out = buffers.take(nbytes) if buffers is not None else torch.empty(nbytes, dtype=torch.uint8)
        return fused.fused_tensor(plan.spec, commits, name, out, reader, pool, scratch or fused.Scratch(), digests)
    known: dict[str, memoryview] = {}  # the base first: the inputs' chunks are likely deltas against its
    base = read(plan.base, name, reader, pool, buffers, known) if plan.spec.uses_base and plan.base else None
    xs = [read(x, name, reader, pool, buffers, known) for x in plan.inputs]
    known.clear()
    out = merged(plan.spec, xs, base, reuse=True)
    if buffers is not None:
        held = out.untyped_storage().data_ptr()
        for x in [*xs, *([base] if base is not None else [])]:
            if x.untyped_storage().data_ptr() != held:
                buffers.give(x)
    return out


class _Ahead:
    """Produces the plan's tensors in order, computing the next ``depth`` ones on a thread of its own
    while the caller ingests the current one (so the workers always have chunks to decode or hash);
    a tensor asked for out of order (a commit that writes again) is computed on the caller's
    thread. The caller asks for tensor ``i + 1`` only once it is done with tensor ``i``
    (``ingest``'s contract for lazy sources), so then the memory of tensor ``i`` goes back to the
    buffers."""

    def __init__(self, plan: Plan, reader: ChunkReader, pool: Executor, depth: int = 2) -> None:
        self._plan, self._reader, self._pool, self._depth = plan, reader, pool, depth
        self._buffers = _Buffers(sizes(plan))
        self._scratch = fused.Scratch()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-merge")
        self._ahead: deque[tuple[int, Future[tuple[torch.Tensor, list[Digest]]]]] = deque()
        self._out: torch.Tensor | None = None  # the tensor handed out last
        self._digests: tuple[int, list[Digest]] | None = None  # its index and its chunks' digests

    def _compute(self, i: int) -> tuple[torch.Tensor, list[Digest]]:
        digests: list[Digest] = []
        tensor = merged_tensor(self._plan, self._plan.names[i], self._reader, self._pool, self._buffers,
                               self._scratch, digests)
        return tensor, digests

    def produce(self, i: int) -> memoryview:
        from ckptrepo import state as st

        if self._out is not None:
            self._buffers.give(self._out)
            self._out, self._digests = None, None
        if self._ahead and self._ahead[0][0] == i:
            tensor, digests = self._ahead.popleft()[1].result()
        else:
            self._cancel()  # stale ones finish before this computes
            tensor, digests = self._compute(i)
        queued = self._ahead[-1][0] if self._ahead else i
        for j in range(queued + 1, min(i + 1 + self._depth, len(self._plan.names))):
            self._ahead.append((j, self._thread.submit(self._compute, j)))
        self._out, self._digests = tensor, (i, digests)
        return st.tensor_bytes(tensor)

    def digests(self, i: int) -> list[Digest] | None:
        """The chunk digests of tensor ``i``, produced last (None when it was not merged chunk by
        chunk, or is no longer the one handed out)."""
        if self._digests is None or self._digests[0] != i or not self._digests[1]:
            return None
        return self._digests[1]

    def _cancel(self) -> None:
        while self._ahead:
            future = self._ahead.popleft()[1]
            future.cancel()
            if not future.cancelled():
                future.exception()

    def close(self) -> None:
        self._cancel()
        self._thread.shutdown(wait=True)
        self._out = None


@contextmanager
def stream(plan: Plan, reader: ChunkReader, pool: Executor) -> Iterator[list[LazySource]]:
    """The merge's tensors as lazy sources (entry name, dtype, shape, bytes made on demand), valid
    inside the ``with`` block; its thread is stopped when the block ends."""
    ahead = _Ahead(plan, reader, pool)
    try:
        first = plan.inputs[0].items
        yield [LazySource(name, first[name][0].dtype, tuple(first[name][0].shape),
                          functools.partial(ahead.produce, i), functools.partial(ahead.digests, i))
               for i, name in enumerate(plan.names)]
    finally:
        ahead.close()
