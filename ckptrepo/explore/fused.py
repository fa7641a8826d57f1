"""Elementwise merges computed chunk by chunk on the worker pool, as the inputs are decoded.

``average``, ``weighted`` and ``task-arithmetic`` give each element of a tensor from the same
element of each input (and of the base) alone, and the inputs of a merge cut a tensor into chunks
at the same places (one chunk size per repository; a tensor stored whole, not as a distributed
commit's boxes). So one job of the pool takes a run of chunk positions and, for each, decodes that
chunk of the base (when the method has one), of the first input straight into the result's
memory, and of the other inputs into scratch buffers, each verified and each against the chunks
decoded just before as delta bases (a fine-tune's chunks are deltas against its parent's:
``ChunkReader.read_into(known=)``), then merges them in place while they are in cache
(``explore.merge``). Decoding and arithmetic run on every worker at once, and memory holds the
result and a few chunks per worker, not the inputs. ``fusable`` says when a tensor can go this
way; the others are read whole and merged by ``explore.merge.merged`` (``explore.merging``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ckptrepo.chunks.store import ChunkReader
from ckptrepo.errors import IntegrityError
from ckptrepo.explore.merge import MergeSpec
from ckptrepo.ingest.sources import Digest
from ckptrepo.locations import ChunkLocation
from ckptrepo.rows import TensorRow

if TYPE_CHECKING:
    import torch


class Input(Protocol):
    """What this module needs of a merge's commit (``explore.merging.Input``): its id and its
    tensors' rows and chunk locations by entry name."""

    @property
    def commit_id(self) -> str: ...

    @property
    def items(self) -> dict[str, tuple[TensorRow, list[ChunkLocation]]]: ...

ELEMENTWISE = ("average", "weighted", "task-arithmetic")
_JOBS_PER_WORKER = 4


def commits_of(spec: MergeSpec, inputs: Sequence[Input], base: Input | None) -> list[Input]:
    """The commits a merge reads a tensor of, in decoding order: the base first (the inputs' chunks
    are likely deltas against its), then the inputs."""
    return [*([base] if spec.uses_base and base is not None else []), *inputs]


def fusable(spec: MergeSpec, commits: Sequence[Input], name: str) -> bool:
    """Whether tensor ``name`` merges chunk by chunk: an elementwise method, and every commit's
    tensor stored whole, cut at the same places."""
    if spec.method not in ELEMENTWISE:
        return False
    rows = [c.items[name] for c in commits]
    first_row, first_locs = rows[0]
    return all(row.boxes is None and row.chunk_size == first_row.chunk_size and len(locs) == len(first_locs)
               and all(a.raw_length == b.raw_length for a, b in zip(locs, first_locs, strict=True))
               for row, locs in rows)


class Scratch:
    """Sets of scratch buffers (one per extra commit, a chunk each) that jobs take and give back,
    kept for the merge's later tensors. Thread-safe."""

    def __init__(self) -> None:
        self._idle: list[list[bytearray]] = []
        self._lock = threading.Lock()

    def take(self, count: int, size: int) -> list[bytearray]:
        with self._lock:
            found = self._idle.pop() if self._idle else []
        while len(found) < count:
            found.append(bytearray(size))
        for i, buf in enumerate(found):
            if len(buf) < size:
                found[i] = bytearray(size)
        return found

    def give(self, buffers: list[bytearray]) -> None:
        with self._lock:
            self._idle.append(buffers)


def fused_tensor(spec: MergeSpec, commits: Sequence[Input], name: str, out: torch.Tensor, reader: ChunkReader,
                 pool: Executor, scratch: Scratch, digests: list[Digest] | None = None) -> torch.Tensor:
    """Tensor ``name`` merged chunk by chunk (``fusable``) into ``out`` (a uint8 buffer of its bytes);
    returns it as a tensor of its dtype and shape. IntegrityError naming commit and tensor.
    ``digests``: an empty list, filled with each merged chunk's ``(offset, length, chunk id,
    moments)`` (``ingest.sources.LazySource.digests``), taken while the chunk is in cache, so a
    commit of the result need not go over its bytes again."""
    from ckptrepo.chunks.tensors import assemble, run_jobs

    row, locs = commits[1 if spec.uses_base else 0].items[name]  # the first input's
    lists = [c.items[name][1] for c in commits]
    bases = [reader.bases_for(x) for x in lists]  # delta chains' bases, one query per chain level
    spans, offset = [], 0
    for loc in locs:
        spans.append((offset, loc.raw_length))
        offset += loc.raw_length
    view = out.numpy().data if row.nbytes else memoryview(bytearray())
    size = max((n for _, n in spans), default=0)
    found: list[Digest | None] | None = [None] * len(spans) if digests is not None else None
    run_jobs(pool, len(spans), lambda positions: _run(spec, commits, name, lists, bases, spans, positions, view,
                                                      row.dtype, reader, scratch, size, found),
             jobs_per_worker=_JOBS_PER_WORKER)
    if digests is not None and found is not None:
        digests.extend(d for d in found if d is not None)
    return assemble(out, row.dtype, list(row.shape), None)


def _run(spec: MergeSpec, commits: Sequence[Input], name: str, lists: list[list[ChunkLocation]],
         bases: list[dict[str, ChunkLocation]], spans: list[tuple[int, int]], positions: range, view: memoryview,
         dtype: str, reader: ChunkReader, scratch: Scratch, size: int, digests: list[Digest | None] | None) -> None:
    """One job: decode and merge the chunks at ``positions`` (and digest each result, into ``digests``)."""
    from ckptrepo import state as st
    from ckptrepo.explore import merge
    from ckptrepo.ids import hash_bytes
    from ckptrepo.ingest.stats import moments_of_bytes

    lead = 1 if spec.uses_base else 0  # where the first input is among ``commits``
    plain = _plain_average(spec, dtype)
    buffers = scratch.take(len(commits) - 1, size)
    try:
        for k in positions:
            offset, length = spans[k]
            known: dict[str, memoryview] = {}
            parts: list[memoryview] = []
            others = iter(buffers)
            for j, commit in enumerate(commits):
                loc = lists[j][k]
                target = view[offset : offset + length] if j == lead else memoryview(next(others))[:length]
                try:
                    reader.read_into(loc, target, bases[j], known=known)
                except IntegrityError as exc:
                    detail = exc.fields.get("detail", exc.message)
                    raise IntegrityError(detail=f"tensor {name!r} of commit {commit.commit_id[:10]}: {detail}") from exc
                known[loc.chunk_id] = target
                parts.append(target)
            if plain is not None:  # an unweighted average of float32/64: numpy on the bytes, no tensor made
                acc = np.frombuffer(parts[0], dtype=plain)
                for p in parts[1:]:
                    np.add(acc, np.frombuffer(p, dtype=plain), out=acc)
                np.divide(acc, float(len(parts)), out=acc)
            else:
                xs = [st.tensor_from_bytes(p, dtype, [length // _itemsize(dtype)]) for p in parts]
                if spec.uses_base:
                    assert spec.weights is not None and spec.lam is not None
                    merge.task_arithmetic(xs[0], xs[1:], spec.weights, spec.lam, out=xs[1])
                else:
                    assert spec.weights is not None
                    merge.linear(xs, spec.weights, out=xs[0])
            if digests is not None:  # the merged chunk, while it is in cache: what ingest would take of it
                result = view[offset : offset + length]
                digests[k] = (offset, length, hash_bytes(result), moments_of_bytes(result, dtype))
    finally:
        scratch.give(buffers)


def _plain_average(spec: MergeSpec, dtype: str) -> str | None:
    """The numpy dtype when chunks of ``dtype`` merge as ``(x_1 + ... + x_n) / n`` in their own
    precision (a linear merge with every weight 1, of float32 or float64), else None. numpy's
    elementwise add and divide round as ``merge.linear``'s torch ops do for those weights (the
    same bits, tested), without making a tensor for each chunk."""
    if spec.uses_base or spec.weights is None or any(w != 1 for w in spec.weights):
        return None
    return dtype if dtype in ("float32", "float64") else None


def _itemsize(dtype: str) -> int:
    from ckptrepo import dtypes

    return dtypes.dtype(dtype).itemsize
