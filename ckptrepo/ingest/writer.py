"""The commit engine: every commit of a repository goes through one ``CommitWriter``.

A commit is made in three steps, the write ordering of docs/design.md:

1. ``write_packs``: chunk, hash, deduplicate and encode the state's bytes (``Source`` s) and
   make every new pack durable in the store. Nothing in the database names them yet: the
   commit's lease (``ledger.leases``, taken before the first pack and released after step 2)
   keeps ``gc`` from them meanwhile.
2. ``record``: one write transaction inserts the chunk locations, tensors, the commit and its
   edges and moves the branch by compare-and-swap. The commit is visible when it commits, and
   not before: a failure or crash before leaves at most unreferenced packs (``gc`` reclaims).
3. The commit (``types.Commit``) is built from what the transaction inserted.

``plan`` resolves a request's parents first (the branch head, given revisions, a transfer
source) and reads the first parent's layout, which both steps use. A distributed commit runs
``write_packs`` on every rank for its share of the bytes and ``plan`` / ``record`` on one.

``submit`` is the whole commit of a state of torch tensors: phase 1 on the caller's thread
(the snapshot into staging memory, ``ingest.snapshot``), phase 2 (the three steps above) on the
committer thread (``ingest.committer``), in call order, at most ``max_inflight`` in flight.
``commit_now`` commits sources on the caller's thread (blocking commits, imported files).

Caches kept across commits of this process, none of which changes what a commit stores, only
what it costs: the layout of the commit recorded last (the next commit's first parent, usually:
not read back), the names of tensors the last commit found unchanged (not written ahead), what
encoding learnt per tensor name (``PlaneHint``), recent chunks as delta bases (``BaseCache``),
and the new chunks of the layouts this process left pending (``db.pending``).
"""

from __future__ import annotations

import functools
import os
import socket
import time
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypedDict

from sqlalchemy.exc import IntegrityError as DbIntegrityError
from sqlalchemy.exc import OperationalError as DbOperationalError
from sqlalchemy.orm import Session, sessionmaker

from ckptrepo import faults, knobs
from ckptrepo import types as t
from ckptrepo.chunks.codecs import PlaneHint
from ckptrepo.chunks.store import ChunkReader, PackSink
from ckptrepo.config import RepoConfig
from ckptrepo.db import catalog, pending, refs, views
from ckptrepo.db.engine import write_transaction
from ckptrepo.errors import (
    CommitFailed,
    CommitReadFailed,
    ConcurrentChange,
    ForkedProcess,
    RefConflict,
    StoreFull,
    UsageError,
    storage_failure,
)
from ckptrepo.handle import CommitHandle
from ckptrepo.ids import short
from ckptrepo.ingest import priority, request
from ckptrepo.ingest.basecache import BaseCache
from ckptrepo.ingest.bases import delta_plan
from ckptrepo.ingest.committer import Committer
from ckptrepo.ingest.idle import IdleRepack
from ckptrepo.ingest.pipeline import DeltaPlan, IngestOptions, IngestResult, ingest
from ckptrepo.ingest.request import CommitMeta, CommitRequest
from ckptrepo.ingest.sources import LazySource, Source, from_tensors
from ckptrepo.ingest.spare import SpareCpuGate
from ckptrepo.ledger import leases, manifest
from ckptrepo.lineage import revparse
from ckptrepo.storage.base import Backend

if TYPE_CHECKING:
    import torch

    from ckptrepo.ingest.snapshot import Snapshots
    from ckptrepo.ingest.stats import Moments
    from ckptrepo.ingest.writeahead import WriteAhead

_MAX_PENDING_CHUNKS = 1_000_000  # chunk ids of pending layouts kept for deduplication
_MAX_HINTS = 100_000  # per-name encoding hints kept across commits (a few hundred bytes each)
_FOLLOW_CACHE = 4 << 30  # bytes of parent chunks kept as delta bases for commits to followers (FOLLOW_DELTAS)
_MOVE_ATTEMPTS = 20  # transactions a commit without given parents makes to land on a moving branch
_GC_ATTEMPTS = 5  # times a commit writes and records again when a concurrent gc removed what it shared


def _now() -> datetime:
    return datetime.now(timezone.utc)


class WriterOptions(TypedDict, total=False):
    """How a process commits (``Repo.open``'s options; each defaults to its knob in ``knobs.KNOBS``:
    ``MAX_INFLIGHT``, ``STAGING_BUDGET``, ``BACKGROUND_PRIORITY``, ``IDLE_REPACK``, ``FOLLOW_DELTAS``).

    ``max_inflight`` bounds commits staged but not yet durable; ``staging_budget`` (bytes, 0:
    unbounded) their staged bytes: ``commit()`` waits when either is used up.
    ``background_priority`` (``normal`` or ``idle``) is the CPU priority of asynchronous commits'
    phase 2 (``ingest.priority``). ``idle_repack`` (with ``encode="auto"``): between
    asynchronous commits, idle-priority threads encode what they stored raw (``ingest.idle``).
    ``follow_deltas``: a publisher's commits, encoded at once as deltas against the parent commit's
    chunks, so that followers (``Repo.follow``) read only those (docs/design.md, "Following a branch").
    """

    max_inflight: int | None
    staging_budget: int | None
    background_priority: str | None
    idle_repack: bool | None
    follow_deltas: bool | None


class _BranchMoved(Exception):
    """Raised inside a commit's transaction to roll it back: the branch is at ``head`` now."""

    def __init__(self, head: str) -> None:
        super().__init__(head)
        self.head = head


@dataclass
class CommitPlan:
    """A request's parents resolved (``plan``): the branch head it expects, its parents (first
    parent first), the transfer source and mapping, the first parent's layout, the chunk ids
    likely to deduplicate (the first parent's and the transfer source's), and whether its
    tensor-level rows may be left pending (``lazy``, ``db.pending``)."""

    head: str | None
    parent_ids: list[str]
    transfer: tuple[str, dict[str, str] | None] | None
    parent: catalog.CommitLayout | None
    likely: frozenset[str]
    lazy: bool


class CommitWriter:
    """The commit engine of one open repository (see the module docstring).

    Dependencies are explicit: ``sessions`` (the database), ``backend`` (the store), ``reader``
    (delta bases), ``config`` (chunking, encoding) and ``pool`` (normal-priority workers, shared
    with the repository's reads). It owns the threads it makes: the committer thread, the
    background and idle-priority workers, the write-ahead threads and the background repack.
    Thread-safe for ``submit`` and ``commit_now`` from several threads (they serialise on the
    committer). In a process forked from the owner, every call raises ForkedProcess.
    """

    def __init__(self, sessions: sessionmaker[Session], backend: Backend, reader: ChunkReader, config: RepoConfig,
                 pool: ThreadPoolExecutor, *, defers_layouts: bool, max_inflight: int | None = None,
                 staging_budget: int | None = None, background_priority: str | None = None,
                 idle_repack: bool | None = None, follow_deltas: bool | None = None,
                 after_commit: Callable[[str], None] | None = None) -> None:
        self._sessions, self._backend, self._reader, self._config = sessions, backend, reader, config
        # Called with a commit's id once ``_persist`` recorded it (durable and visible), on the
        # thread that ran it: must return at once (``Repo``: queues the retention setting's run).
        self._after_commit = after_commit
        self._pool = pool
        self.background_priority = priority.resolve(background_priority)
        workers = knobs.workers()
        lower = functools.partial(priority.lower_this_thread, self.background_priority)
        idle = functools.partial(priority.lower_this_thread, "idle")
        # Threads only asynchronous commits use (they may be lowered for good, see ingest.priority).
        self._background_pool = pool if self.background_priority == "normal" else ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="ckpt-bg", initializer=lower)
        self._idle_pool = self._background_pool if self.background_priority == "idle" else ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="ckpt-idle", initializer=idle)
        self._ahead_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ckpt-ahead")
        # The background repack starts only after a window with spare CPU (ingest.spare).
        self._committer = Committer(initializer=lower, idle_gate=SpareCpuGate())
        self._idle = IdleRepack(sessions, backend, reader, config, self._idle_pool,
                                idle_delay=self._committer.idle_delay)
        self._idle_repack = (idle_repack if idle_repack is not None else knobs.get_bool("IDLE_REPACK")) and (
            config.compression and config.encode == "auto")
        self._max_inflight = max_inflight if max_inflight is not None else knobs.get_int("MAX_INFLIGHT")
        self._staging_budget = staging_budget if staging_budget is not None else (
            knobs.get_int("STAGING_BUDGET") or None)
        if self._max_inflight < 1:
            raise UsageError(f"max_inflight must be at least 1, not {self._max_inflight}")
        self._snapshots: Snapshots | None = None  # made by the first asynchronous commit (imports torch)
        self._defers_layouts = defers_layouts and knobs.get_bool("DEFER_LAYOUTS")
        # Commits for followers (``FOLLOW_DELTAS``): encoded at once against the parent's chunks,
        # which the cache keeps (else each base would be decoded down its chain from the store).
        wanted = follow_deltas if follow_deltas is not None else knobs.get_bool("FOLLOW_DELTAS")
        self._follow_deltas = wanted and config.compression and config.delta
        self._base_cache = BaseCache(knobs.get_int("DELTA_CACHE") or (_FOLLOW_CACHE if self._follow_deltas else 0))
        self._hints: dict[str, PlaneHint] = {}
        self._unchanged: frozenset[str] = frozenset()  # tensor names the last commit found unchanged
        # The layout of the commit recorded last, which the next one is likely to have as first parent.
        self._last_recorded: catalog.CommitLayout | None = None
        self._last_keyless = False  # that layout was left pending: it holds no keys
        self._pending_chunks: set[str] = set()  # new chunks of the layouts this process left pending

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def inherited(self) -> bool:
        """True in a process forked from the one that made this writer."""
        return self._committer.inherited

    @property
    def owner(self) -> int:
        return self._committer.owner

    def check_usable(self) -> None:
        """ForkedProcess in a process forked from the owner."""
        if self.inherited:
            raise ForkedProcess(what="repository", owner=self.owner, pid=os.getpid())

    def wait_commits(self) -> None:
        """Wait for this process's pending commits (their failures stay on their handles): a read
        that follows sees them."""
        self._committer.wait_commits()

    def settle(self) -> None:
        """Wait for pending commits and for a background repack to end (gc, repack and verify
        see the repository at rest)."""
        self._committer.drain()
        self._idle.wait()

    def close(self) -> None:
        """Wait for pending commits (their failures stay on their handles) and stop every thread.
        In a forked child only forget them: they are the parent's."""
        if self._committer.inherited:
            self._committer.close()  # forgets it: the exit of this process does not wait for it
            return
        self._committer.close()  # asks a background repack to stop
        self._idle.close()  # it still uses the pools shut down below
        if self._snapshots is not None:
            self._snapshots.clear()
        self._base_cache.clear()
        for pool in {id(p): p for p in (self._background_pool, self._idle_pool, self._ahead_pool)}.values():
            if pool is not self._pool:
                pool.shutdown(wait=True)

    # -- committing ------------------------------------------------------------------------

    def snapshots(self) -> Snapshots:
        """The staging slots of asynchronous commits (made on first use: it imports torch)."""
        if self._snapshots is None:
            from ckptrepo.ingest.snapshot import Snapshots

            self._snapshots = Snapshots(self._backend, self._config, max_inflight=self._max_inflight,
                                        staging_budget=self._staging_budget, pool=self._pool,
                                        ahead_pool=self._ahead_pool)
        return self._snapshots

    def raise_unseen_failure(self) -> None:
        """CommitFailed, once, for a background commit that failed and nobody ``wait()``-ed for."""
        failure = self._committer.take_failure()
        if failure is None:
            return
        detail = str(failure) or type(failure).__name__
        if isinstance(failure, CommitReadFailed):
            raise CommitFailed(detail=detail, hint="That commit is durable; do not redo it.") from failure
        raise CommitFailed(detail=detail) from failure

    def defers(self, *, blocking: bool) -> bool:
        """Whether a commit stores its new chunks raw, leaving their encoding to ``repack``."""
        mode = self._config.encode
        if self._follow_deltas:  # followers read what the commit stores: encoded now, not by a later repack
            return False
        return self._config.compression and (mode == "deferred" or (mode == "auto" and not blocking))

    def submit(self, tensors: Mapping[str, torch.Tensor], meta: dict[str, Any], *, blocking: bool,
               entered: float) -> CommitHandle:
        """Commit a flattened state of torch tensors (``meta``: ``CommitRequest``'s metadata
        fields; ``entered``: ``time.perf_counter()`` when the caller's ``commit()`` began).

        Asynchronous: snapshot the tensors into staging memory (phase 1, this thread), queue
        phase 2 and return its handle. ``blocking``: commit on this thread and return once
        durable; CPU tensors are read in place (the caller is blocked and cannot mutate them),
        CUDA tensors are staged first."""
        self.check_usable()
        self.raise_unseen_failure()
        cuda = any(x.is_cuda for x in tensors.values())
        if blocking and not cuda:
            staged_at = time.perf_counter()
            req = CommitRequest(tensors={name: x.detach() for name, x in tensors.items()},
                                stall_s=staged_at - entered, wait_s=0.0, staged_at=staged_at, **meta)
            return self.commit_now(req)
        defer = self.defers(blocking=blocking)
        snapshots = self.snapshots()
        raw = not blocking and (defer or not self._config.compression)
        snap = snapshots.take(dict(tensors), raw=raw, unchanged=self._unchanged, summarize=not blocking)
        staged_at = time.perf_counter()
        req = CommitRequest(tensors=snap.staged, stall_s=staged_at - entered, wait_s=snap.waited, staged_at=staged_at,
                            ahead=snap.ahead, summaries=snap.summaries, **meta)
        if blocking:  # CUDA tensors: staged first, then committed on this thread
            try:
                return self.commit_now(req)
            finally:
                snap.release()
        try:
            snapshots.start_write_ahead(snap)  # once phase 2 is queued, it closes the write-ahead in any case
            future = self._committer.submit(lambda: self._persist(req, self._background_pool, defer=defer),
                                            finally_=snap.release)
        except BaseException:
            snap.abandon()
            raise
        if defer and self._idle_repack:
            self._committer.submit_idle(self._idle.run)
        return CommitHandle(future, staged=True, on_failure_seen=self._committer.acknowledge)

    def commit_state(self, state: Any, meta: CommitMeta, *, branch: str, blocking: bool, allow_pickle: bool,
                     entered: float, files: Mapping[str, torch.Tensor] | None = None) -> CommitHandle:
        """``Repo.commit`` on this process alone: validate ``state`` and ``meta``
        (``request.prepare``), then commit it (``submit``) with ``files`` (``formats.files``: entry
        name -> bytes as uint8, which the skeleton does not name). A commit of every rank of a
        process group starts from ``collective_fields`` instead (the facade decides which)."""
        from ckptrepo import state as st

        self.check_usable()
        self.raise_unseen_failure()
        flat = st.flatten(state, allow_pickle=allow_pickle)
        tensors = {**flat.tensors, **files} if files else flat.tensors
        fields = request.prepare(self._sessions, branch=branch, names=tensors.keys(), **meta)
        return self.submit(tensors, {"skeleton": flat.skeleton, **fields}, blocking=blocking, entered=entered)

    def collective_fields(self, meta: CommitMeta, *, branch: str) -> dict[str, Any]:
        """``meta`` validated (``request.prepare``) for a commit of every rank of a process group
        (``distributed.native.commit``), once this engine is usable and has no unseen failure."""
        self.check_usable()
        self.raise_unseen_failure()
        return request.prepare(self._sessions, branch=branch, names=(), **meta)

    def commit_sources(self, skeleton: Any, sources: Sequence[Source | LazySource], meta: CommitMeta, *,
                       branch: str, entered: float, defer: bool | None = None) -> t.Commit:
        """A blocking commit of ``sources`` (a file's tensors as bytes, or computed tensors as
        ``LazySource`` s, made one at a time: ``ingest``) with ``skeleton``. ``defer``: store new
        chunks raw for ``repack`` to encode (default: as blocking commits do, ``defers``)."""
        self.check_usable()
        self.raise_unseen_failure()
        fields = request.prepare(self._sessions, branch=branch, names=[s.name for s in sources], **meta)
        staged_at = time.perf_counter()
        req = CommitRequest(skeleton=skeleton, sources=sources, stall_s=staged_at - entered, wait_s=0.0,
                            staged_at=staged_at, **fields)
        return self.commit_now(req, defer=defer).wait()

    def commit_now(self, req: CommitRequest, *, defer: bool | None = None) -> CommitHandle:
        """Commit ``req`` on this thread (a blocking commit), in call order after the pending
        background commits, on the normal-priority pool; returns a finished handle or raises.
        ``defer``: as ``commit_sources``."""
        self.check_usable()
        self._committer.drain()
        done: Future[t.Commit] = Future()
        defer = self.defers(blocking=True) if defer is None else defer and self._config.compression
        done.set_result(self._persist(req, self._pool, defer=defer))
        return CommitHandle(done, staged=True)

    @property
    def chunk_size(self) -> int:
        """The repository's chunk size (its chunk grid's step before rounding to whole elements)."""
        return self._config.chunk_size

    @property
    def pool(self) -> ThreadPoolExecutor:
        """The normal-priority workers (hashing, encoding, decoding) this writer shares with its repository."""
        return self._pool

    def submit_job(self, job: Callable[[], t.Commit]) -> CommitHandle:
        """Queue ``job`` (a distributed commit's phase 2) on the committer thread, in call order
        with the other commits; its failure is reported as theirs are."""
        self.check_usable()
        future = self._committer.submit(job)
        return CommitHandle(future, staged=True, on_failure_seen=self._committer.acknowledge)

    def read_commit(self, commit_id: str) -> t.Commit:
        """The stored commit with this full id (a distributed commit another rank recorded)."""
        with self._sessions() as s:
            found = views.commits_by_id(s, [commit_id])
        if not found:
            raise CommitReadFailed(commit=short(commit_id), detail="it is not in the catalog")
        return found[0]

    def lease(self, purpose: str) -> leases.Lease:
        """A lease (``ledger.leases``, not taken yet) for a writer of this repository's store:
        taken before its first pack or staging file, released once a transaction names them or failed."""
        return leases.Lease(self._backend, purpose)

    def release_leases(self, keys: Collection[str]) -> None:
        """Delete the leases ``keys`` (other ranks' of a distributed commit, once it is recorded)."""
        leases.release(self._backend, keys)

    def repack_later(self) -> None:
        """Queue the background repack of what a commit stored raw (after a deferred commit
        made outside ``submit``: a distributed one)."""
        if self._idle_repack:
            self._committer.submit_idle(self._idle.run)

    def reserve(self, tensors: dict[str, torch.Tensor]) -> int:
        """Prepare the staging memory for states laid out like ``tensors`` (``Repo.reserve``)."""
        self.check_usable()
        return self.snapshots().reserve(tensors)

    def _persist(self, req: CommitRequest, pool: ThreadPoolExecutor, *, defer: bool) -> t.Commit:
        """Phase 2 of one commit: ``plan``, ``write_packs``, ``record``. On any failure nothing of
        it is visible. The request's write-ahead is closed before this returns. When a gc of
        another process removed chunks or tensors the commit deduplicated against (its
        transaction fails on their foreign keys), it plans, writes and records again, from the
        state still staged (``_GC_ATTEMPTS`` in all; then ConcurrentChange).

        The commit's lease (``ledger.leases``; its write-ahead's, which that took before its first
        file, if it has one) is held from before its first pack until its transaction has
        committed or failed: until then no row names its packs and manifest, and ``gc`` of
        another process keeps them only because of it."""
        lease = req.ahead.lease if req.ahead is not None else self.lease("commit")
        taking = pool.submit(lease.take)  # its fsynced put overlaps plan's reads
        try:
            plan = self.plan(req, defer=defer)
            sources = req.sources if req.sources is not None else from_tensors(req.tensors)
            taking.result()  # durable before write_packs' first staging file
            ahead = req.ahead
            for attempt in range(1, _GC_ATTEMPTS + 1):
                try:
                    result = self.write_packs(sources, plan, pool, defer=defer, ahead=ahead, summaries=req.summaries)
                except OSError as exc:  # a full disk, a store gone read-only: nothing was recorded
                    raise storage_failure(exc) from exc
                try:
                    commit = self.record(result, plan, req)
                    break
                except ConcurrentChange:
                    if attempt == _GC_ATTEMPTS:
                        raise
                # A gc of another process removed chunks or tensors this commit deduplicated against
                # (retention pruned the commits that used them): nothing of it is visible. The state
                # is still staged: plan and write again, storing what the store lacks now.
                self._forget_stored()
                plan = self.plan(req, defer=defer)
                ahead = None  # its file is written: the chunks go through packs like any others
        finally:
            if req.ahead is not None:
                req.ahead.close()
            taking.exception()  # a put still under way would otherwise outlive the release
            # After the transaction (or its failure): rows name the objects now, or nothing will.
            lease.release()
        if self._after_commit is not None:
            try:
                self._after_commit(commit.id)
            except Exception as exc:  # the commit is durable: what follows it never fails it
                warnings.warn(f"after commit {short(commit.id)}: {exc}", RuntimeWarning, stacklevel=1)
        return commit

    # -- the three steps -------------------------------------------------------------------

    def plan(self, req: CommitRequest, *, defer: bool, shared: bool = False) -> CommitPlan:
        """Resolve ``req``'s parents and read the first parent's layout. UsageError when the
        branch head is not among given parents; UnknownRevision for a revision gone since.
        ``shared``: a commit whose packs other processes write (a distributed commit): its
        rows are recorded at once, never left pending."""
        with self._sessions() as s:
            head = refs.branch_head(s, req.branch)
            parent_ids = [revparse.resolve(s, p) for p in req.parents] if req.parents else []
            if req.parents is None and head is not None:
                parent_ids = [head]
            if head is not None and head not in parent_ids:
                raise UsageError(
                    f"branch {req.branch!r} is at {short(head)}, which is not among the given parents",
                    hint="Commit on another branch, or include the branch head as a parent.",
                )
            transfer = (revparse.resolve(s, req.transfer[0]), req.transfer[1]) if req.transfer else None
        # The first parent's layout (``record_commit`` derives rows from it): not read again when
        # this process recorded that commit last, as a training loop's commits do. Such a commit,
        # asynchronous and with at most that parent, may leave its own layout pending
        # (``db.pending``); any other reads layouts from the catalog, pending ones indexed first.
        last, parent = self._last_recorded, None
        follows = not parent_ids or (last is not None and last.commit_id == parent_ids[0])
        lazy = not shared and defer and self._defers_layouts and transfer is None and len(parent_ids) <= 1 and follows
        if not lazy:
            self._index_layouts()
            last = self._last_recorded
        with self._sessions() as s:
            if parent_ids:
                reuse = last is not None and last.commit_id == parent_ids[0]
                parent = last if reuse else catalog.commit_layout(s, parent_ids[0])
            # The chunks that will likely deduplicate: those of the first parent and transfer source.
            lists = [parent.chunk_lists] if parent is not None else []
            if transfer is not None:
                lists.append(catalog.chunk_lists_of(s, [transfer[0]]))
        likely = frozenset(cid for by_tensor in lists for ids in by_tensor.values() for cid in ids)
        return CommitPlan(head, parent_ids, transfer, parent, likely, lazy)

    def write_packs(self, sources: Sequence[Source | LazySource], plan: CommitPlan, pool: ThreadPoolExecutor, *,
                    defer: bool, ahead: WriteAhead | None = None,
                    summaries: list[Moments | None] | None = None) -> IngestResult:
        """Step 1: store every chunk of ``sources`` the store lacks in packs, durable in the store
        when this returns (``ingest``); nothing in the database names them yet. ``defer``: new
        chunks are written raw into packs marked deferred, for ``repack`` to encode. ``ahead``
        and ``summaries``: a snapshot's write-ahead and the statistics its copy took. The caller
        has taken a lease (``lease``) and releases it once the transaction naming these packs
        has committed or failed."""
        cfg = self._config
        bases: Future[DeltaPlan] | None = None
        if cfg.compression and cfg.delta and not defer:
            names = [src.name for src in sources]
            first = plan.parent_ids[0] if plan.parent_ids else None

            def plan_bases() -> DeltaPlan:
                with self._sessions() as s:
                    return delta_plan(s, names, first, plan.transfer, reader=self._reader, cache=self._base_cache,
                                      max_depth=cfg.max_delta_depth,
                                      policy="parent" if self._follow_deltas else cfg.delta_base,
                                      restore=self._follow_deltas)

            bases = pool.submit(plan_bases)  # queued before the hashing jobs: read while they run
        opts = IngestOptions(chunk_size=cfg.chunk_size, compression=cfg.compression and not defer,
                             zstd_level=cfg.zstd_level)
        if len(self._hints) > _MAX_HINTS:
            self._hints.clear()
        # Computed tensors (a weight merge's lazy sources) stored raw are read back soon by the
        # repack that encodes them: their packs go through the page cache, not around it.
        direct = not (defer and any(isinstance(src, LazySource) for src in sources))
        result = ingest(sources, PackSink(self._backend, cfg.pack_target, direct=direct), self._known, pool, opts,
                        plan.likely, bases, self._hints, ahead=ahead, summaries=summaries)
        result.deferred = defer
        new = result.new_chunk_ids
        self._unchanged = frozenset(r.name for r in result.tensors
                                    if r.row.chunk_ids and new.isdisjoint(r.row.chunk_ids))
        return result

    def record(self, result: IngestResult, plan: CommitPlan, req: CommitRequest) -> t.Commit:
        """Step 2: one transaction makes the commit visible and moves its branch by
        compare-and-swap. A commit whose parents the caller did not give lands on the branch
        head as of its transaction: when another writer moved the branch meanwhile, the
        transaction is rolled back and made again on top of the new head (bounded; the chunks
        stay as written). With parents given, RefConflict when the branch moved (the commit is
        then kept on a ``conflicts/`` branch). ConcurrentChange when a gc of another process
        removed a chunk or tensor it shares; CommitReadFailed when it is durable but could not
        be read."""
        new = result.new_chunk_ids
        parent, lazy = plan.parent, plan.lazy
        if lazy and not all(x in new or x in plan.likely for r in result.tensors for x in r.row.chunk_ids):
            # It shares chunks the store had beyond its parent's: recorded with its rows now, so
            # that their foreign keys hold them against a gc of another process.
            lazy, keyless = False, self._last_keyless
            self._index_layouts()
            if parent is not None and keyless:  # read back with the keys its indexing gave it
                with self._sessions() as s:
                    parent = catalog.commit_layout(s, parent.commit_id)
        entries = {r.name: r.row.tensor_id for r in result.tensors}
        pinned = req.parents is not None
        for attempt in range(1, _MOVE_ATTEMPTS + 1):
            keep = pinned or attempt == _MOVE_ATTEMPTS  # else a moved branch rolls it back to try again
            edges = [catalog.EdgeRow(pid, "parent" if i == 0 else "merge", i) for i, pid in enumerate(plan.parent_ids)]
            transfer = plan.transfer
            if transfer is not None and transfer[0] not in plan.parent_ids:
                # A declared mapping is recorded as given; without one, which tensors are byte-identical.
                mapping = transfer[1] if transfer[1] is not None else self._identical_tensors(entries, transfer[0])
                edges.append(catalog.EdgeRow(transfer[0], "transfer", len(edges), mapping))
            row = commit_row(result, entries, edges, req)
            row["persist_s"] = time.perf_counter() - req.staged_at
            # Write-ordering step 2: the commit's manifest (with its branch move: the ref journal's
            # entry of it), durable in the store before the transaction; taken back if that fails.
            try:
                manifest.write(self._backend, commit_manifest(row, edges, result, entries, req, plan.head))
            except OSError as exc:
                raise storage_failure(exc) from exc
            now = _now()
            # Step 3: one transaction inserts the chunk index, tensors, the commit, its edges and
            # moves the branch (or, lazy, the commit, its edges and its layout as one pending row,
            # which names only packs made durable above); nothing of it is visible before.
            try:
                try:
                    faults.point("commit.after_manifest")
                    with write_transaction(self._sessions) as s:
                        conflict, kept, layout = self._insert(s, result, row, edges, entries, req, plan.head, now,
                                                              parent, lazy=lazy, keep=keep)
                except BaseException:
                    manifest.discard(self._backend, [row["id"]])  # rolled back: nothing names it
                    raise
            except _BranchMoved as moved:  # again on top of where the branch is now
                plan = self._on_top_of(moved.head, plan)
                parent, lazy = plan.parent, False
                continue
            except DbIntegrityError as exc:
                # A foreign key names a row that is gone: a gc in another process removed chunks or
                # tensors this commit deduplicated against after it looked them up.
                raise ConcurrentChange(what="commit", other="gc", detail=str(exc.orig).splitlines()[0]) from exc
            except DbOperationalError as exc:
                if "full" in str(exc.orig).lower():  # SQLite's "database or disk is full": rolled back
                    raise StoreFull(detail=f"the database: {str(exc.orig).splitlines()[0]}") from exc
                raise
            break
        self._last_recorded, self._last_keyless = layout, lazy
        if lazy:
            if len(self._pending_chunks) > _MAX_PENDING_CHUNKS:
                self._pending_chunks.clear()  # only costs deduplication against the oldest
            self._pending_chunks.update(new)
        try:
            faults.point("db.after_commit")
            # Built from what was inserted (a read-back took four queries): equal to get_commit's.
            commit = views.recorded_commit(row, [(e.parent_id, e.kind, e.mapping) for e in edges], req.metrics,
                                           [kept if conflict is not None else req.branch])
        except Exception as exc:
            raise CommitReadFailed(commit=short(row["id"]), detail=str(exc)) from exc
        if conflict is not None:
            raise RefConflict(branch=req.branch, actual=short(conflict) if conflict else "(deleted)",
                              expected=short(plan.head) if plan.head else "(no branch)",
                              hint=f"The commit is kept on branch {kept!r}; merge it or commit again on top "
                                   f"of {req.branch}.")
        return commit

    def _on_top_of(self, head: str, plan: CommitPlan) -> CommitPlan:
        """``plan`` of a commit whose parent was not given, now on top of ``head`` (``""``: the
        branch was deleted, so the commit creates it again, keeping its parent), with the new
        first parent's layout read with its keys (its rows are recorded at once, not pending)."""
        moved = replace(plan, head=head or None, parent_ids=[head] if head else plan.parent_ids, lazy=False)
        self._index_layouts()
        with self._sessions() as s:
            layout = catalog.commit_layout(s, moved.parent_ids[0]) if moved.parent_ids else None
        return replace(moved, parent=layout)

    def _insert(self, s: Session, result: IngestResult, row: dict[str, Any], edges: list[catalog.EdgeRow],
                entries: dict[str, str], req: CommitRequest, head: str | None, now: datetime,
                parent: catalog.CommitLayout | None, *, lazy: bool,
                keep: bool) -> tuple[str | None, str, catalog.CommitLayout]:
        """Insert one commit's rows and move its branch, inside the caller's transaction. ``lazy``:
        the tensor-level rows are left pending (``db.pending``); the layout returned then holds
        no keys. Returns ``(conflict, kept, layout)``: the branch head found instead of ``head``
        (None when the branch moved as expected), the ``conflicts/`` branch that then keeps the
        commit (``keep``; else _BranchMoved rolls the transaction back), and the commit's layout
        (``catalog.record_commit``)."""
        kept = ""
        packs = [catalog.PackRow(p.pack_id, p.size, len(p.locations), result.deferred) for p in result.packs]
        alone = result.alone_lengths
        chunks = [loc._replace(alone_length=alone.get(loc.chunk_id)) for p in result.packs for loc in p.locations]
        tensors = [r.row for r in result.tensors]
        if lazy:
            catalog.record_head(s, packs=packs, commit=row, edges=edges, metrics=req.metrics, now=now)
            pending.defer_layout(s, row["id"], chunks, tensors, entries)
            layout = catalog.CommitLayout(row["id"], dict(entries), {t.tensor_id: t.chunk_ids for t in tensors}, {}, {})
        else:
            layout = catalog.record_commit(s, packs=packs, chunks=chunks, tensors=tensors, commit=row, entries=entries,
                                           edges=edges, metrics=req.metrics, now=now, parent=parent)
        if result.restored:  # bases stored again standalone: their rows move to the new copies
            catalog.relocate_chunks(s, [loc for loc in chunks if loc.chunk_id in result.restored], now)
        conflict = refs.move_branch(s, req.branch, row["id"], head, now)
        if conflict is not None and not keep:
            raise _BranchMoved(conflict)
        if conflict is not None:
            # The branch moved under us: keep the commit reachable under its own branch rather
            # than lose it, and tell the caller.
            kept = f"conflicts/{req.branch}/{short(row['id'])}"
            refs.move_branch(s, kept, row["id"], None, now)
        faults.point("db.before_commit")
        return conflict, kept, layout

    # -- helpers ---------------------------------------------------------------------------

    def _known(self, ids: list[str]) -> set[str]:
        """Which of ``ids`` the store has: in the chunk index, or among the new chunks of this
        process's pending layouts (a commit sharing those records its rows at once: ``record``)."""
        with self._sessions() as s:
            have = catalog.existing_chunks(s, ids)
        return have | self._pending_chunks.intersection(ids) if self._pending_chunks else have

    def _forget_stored(self) -> None:
        """Forget what this process believes the store has (its pending layouts' chunks, the layout
        it recorded last, cached delta bases): a gc of another process may have removed it."""
        self._index_layouts()
        self._pending_chunks.clear()
        self._last_recorded, self._last_keyless = None, False
        self._base_cache.clear()

    def _index_layouts(self) -> None:
        """Index the pending layouts (before a commit that reads layouts or records its rows); a
        layout kept from a commit that left its own pending (no keys) is dropped, to be read back
        with its keys."""
        if not self._defers_layouts:
            return
        pending.index_pending(self._sessions)
        self._pending_chunks.clear()
        if self._last_keyless:
            self._last_recorded, self._last_keyless = None, False

    def _identical_tensors(self, entries: dict[str, str], source: str) -> dict[str, str]:
        """{name here: name in ``source``} for this commit's tensors byte-identical to one of the source's."""
        with self._sessions() as s:
            by_id: dict[str, str] = {}
            for entry, tensor in catalog.tensor_layout(s, source):
                by_id.setdefault(tensor.id, entry.name)
        return {name: by_id[tid] for name, tid in entries.items() if tid in by_id}


def commit_row(result: IngestResult, entries: dict[str, str], edges: Collection[catalog.EdgeRow],
               req: CommitRequest) -> dict[str, Any]:
    """The ``commits`` row of a commit: its id hashes its content (entries, skeleton, edges) and
    metadata (message, step, epoch, metrics, config, time, author, host)."""
    author = request.author()
    host = socket.gethostname()
    cid = manifest.commit_id(entries=entries, skeleton=req.skeleton, edges=_edge_lists(edges), message=req.message,
                             step=req.step, epoch=req.epoch, metrics=req.metrics, config=req.config,
                             created_at=req.created_at.isoformat(), author=author, host=host)
    return {
        "id": cid, "message": req.message, "created_at": req.created_at, "author": author,
        "host": host, "branch": req.branch, "step": req.step, "epoch": req.epoch, "config": req.config,
        "code_version": req.code_version, "skeleton": req.skeleton, "n_tensors": len(entries),
        "logical_bytes": result.logical_bytes, "new_bytes": result.new_bytes,
        "stored_bytes": result.stored_bytes, "stall_s": req.stall_s, "wait_s": req.wait_s, "persist_s": 0.0,
        "nonfinite": result.nonfinite,
    }


def _edge_lists(edges: Collection[catalog.EdgeRow]) -> list[list[Any]]:
    return [[e.parent_id, e.kind, e.position, e.mapping] for e in edges]


def commit_manifest(row: dict[str, Any], edges: Collection[catalog.EdgeRow], result: IngestResult,
                    entries: dict[str, str], req: CommitRequest, expected: str | None) -> dict[str, Any]:
    """The manifest (``ledger.manifest``) of the commit whose row is ``row``."""
    tensors = {r.row.tensor_id: r.row for r in result.tensors}
    return manifest.build(row, _edge_lists(edges), req.metrics, entries, tensors.values(), branch=req.branch,
                          expected=expected, at=time.time())
