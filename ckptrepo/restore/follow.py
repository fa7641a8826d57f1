"""Following a branch: apply each new commit of a branch to live tensors in place, reading only
the chunks that changed (``Repo.follow``).

A ``Follower`` keeps, for every entry of the state it updates (``into``, flattened as a commit
flattens it: the same entry names), the chunk locations of the commit it holds. When the branch
moves (polled: the ref row, after ``refresh``, which for a remote-tracking ref fetches), it reads
the new commit's layout and, per tensor whose id changed, the chunks whose id differs from the one
it holds at the same offset. Each such chunk is decoded into a scratch buffer, verified against
its id (``ChunkReader``), then copied into the tensor's memory at its offset: nothing unverified
ever reaches ``into``. A DELTA chunk whose base is a chunk the follower holds (with
``CKPT_FOLLOW_DELTAS`` commits, the parent's chunk at the same offset) is decoded against the
follower's own bytes (``ChunkReader.read_into(known=)``), so only its payload is read; a base
it does not hold is decoded from the store down its chain, stopping at any chunk it holds
(catching up over several commits reads each missed delta, not a keyframe). When a decode against
the follower's bytes fails its check (those bytes are not what the follower holds: altered in
memory, or a damaged payload), the chunk is read again from the store alone; only if that fails
too does the update raise (IntegrityError), and the chunks it applied before stay applied and
recorded as held, so a retry continues from there.

What is not re-read: a chunk whose id did not change. The follower trusts that ``into`` still
holds what it applied (``since=``: what that commit holds); nothing else hashes the live tensors.
Only tensors are applied: the state's other values (an optimizer's hyper-parameters, a step
counter) are not. Entries, dtypes and shapes must match the commit's (StateMismatch, nothing
written, otherwise); a tensor stored as boxes or cut on another grid is read whole.

Threads: decoding runs on the repository's pool; the follower itself is used from one thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch

from ckptrepo import state as st
from ckptrepo import types as t
from ckptrepo.chunks.codecs import Encoding
from ckptrepo.chunks.store import ChunkReader, Fallback
from ckptrepo.chunks.tensors import assemble, run_jobs
from ckptrepo.db.engine import Sessions
from ckptrepo.errors import CkptError, IntegrityError, StateMismatch, UnknownRevision, UsageError
from ckptrepo.ids import short
from ckptrepo.lineage import revparse
from ckptrepo.locations import ChunkLocation
from ckptrepo.restore.layout import layout_of
from ckptrepo.rows import TensorRow
from ckptrepo.storage.base import Backend

BaseLookup = Callable[[Collection[str]], dict[str, ChunkLocation]]
_MAX_CHAIN = 64  # the reader's bound on delta hops


class CountingBackend:
    """A store seen through ``read_into`` alone, counting the bytes read (the follower's figure:
    what it actually read, wherever the store keeps them: a lazy clone's remote too)."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.reads = 0

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        self._backend.read_into(key, offset, out)
        with self._lock:
            self.bytes_read += len(out)
            self.reads += 1

    def take(self) -> tuple[int, int]:
        """Bytes and reads since the last ``take``."""
        with self._lock:
            out = (self.bytes_read, self.reads)
            self.bytes_read = self.reads = 0
        return out


@dataclass
class _Entry:
    """One tensor of ``into``: the live tensor, its bytes when they can be written in place (a
    contiguous CPU tensor), and the locations of the chunks it holds (None: not known)."""

    tensor: torch.Tensor
    data: memoryview | None
    held: list[ChunkLocation | None] = field(default_factory=list)
    tensor_id: str | None = None


@dataclass
class _Counts:
    chunks: int = 0
    delta: int = 0  # delta payloads (decoded against the follower's own bytes, or down a chain to them)
    fallbacks: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, *, delta: bool, fallback: bool) -> None:
        with self.lock:
            self.chunks += 1
            self.delta += delta
            self.fallbacks += fallback


def _writable_bytes(x: torch.Tensor) -> memoryview | None:
    """``x``'s bytes, writable in place, or None (another device: written through copies)."""
    if x.device.type != "cpu":
        return None
    return x.detach().reshape(-1).view(torch.uint8).numpy().data if x.numel() else memoryview(bytearray())


class Follower(Iterator[t.Commit]):
    """The iterator ``Repo.follow`` returns (see the module docstring). Each ``next`` waits for
    the followed ref to name a commit other than the one held (every ``poll`` seconds), applies
    it to ``into`` and returns it; iteration ends when ``stop`` is set, ``close`` is called, or
    no new commit came for ``timeout`` seconds. ``last``: the figures of the latest update."""

    def __init__(self, *, reading: Sessions, backend: Backend, lookup: BaseLookup, fallback: Fallback | None,
                 pool: Executor, ref: str, into: Any, since: str | None, poll: float, timeout: float | None,
                 stop: threading.Event | None, refresh: Callable[[], None] | None,
                 before_read: Callable[[], None], commit_of: Callable[[str], t.Commit]) -> None:
        if poll <= 0:
            raise UsageError(f"poll interval {poll} must be positive")
        if timeout is not None and timeout < 0:
            raise UsageError(f"timeout {timeout} must not be negative")
        self._reading, self._lookup, self._pool = reading, lookup, pool
        self._backend = CountingBackend(backend)
        self._reader = ChunkReader(cast(Backend, self._backend), lookup, fallback=fallback)
        self._ref, self._poll, self._timeout = ref, poll, timeout
        self._stop = stop if stop is not None else threading.Event()
        self._refresh, self._before_read, self._commit_of = refresh, before_read, commit_of
        self._local = threading.local()
        self._entries = self._targets(into)
        self.held: str | None = None
        self.last: t.FollowUpdate | None = None
        if since is not None:
            self._hold(since)

    # -- the iterator --------------------------------------------------------------------

    def __iter__(self) -> Follower:
        return self

    def __next__(self) -> t.Commit:
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while not self._stop.is_set():
            head = self._head()
            if head is not None and head != self.held:
                return self.apply(head)
            if deadline is not None and time.monotonic() >= deadline:
                break
            wait = self._poll if deadline is None else max(0.0, min(self._poll, deadline - time.monotonic()))
            self._stop.wait(wait)
        raise StopIteration

    def close(self) -> None:
        """End the iteration (from any thread): the ``next`` under way returns once its update is done."""
        self._stop.set()

    def _head(self) -> str | None:
        """The commit the followed ref names now, None while it names none."""
        if self._refresh is not None:
            self._refresh()
        try:
            with self._reading() as s:
                return revparse.resolve(s, self._ref)
        except UnknownRevision:
            return None

    # -- applying a commit ---------------------------------------------------------------

    def apply(self, rev: str) -> t.Commit:
        """Make ``into`` hold commit ``rev``'s tensors, reading only the chunks it lacks; returns the commit."""
        started = time.perf_counter()
        self._before_read()
        self._backend.take()
        cid, _, items = layout_of(self._reading, rev)
        self._check(cid, items)
        work: list[tuple[_Entry, int, ChunkLocation, int]] = []  # entry, chunk index, location, byte offset
        whole: list[tuple[str, _Entry, TensorRow, list[ChunkLocation]]] = []
        changed = 0
        for name, (row, locs) in items.items():
            entry = self._entries[name]
            if row.tensor_id == entry.tensor_id:
                continue
            changed += 1
            same_grid = row.boxes is None and len(entry.held) == len(locs) and all(
                h is None or h.raw_length == loc.raw_length for h, loc in zip(entry.held, locs, strict=True))
            if not same_grid:
                whole.append((name, entry, row, locs))
                continue
            offset = 0
            for i, loc in enumerate(locs):
                held = entry.held[i]
                if held is None or held.chunk_id != loc.chunk_id:
                    work.append((entry, i, loc, offset))
                offset += loc.raw_length
        counts = _Counts()
        if work:
            known = self._known(work)
            bases = self._bases([loc for _, _, loc, _ in work], known)
            run_jobs(self._pool, len(work), lambda r: self._apply_run(work[r.start : r.stop], known, bases, counts))
        for name, entry, row, locs in whole:  # another grid or boxes: the tensor read whole, then copied
            self._apply_whole(cid, name, entry, row, locs, counts)
        for name, (row, _) in items.items():
            self._entries[name].tensor_id = row.tensor_id
        previous, self.held = self.held, cid
        read, requests = self._backend.take()
        commit = self._commit_of(cid)
        self.last = t.FollowUpdate(commit_id=cid, previous=previous, tensors_changed=changed, chunks_read=counts.chunks,
                                   delta_chunks=counts.delta, fallbacks=counts.fallbacks, bytes_read=read,
                                   reads=requests, seconds=time.perf_counter() - started)
        return commit

    def _hold(self, rev: str) -> None:
        """Take ``into`` as holding commit ``rev`` (``since``): its chunks become the held ones."""
        cid, _, items = layout_of(self._reading, rev)
        self._check(cid, items)
        for name, (row, locs) in items.items():
            entry = self._entries[name]
            entry.held, entry.tensor_id = list(locs), row.tensor_id
        self.held = cid

    def _targets(self, into: Any) -> dict[str, _Entry]:
        if into is None:
            raise UsageError("follow needs a state to apply commits to", hint="Pass into=model (or a dict of tensors).")
        flat = st.flatten(into)
        entries: dict[str, _Entry] = {}
        problems = []
        for name, x in flat.tensors.items():
            if flat.kinds.get(name) == "pickle":
                problems.append(f"{name!r} is not a tensor")
            elif not x.is_contiguous():
                problems.append(f"{name!r} is not contiguous: it cannot be updated in place")
            else:
                entries[name] = _Entry(x, _writable_bytes(x))
        if problems:
            raise StateMismatch(count=len(problems), detail="; ".join(problems[:10]), differences=problems)
        return entries

    def _check(self, cid: str, items: Mapping[str, tuple[TensorRow, list[ChunkLocation]]]) -> None:
        """StateMismatch, before anything is written, unless every tensor of commit ``cid`` has
        its place in ``into`` with the same dtype and shape, and ``into`` has no other tensor."""
        problems = [f"{name!r} is not in commit {short(cid)}" for name in self._entries if name not in items]
        for name, (row, _) in items.items():
            entry = self._entries.get(name)
            if entry is None:
                problems.append(f"commit {short(cid)} has {name!r}, which the state followed lacks")
                continue
            x = entry.tensor
            have = (str(x.dtype).removeprefix("torch."), list(x.shape))
            if have != (row.dtype, list(row.shape)):
                problems.append(f"{name!r} is {have[0]} {have[1]} here, {row.dtype} {list(row.shape)} in the commit")
        if problems:
            raise StateMismatch(count=len(problems), detail="; ".join(problems[:10]), differences=problems)

    def _known(self, work: list[tuple[_Entry, int, ChunkLocation, int]]) -> dict[str, memoryview]:
        """The follower's own bytes of the chunks it holds where chunks change, by id: delta bases."""
        known: dict[str, memoryview] = {}
        for entry, i, _, offset in work:
            held = entry.held[i]
            if held is None or held.chunk_id in known:
                continue
            if entry.data is not None:
                known[held.chunk_id] = entry.data[offset : offset + held.raw_length]
            else:  # another device: a host copy of that range
                flat = st.bit_view(entry.tensor.detach()).reshape(-1).view(torch.uint8)
                known[held.chunk_id] = flat[offset : offset + held.raw_length].cpu().numpy().data
        return known

    def _bases(self, locs: list[ChunkLocation], known: Mapping[str, memoryview]) -> dict[str, ChunkLocation]:
        """The locations of the delta chains of ``locs``, each followed down to a chunk in ``known``."""
        found: dict[str, ChunkLocation] = {}
        wanted = {loc.base_id for loc in locs if loc.base_id is not None and loc.base_id not in known}
        for _ in range(_MAX_CHAIN):
            wanted -= found.keys()
            if not wanted:
                break
            got = self._lookup(sorted(wanted))
            if not got:
                break
            found.update(got)
            wanted = {loc.base_id for loc in got.values() if loc.base_id is not None and loc.base_id not in known}
        return found

    def _scratch(self, size: int) -> memoryview:
        buf: np.ndarray | None = getattr(self._local, "buf", None)
        if buf is None or buf.shape[0] < size:
            buf = self._local.buf = np.empty(size, dtype=np.uint8)
        return buf[:size].data

    def _apply_run(self, run: list[tuple[_Entry, int, ChunkLocation, int]], known: Mapping[str, memoryview],
                   bases: Mapping[str, ChunkLocation], counts: _Counts) -> None:
        for entry, i, loc, offset in run:
            out = self._scratch(loc.raw_length)
            fallback = False
            try:
                self._reader.read_into(loc, out, bases, known=known)
            except IntegrityError:
                if loc.encoding != Encoding.DELTA:
                    raise  # the stored chunk itself is damaged (and no remote had it): ``into`` keeps its bytes
                # Decoded against bytes that are not what the follower holds, or a damaged chain:
                # read from the store alone, every base decoded from there.
                fallback = True
                self._reader.read_into(loc, out, self._reader.bases_for([loc]))
            self._write(entry, offset, out)
            entry.held[i] = loc
            counts.add(delta=loc.encoding == Encoding.DELTA and not fallback, fallback=fallback)

    def _write(self, entry: _Entry, offset: int, data: memoryview) -> None:
        if entry.data is not None:
            entry.data[offset : offset + len(data)] = data
            return
        flat = st.bit_view(entry.tensor.detach()).reshape(-1).view(torch.uint8)
        flat[offset : offset + len(data)].copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))

    def _apply_whole(self, cid: str, name: str, entry: _Entry, row: TensorRow, locs: list[ChunkLocation],
                     counts: _Counts) -> None:
        stream = torch.empty(row.nbytes, dtype=torch.uint8)
        view = stream.numpy().data if row.nbytes else memoryview(bytearray())
        bases = self._reader.bases_for(locs)
        offset = 0
        for loc in locs:
            try:
                self._reader.read_into(loc, view[offset : offset + loc.raw_length], bases)
            except CkptError as exc:
                raise IntegrityError(detail=f"tensor {name!r} of commit {short(cid)}: "
                                            f"{exc.fields.get('detail', exc)}") from exc
            offset += loc.raw_length
            counts.add(delta=False, fallback=False)
        value = assemble(stream, row.dtype, list(row.shape), row.boxes)
        st.bit_view(entry.tensor.detach()).copy_(st.bit_view(value))
        entry.held = [None] * len(locs) if row.boxes is not None else list(locs)
