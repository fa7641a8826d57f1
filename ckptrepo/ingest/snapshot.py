"""Phase 1 of an asynchronous commit: the snapshot of a state in staging memory.

``Snapshots.take`` copies a state's tensors into a reused staging slot (``ingest.staging``) on
the caller's thread; once it returns, the caller may mutate its tensors again. Into a slot used
before, the copy also takes the float chunks' statistics (``Slot.copy_summarized``), so phase 2
only hashes. When the commit will store its new chunks raw, a ``WriteAhead`` writes the staged
bytes into pack files while phase 2 hashes them (``ingest.writeahead``); into a fresh arena,
whose copy runs at the speed of the kernel's page faults, it starts during the copy.

Thread contract: ``take`` and ``reserve`` run on the committing thread; a ``Snapshot``'s
``release`` is called exactly once, by whoever finishes the commit (the committer thread, or
the caller when the commit fails before phase 2 is queued: ``abandon``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

import torch

from ckptrepo import knobs
from ckptrepo.config import RepoConfig
from ckptrepo.ingest.staging import Slot, StagingPool
from ckptrepo.ingest.stats import Moments
from ckptrepo.ingest.writeahead import WriteAhead
from ckptrepo.storage.base import Backend


@dataclass
class Snapshot:
    """A state copied into a staging slot: the copies by entry name, how long ``take`` waited
    for a free slot, the write-ahead started on it (or None), the chunks' statistics the copy
    took (or None), and ``release``, which hands the slot back (after the write-ahead closed)."""

    staged: dict[str, torch.Tensor]
    waited: float
    ahead: WriteAhead | None
    summaries: list[Moments | None] | None
    release: Callable[[], None]

    def abandon(self) -> None:
        """Drop a snapshot whose commit failed before phase 2 was queued."""
        if self.ahead is not None:
            self.ahead.close()  # its writers read the slot: closed before the slot is released
        self.release()


class Snapshots:
    """The staging slots of one repository's asynchronous commits (see the module docstring).
    ``max_inflight`` bounds the commits staged and not yet durable, ``staging_budget`` (bytes,
    None: unbounded) their staged bytes; ``take`` waits when either is used up."""

    def __init__(self, backend: Backend, config: RepoConfig, *, max_inflight: int, staging_budget: int | None,
                 pool: Executor, ahead_pool: Executor) -> None:
        self._backend = backend
        self._config = config
        self._pool = pool
        self._ahead_pool = ahead_pool
        self._staging = StagingPool(max_inflight, staging_budget)
        self._write_ahead = knobs.get_bool("WRITE_AHEAD")
        self._copy_stats = knobs.get_bool("COPY_STATS")

    @property
    def staging(self) -> StagingPool:
        return self._staging

    def reserve(self, tensors: dict[str, torch.Tensor]) -> int:
        """Allocate and fault in every idle slot's arena for states laid out like ``tensors``
        (``StagingPool.reserve``); returns the staged bytes per slot."""
        return self._staging.reserve(tensors)

    def take(self, tensors: dict[str, torch.Tensor], *, raw: bool, unchanged: frozenset[str],
             summarize: bool = True) -> Snapshot:
        """Copy ``tensors`` into a free slot, waiting for one. ``raw``: the commit stores its new
        chunks raw, so a write-ahead writes every tensor not named in ``unchanged`` (those the
        previous commit found unchanged). ``summarize``: the copy also takes the statistics.
        A failed copy releases the slot and raises; nothing is stored."""
        slot, waited = self._staging.acquire(self._staging.staged_bytes(tensors))
        release = functools.partial(self._staging.release, slot)
        try:
            staged = slot.prepare(tensors)
        except BaseException:
            release()
            raise
        snap = Snapshot(staged, waited, None, None, release)
        try:
            snap.ahead = self._plan_write_ahead(slot, staged, unchanged) if raw else None
            # Phase 2 and the write-ahead start once the copy has ended: started during it, their
            # database reads and wake-ups took the interpreter lock from the copying thread and
            # the copy took twice as long under training. Except into a fresh arena: that copy
            # is bound by the kernel faulting its pages in, and the files it has filled are
            # written meanwhile.
            early = None
            if snap.ahead is not None and slot.fresh:
                early = functools.partial(snap.ahead.copied, executor=self._ahead_pool)
            if early is None and summarize and self._copy_stats:
                snap.summaries = slot.copy_summarized(tensors, staged, self._config.chunk_size, self._pool)
            else:
                slot.copy(tensors, staged, progress=early)
        except BaseException:
            snap.abandon()
            raise
        return snap

    def start_write_ahead(self, snap: Snapshot) -> None:
        """Start the snapshot's write-ahead, before its phase 2 is queued (phase 2 must find the
        writes started when it seals them)."""
        if snap.ahead is not None:
            snap.ahead.start(self._ahead_pool)

    def _plan_write_ahead(self, slot: Slot, staged: dict[str, torch.Tensor],
                          unchanged: frozenset[str]) -> WriteAhead | None:
        arena = slot.arena
        if not self._write_ahead or arena is None:
            return None
        ahead = WriteAhead(self._backend, arena, list(staged.values()), [n not in unchanged for n in staged],
                           target=self._config.pack_target, chunk_size=self._config.chunk_size)
        return ahead if ahead.tensors else None

    def clear(self) -> None:
        """Free the idle slots' arenas."""
        self._staging.clear()
