"""The ``Repo`` facade: the one place that orders chunk writes before database commits.

A repository is a ``.ckpt`` folder holding ``config.json``, by default the SQLite
database ``db.sqlite`` and the local pack store ``store/``. Every public method opens
its own short session; a ``Repo`` may be shared between threads. Commits from one
process are serialised by a lock; commits from several processes serialise on the
database's write lock and on the branch compare-and-swap.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError as DbIntegrityError
from sqlalchemy.orm import Session, sessionmaker

from ckptrepo import faults
from ckptrepo import gc as collector
from ckptrepo import state as st
from ckptrepo import types as t
from ckptrepo.chunks.codecs import PlaneHint
from ckptrepo.chunks.store import ChunkLocation, ChunkReader, PackSink
from ckptrepo.config import REPO_DIRNAME, RepoConfig, default_workers, env_int
from ckptrepo.db import catalog, migrate, pending, views
from ckptrepo.db.engine import database_url, make_engine, session_factory, write_transaction
from ckptrepo.db.models import Commit as CommitRow
from ckptrepo.db.models import Ref
from ckptrepo.errors import (
    CommitFailed,
    CommitReadFailed,
    ConcurrentChange,
    ForkedProcess,
    NotARepository,
    RefConflict,
    RefExists,
    RepositoryExists,
    UnknownRef,
    UnknownRevision,
    UnknownTensor,
    UnreachableCommits,
    UsageError,
)
from ckptrepo.export import export as export_state
from ckptrepo.ids import hash_json, short
from ckptrepo.ingest import priority, request, spare
from ckptrepo.ingest.basecache import DEFAULT_BUDGET, BaseCache
from ckptrepo.ingest.bases import delta_plan
from ckptrepo.ingest.committer import Committer, wait_for_spare
from ckptrepo.ingest.handle import CommitHandle
from ckptrepo.ingest.pipeline import DeltaPlan, IngestOptions, IngestResult, ingest
from ckptrepo.ingest.request import CommitRequest, check_int, check_json, check_metrics, transfer_spec
from ckptrepo.ingest.spare import SpareCpuGate
from ckptrepo.ingest.staging import Slot, StagingPool
from ckptrepo.ingest.writeahead import WriteAhead
from ckptrepo.lineage import analysis, queries, revparse
from ckptrepo.lineage.graph import EDGE_KINDS
from ckptrepo.lineage.reports import Diff, HistoryPoint
from ckptrepo.restore import location, read_tensors

if TYPE_CHECKING:
    from ckptrepo.repack import RepackReport
from ckptrepo.storage import Backend, open_backend

DEFAULT_BRANCH = "main"
log = logging.getLogger("ckptrepo")
_MAX_PENDING_CHUNKS = 1_000_000  # chunk ids of pending layouts kept for deduplication
_IDLE_INDEX_BATCH = 4  # pending layouts per transaction of the idle repack
_READ_ATTEMPTS = 20  # snapshots a reader tries for one without pending layouts (``_reading``)
_MAX_HINTS = 100_000  # per-name encoding hints kept across commits (a few hundred bytes each)
# Deferred packs one background repack run plans at a time (oldest first; ~64 MiB each): its
# planning reads every chunk of the packs it takes, and must not grow with the backlog.
_IDLE_REPACK_PACKS = 8
_POLL_S = 0.05


def _repo_dir(path: str | Path) -> Path:
    p = Path(path).expanduser().resolve()
    return p if p.name == REPO_DIRNAME else p / REPO_DIRNAME


def _now() -> datetime:
    return datetime.now(timezone.utc)


class Repo:
    """A checkpoint repository. Use ``Repo.init`` / ``Repo.open`` / ``Repo.discover``.

    ``close()`` (or leaving a ``with`` block) waits for pending commits and releases
    the database engine, the store and the worker threads.
    """

    def __init__(
        self,
        repo_dir: Path,
        config: RepoConfig,
        *,
        check_schema: bool = True,
        max_inflight: int | None = None,
        staging_budget: int | None = None,
        background_priority: str | None = None,
        idle_repack: bool | None = None,
    ) -> None:
        self.repo_dir = repo_dir
        self.background_priority = priority.resolve(background_priority)
        self.config = config
        self._engine = make_engine(database_url(config.db_url, repo_dir))
        if check_schema:
            try:
                migrate.check_schema(self._engine)
            except BaseException:
                self._engine.dispose()
                raise
        self._sessions: sessionmaker[Session] = session_factory(self._engine)
        self._backend: Backend = open_backend(config.store_url, repo_dir / "store")
        self._reader = ChunkReader(self._backend, self._locate_chunks)
        self._base_cache = BaseCache(env_int("DELTA_CACHE", DEFAULT_BUDGET))
        # What encoding learnt per tensor name (planes that pay, deltas that win), reused by
        # later commits of this process; only encoding choices, never content.
        self._plane_hints: dict[str, PlaneHint] = {}
        self._pool = ThreadPoolExecutor(max_workers=default_workers(), thread_name_prefix="ckpt")
        lower = functools.partial(priority.lower_this_thread, self.background_priority)
        idle = functools.partial(priority.lower_this_thread, "idle")
        # Threads only asynchronous commits use (they may be lowered for good, see ingest.priority).
        self._background_pool = (
            self._pool if self.background_priority == "normal"
            else ThreadPoolExecutor(max_workers=default_workers(), thread_name_prefix="ckpt-bg", initializer=lower)
        )
        # The repack between commits runs at idle priority whatever the commits' priority: its
        # loop on a thread of its own (the committer thread waits for it), its encoding on these.
        self._idle_pool = (
            self._background_pool if self.background_priority == "idle"
            else ThreadPoolExecutor(max_workers=default_workers(), thread_name_prefix="ckpt-idle", initializer=idle)
        )
        self._repack_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-repack", initializer=idle)
        self._repack_running: Future[None] | None = None
        self._staging = StagingPool(
            max_inflight if max_inflight is not None else env_int("MAX_INFLIGHT", 1),
            staging_budget if staging_budget is not None else (env_int("STAGING_BUDGET", 0) or None),
        )
        # The background repack starts only after a window with spare CPU (ingest.spare).
        self._committer = Committer(initializer=lower, idle_gate=SpareCpuGate())
        # Raw chunks of asynchronous commits are written ahead of phase 2 at normal priority
        # (ingest.writeahead); the thread is started by commit(), on the caller's priority.
        self._write_ahead = bool(env_int("WRITE_AHEAD", 1))
        # The staging copy takes the chunks' statistics in its pass over memory (Slot.copy_summarized).
        self._copy_stats = bool(env_int("COPY_STATS", 1))
        self._ahead_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ckpt-ahead")
        self._unchanged: frozenset[str] = frozenset()  # tensor names the last commit found unchanged
        # The layout of the commit recorded last, which the next one is likely to have as first parent.
        self._last_recorded: catalog.CommitLayout | None = None
        self._last_keyless = False  # that layout was left pending: it holds no keys
        self._pending_chunks: set[str] = set()  # new chunks of the layouts this process left pending
        # Asynchronous commits on SQLite leave their tensor-level rows pending (db.pending).
        self._defers_layouts = self._engine.dialect.name == "sqlite" and bool(env_int("DEFER_LAYOUTS", 1))
        self._idle_repack = (idle_repack if idle_repack is not None else bool(env_int("IDLE_REPACK", 1))) and (
            config.compression and config.encode == "auto")
        self._closed = False

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def init(
        cls,
        path: str | Path = ".",
        *,
        db_url: str | None = None,
        store_url: str | None = None,
        chunk_size: int | None = None,
        compression: bool = True,
        delta: bool = True,
        max_delta_depth: int | None = None,
        delta_base: str = "root",
        pack_target: int | None = None,
        max_inflight: int | None = None,
        staging_budget: int | None = None,
        background_priority: str | None = None,
        encode: str = "auto",
        idle_repack: bool | None = None,
    ) -> Repo:
        """Create a repository in ``PATH/.ckpt`` (or at ``path`` if it is named ``.ckpt``).

        ``compression=False`` stores chunks raw (fastest, largest); ``delta=False`` keeps
        standalone compression but stores no chunk as a delta against its parent's;
        ``max_delta_depth`` (default 8) bounds how many commits share one keyframe chunk
        (``delta_base="root"``, the default: reads decode at most two chunks) or the chain
        a read walks (``delta_base="parent"``). ``encode`` (``auto``, ``inline``, ``deferred``)
        says when new chunks are encoded: see ``RepoConfig`` and ``repack``.

        Nothing is changed if one exists already (RepositoryExists). ``config.json`` is
        written last, so a failed init leaves no folder that looks like a repository.
        """
        repo_dir = _repo_dir(path)
        if (repo_dir / "config.json").exists():
            raise RepositoryExists(path=str(repo_dir))
        config = RepoConfig(db_url=db_url, store_url=store_url, compression=compression, delta=delta,
                            delta_base=delta_base, encode=encode)
        if max_delta_depth is not None:
            config.max_delta_depth = max_delta_depth
        if chunk_size is not None:
            config.chunk_size = chunk_size
        if pack_target is not None:
            config.pack_target = pack_target
        config.validate()
        # The store first: an unusable one (bad URL, missing bucket) leaves folder and database untouched.
        open_backend(store_url, repo_dir / "store").close()
        created = not repo_dir.exists()
        repo_dir.mkdir(parents=True, exist_ok=True)
        try:
            engine = make_engine(database_url(db_url, repo_dir))
            try:
                migrate.initialize(engine, {"repo_id": config.repo_id, "format_version": str(config.format_version)})
            finally:
                engine.dispose()
            config.save(repo_dir)
        except BaseException:
            if created:
                shutil.rmtree(repo_dir, ignore_errors=True)
            raise
        return cls(repo_dir, config, max_inflight=max_inflight, staging_budget=staging_budget,
                   background_priority=background_priority, idle_repack=idle_repack)

    @classmethod
    def open(
        cls, path: str | Path = ".", *, max_inflight: int | None = None, staging_budget: int | None = None,
        background_priority: str | None = None, idle_repack: bool | None = None,
    ) -> Repo:
        """Open the repository at ``path`` (the folder holding ``.ckpt``, or ``.ckpt`` itself).

        ``max_inflight`` (default 1, env ``CKPT_MAX_INFLIGHT``) bounds commits staged but not
        yet durable; ``staging_budget`` (bytes, default unbounded, env ``CKPT_STAGING_BUDGET``)
        bounds their staged bytes. ``commit()`` waits when either is used up.
        ``background_priority`` (``normal``, the default, or ``idle``; env
        ``CKPT_BACKGROUND_PRIORITY``) is the CPU priority of asynchronous commits' phase 2
        (see ``ckptrepo.ingest.priority``). ``idle_repack`` (default on, env
        ``CKPT_IDLE_REPACK``; only with ``encode="auto"``): between asynchronous commits,
        idle-priority threads repack what commits stored raw, giving way to the next commit.
        """
        repo_dir = find_repo(path, search_parents=False)
        return cls(repo_dir, RepoConfig.load(repo_dir), max_inflight=max_inflight, staging_budget=staging_budget,
                   background_priority=background_priority, idle_repack=idle_repack)

    @classmethod
    def discover(
        cls, start: str | Path = ".", *, max_inflight: int | None = None, staging_budget: int | None = None,
        background_priority: str | None = None, idle_repack: bool | None = None,
    ) -> Repo:
        """Open the nearest repository at or above ``start``, like git."""
        repo_dir = find_repo(start, search_parents=True)
        return cls(repo_dir, RepoConfig.load(repo_dir), max_inflight=max_inflight, staging_budget=staging_budget,
                   background_priority=background_priority, idle_repack=idle_repack)

    def __enter__(self) -> Repo:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Wait for pending commits (their failures stay on their handles) and release
        resources; further calls fail. In a process forked from the one that opened the
        repository, only mark it closed: the pending commits, threads and connections are
        the parent's, and closing them here would wait forever or break them there."""
        if self._closed:
            return
        self._closed = True
        if self._committer.inherited:  # a forked child: see _check_open
            self._committer.close()  # forgets it: the exit of this process does not wait for it
            self._engine.dispose(close=False)  # the connections stay the parent's, unclosed
            return
        self._committer.close()  # asks a background repack to stop
        self._wait_for_repack()  # it still uses the pools and backend shut down below
        self._staging.clear()
        self._base_cache.clear()
        self._pool.shutdown(wait=True)
        self._background_pool.shutdown(wait=True)
        self._idle_pool.shutdown(wait=True)
        self._repack_thread.shutdown(wait=True)
        self._ahead_pool.shutdown(wait=True)
        self._backend.close()
        self._engine.dispose()

    def __repr__(self) -> str:
        return f"Repo({str(self.repo_dir)!r})"

    # -- committing ------------------------------------------------------------------------

    def reserve(self, state: Any, *, allow_pickle: bool = False) -> int:
        """Prepare the staging memory for asynchronous commits of states laid out like
        ``state`` (the same names, dtypes and shapes): allocate every idle staging slot's arena
        and write its pages once, now rather than inside the first ``commit()``.

        The first copy into new memory runs at the speed of the kernel's page faults (~0.3 s
        per GiB on the benchmark machine, seconds per GiB on a virtual machine whose host
        maps pages on first touch), all of it inside the first commit's stall. Called before
        the loop's first commit, once the state has its final layout (after the first
        optimizer step: AdamW's moments exist from then on), that cost is paid there.
        Reads no tensor data and stores nothing; the memory stays allocated (as after a
        commit) until ``close()``. Validates ``state`` as ``commit()`` does
        (UnsupportedState; UsageError when it needs more than ``staging_budget``). Returns
        the staging bytes the state takes per slot.
        """
        self._check_open()
        flat = st.flatten(state, allow_pickle=allow_pickle)
        return self._staging.reserve(flat.tensors)

    def commit(
        self,
        state: Any,
        *,
        branch: str | None = None,
        message: str | None = None,
        step: int | None = None,
        epoch: int | None = None,
        metrics: Mapping[str, float] | None = None,
        config: Any = None,
        parents: list[str] | None = None,
        transfer_from: Any = None,
        allow_pickle: bool = False,
        code_version: str | None = None,
        blocking: bool = False,
    ) -> CommitHandle:
        """Store ``state`` as a new commit on ``branch`` (default ``main``); two-phase.

        Phase 1, on the caller's thread: validate the whole state (UnsupportedState names
        the offending key path; nothing is written) and copy every tensor into a reused
        staging slot, waiting for a free slot when ``max_inflight`` commits are in flight (into
        a slot used before, the copy of float tensors also takes their chunks' statistics).
        When this returns the caller may mutate the state again (a failed copy is raised
        here; nothing is stored). Phase 2, in the background once the copy has ended, in
        call order: resolve parents
        (default: the branch head as of then; two or more make a merge), hash, deduplicate,
        encode, write durable packs, then one transaction makes the commit visible and
        moves the branch by compare-and-swap
        (RefConflict if another writer moved it; the commit is kept under its id).

        ``handle.wait()`` returns the durable commit or re-raises its failure; a failed
        background commit that nobody ``wait()``-ed for makes the next ``commit()`` raise
        CommitFailed once.
        ``blocking=True`` returns only when the commit is durable, and skips the snapshot
        copy of CPU tensors (the caller cannot mutate them while it waits).

        Encoding (repository setting ``encode``): ``auto`` stores an asynchronous commit's
        new chunks raw (durable after hashing and writing; ``repack`` encodes them, in the
        background between commits by default) and encodes a blocking commit's inline;
        ``inline`` always encodes while committing; ``deferred`` never does.
        """
        entered = time.perf_counter()
        self._check_open()
        failure = self._committer.take_failure()
        if failure is not None:
            detail = str(failure) or type(failure).__name__
            if isinstance(failure, CommitReadFailed):
                raise CommitFailed(detail=detail, hint="That commit is durable; do not redo it.") from failure
            raise CommitFailed(detail=detail) from failure
        branch = branch or DEFAULT_BRANCH
        revparse.check_ref_name(branch, "branch")
        metrics_f = check_metrics(metrics)
        step = check_int("step", step)
        epoch = check_int("epoch", epoch)
        check_json("config", config)
        transfer = transfer_spec(transfer_from)
        with self._sessions() as s:  # unknown revisions fail here, before anything is staged
            for rev in [*(parents or []), *([transfer[0]] if transfer else [])]:
                revparse.resolve(s, rev)
        flat = st.flatten(state, allow_pickle=allow_pickle)
        metadata = dict(
            skeleton=flat.skeleton, branch=branch, parents=list(parents) if parents else None,
            transfer=transfer, message=message or "", step=step, epoch=epoch, metrics=metrics_f, config=config,
            code_version=code_version, created_at=_now(),
        )
        if blocking and not any(x.is_cuda for x in flat.tensors.values()):
            # The caller is blocked until durable and cannot mutate its tensors: no snapshot copy.
            staged = {name: x.detach() for name, x in flat.tensors.items()}
            staged_at = time.perf_counter()
            request = CommitRequest(tensors=staged, stall_s=staged_at - entered, wait_s=0.0, staged_at=staged_at,
                                    **metadata)
            return self._commit_now(request, None, defer=self._defers(blocking=True))
        slot, waited = self._staging.acquire(self._staging.staged_bytes(flat.tensors))
        try:
            staged = slot.prepare(flat.tensors)
        except BaseException:
            self._staging.release(slot)
            raise
        release = functools.partial(self._staging.release, slot)
        defer = self._defers(blocking=False)
        ahead: WriteAhead | None = None

        def abandon() -> None:
            if ahead is not None:
                ahead.close()  # its writers read the slot: done before it is released
            release()

        try:
            if not blocking:
                ahead = self._plan_write_ahead(slot, staged, raw=defer or not self.config.compression)
            # Phase 2 and the write-ahead start once the copy has ended. Started during it (as
            # they once were), their database reads, layout and wake-ups took the interpreter
            # lock from the copying thread: under training the copy took twice as long
            # (BENCHMARKS.md). Except into a fresh arena: that copy is bound by the kernel
            # faulting its pages in (~0.3 s per GiB, against ~0.07 s for the same copy later),
            # and the files it has filled are written meanwhile.
            early = None
            if ahead is not None and slot.fresh:
                early = functools.partial(ahead.copied, executor=self._ahead_pool)
            summaries = None
            if early is None and not blocking and self._copy_stats:
                # The copy also takes the statistics' pass (in the same pass over memory), so
                # phase 2 only hashes (Slot.copy_summarized).
                summaries = slot.copy_summarized(flat.tensors, staged, self.config.chunk_size, self._pool)
            else:
                slot.copy(flat.tensors, staged, progress=early)
        except BaseException:
            abandon()
            raise
        staged_at = time.perf_counter()
        stall = staged_at - entered
        if blocking:  # CUDA tensors: staged first, then committed on this thread
            request = CommitRequest(tensors=staged, stall_s=stall, wait_s=waited, staged_at=staged_at, **metadata)
            return self._commit_now(request, release, defer=self._defers(blocking=True))
        request = CommitRequest(tensors=staged, stall_s=stall, wait_s=waited, staged_at=staged_at, ahead=ahead,
                                summaries=summaries, **metadata)
        try:
            if ahead is not None:  # once phase 2 is queued, _persist closes it in any case
                # Before phase 2 is queued: phase 2 must find the writes started when it seals.
                ahead.start(self._ahead_pool)
            future = self._committer.submit(lambda: self._persist(request, self._background_pool, defer=defer),
                                            finally_=release)
        except BaseException:
            abandon()
            raise
        if defer and self._idle_repack:
            self._committer.submit_idle(self._repack_when_idle)
        return CommitHandle(future, staged=True, on_failure_seen=self._committer.acknowledge)

    def _plan_write_ahead(self, slot: Slot, staged: dict[str, torch.Tensor], *, raw: bool) -> WriteAhead | None:
        """The write-ahead of an asynchronous commit whose new chunks are stored raw: every
        tensor except those the previous commit found unchanged (see ``ingest.writeahead``)."""
        arena = slot.arena
        if not (raw and self._write_ahead) or arena is None:
            return None
        unchanged = self._unchanged
        ahead = WriteAhead(self._backend, arena, list(staged.values()), [n not in unchanged for n in staged],
                           target=self.config.pack_target, chunk_size=self.config.chunk_size)
        return ahead if ahead.tensors else None

    def _defers(self, *, blocking: bool) -> bool:
        """Whether a commit stores its new chunks raw, leaving their encoding to ``repack``."""
        mode = self.config.encode
        return self.config.compression and (mode == "deferred" or (mode == "auto" and not blocking))

    def _repack_when_idle(self, stop: Callable[[], bool]) -> None:
        """The background repack between asynchronous commits, an idle job of the committer
        thread. It runs on idle-priority threads whatever ``background_priority`` says, so that
        once started it never takes CPU a training job wants, in runs of at most
        ``_IDLE_REPACK_PACKS`` deferred packs until none is left or ``stop()`` turns true.

        The committer thread waits here until the repack is done or ``stop()`` (a commit or a
        drain came), then returns at once: the repack notices ``stop`` at its next chunk, but
        an idle-priority thread on cores a training job keeps busy may take seconds to get
        there, and a commit must not wait for it (a repack is safe beside commits: it moves
        only chunk rows still where it read them). ``_settle`` waits for it to end.

        The repack also gives way when the rest of the machine leaves it less spare CPU than
        the gate asked for (``spare.BusyWatch``: a training loop resumed without committing),
        then waits on its own thread for the next window with spare CPU, as the gate had."""
        from ckptrepo import repack as packer

        def own() -> list[int]:
            return spare.threads_named("ckpt-repack", "ckpt-idle", "ckpt-bg")

        def run() -> None:
            while not stop():
                watch = spare.BusyWatch(own)
                report = packer.repack(self._sessions, self._backend, self._reader, self._idle_pool, self.config,
                                       stop=functools.partial(_give_way, stop, watch), max_packs=_IDLE_REPACK_PACKS,
                                       # Pending layouts first, in short transactions: this thread may
                                       # get little CPU while it holds the lock the next commit waits for.
                                       index_batch=_IDLE_INDEX_BATCH)
                if report.stopped and not stop():  # the machine got busy: wait for spare CPU again
                    # A gate of its own: the committer thread's may be in use once stop() turns true.
                    if not wait_for_spare(SpareCpuGate(), functools.partial(_poll_stop, stop),
                                          self._committer.idle_delay):
                        return
                    continue
                if report.stopped or not report.chunks_encoded + report.chunks_copied:
                    return

        running = self._repack_thread.submit(run)
        self._repack_running = running
        running.add_done_callback(_log_repack_failure)
        while not stop():
            try:
                running.exception(timeout=_POLL_S)  # a failure is logged by _log_repack_failure
                return
            except FutureTimeout:
                continue

    def _index_layouts(self) -> None:
        """Index the pending layouts (before a commit that reads layouts or records its rows);
        a layout kept from a commit that left its own pending (no keys) is dropped, to be read
        back with its keys."""
        if not self._defers_layouts:
            return
        pending.index_pending(self._sessions)
        self._pending_chunks.clear()
        if self._last_keyless:
            self._last_recorded, self._last_keyless = None, False

    def _settle(self) -> None:
        """Wait for pending commits and for a background repack to end (gc, repack and verify
        see the repository at rest)."""
        self._committer.drain()
        self._wait_for_repack()

    def _wait_for_repack(self) -> None:
        """Block until a background repack (running, or winding down after ``stop``) has ended."""
        running = self._repack_running
        if running is not None:
            running.exception()

    def _commit_now(self, request: CommitRequest, release: Callable[[], None] | None, *,
                    defer: bool = False) -> CommitHandle:
        """A blocking commit: in call order after the pending background commits, but on this
        thread and the normal-priority pool (the caller waits for it)."""
        self._committer.drain()
        done: Future[t.Commit] = Future()
        try:
            done.set_result(self._persist(request, self._pool, defer=defer))
        finally:
            if release is not None:
                release()
        return CommitHandle(done, staged=True)

    def _persist(self, req: CommitRequest, pool: ThreadPoolExecutor, *, defer: bool = False) -> t.Commit:
        """Phase 2 (the background thread, or the caller's for a blocking commit; ``pool`` for
        hashing and encoding): packs durable first, then one transaction makes the commit
        visible. On any failure nothing of this commit is visible. ``defer``: new chunks are
        written raw into packs marked ``deferred`` for ``repack`` (hash, statistics and
        writes only). The request's write-ahead is closed before this returns."""
        try:
            return self._persist_packs_then_rows(req, pool, defer=defer)
        finally:
            if req.ahead is not None:
                req.ahead.close()

    def _persist_packs_then_rows(self, req: CommitRequest, pool: ThreadPoolExecutor, *, defer: bool) -> t.Commit:
        with self._sessions() as s:
            head = catalog.branch_head(s, req.branch)
            parent_ids = [revparse.resolve(s, p) for p in req.parents] if req.parents else []
            if req.parents is None and head is not None:
                parent_ids = [head]
            if head is not None and head not in parent_ids:
                raise UsageError(
                    f"branch {req.branch!r} is at {short(head)}, which is not among the given parents",
                    hint="Commit on another branch, or include the branch head as a parent.",
                )
            transfer = (revparse.resolve(s, req.transfer[0]), req.transfer[1]) if req.transfer else None
        # The first parent's layout (``record_commit`` derives rows from it): not read again
        # when this process recorded that commit last, as a training loop's commits do. Such a
        # commit, asynchronous and with at most that parent, may leave its own layout pending
        # (``db.pending``); any other reads layouts from the catalog, pending ones indexed first.
        last, parent = self._last_recorded, None
        follows = not parent_ids or (last is not None and last.commit_id == parent_ids[0])
        lazy = defer and self._defers_layouts and transfer is None and len(parent_ids) <= 1 and follows
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
        plan: Future[DeltaPlan] | None = None
        if self.config.compression and self.config.delta and not defer:
            names, first = list(req.tensors), parent_ids[0] if parent_ids else None

            def plan_bases() -> DeltaPlan:
                with self._sessions() as s:
                    return delta_plan(s, names, first, transfer, reader=self._reader, cache=self._base_cache,
                                      max_depth=self.config.max_delta_depth, policy=self.config.delta_base)

            plan = pool.submit(plan_bases)  # queued before the hashing jobs: read while they run
        opts = IngestOptions(
            chunk_size=self.config.chunk_size, compression=self.config.compression and not defer,
            zstd_level=self.config.zstd_level,
        )

        def known(ids: list[str]) -> set[str]:
            with self._sessions() as s:
                have = catalog.existing_chunks(s, ids)
            # Chunks of this process's pending layouts are stored too (the commit then shares
            # chunks beyond its parent's, and records its rows at once: below).
            return have | self._pending_chunks.intersection(ids) if self._pending_chunks else have

        # Write-ordering step 1: ingest returns only after every new pack is durable in the store.
        sink = PackSink(self._backend, self.config.pack_target)
        if len(self._plane_hints) > _MAX_HINTS:
            self._plane_hints.clear()
        result = ingest(req.tensors, sink, known, pool, opts, likely, plan, self._plane_hints,
                        ahead=req.ahead, summaries=req.summaries)
        result.deferred = defer
        new = result.new_chunk_ids
        if lazy and not all(x in new or x in likely for r in result.tensors for x in r.chunk_ids):
            # It shares chunks the store had beyond its parent's: recorded with its rows now, so
            # that their foreign keys hold them against a gc of another process.
            lazy, keyless = False, self._last_keyless
            self._index_layouts()
            if parent is not None and keyless:  # read back with the keys its indexing gave it
                with self._sessions() as s:
                    parent = catalog.commit_layout(s, parent.commit_id)
        self._unchanged = frozenset(r.name for r in result.tensors if r.chunk_ids and new.isdisjoint(r.chunk_ids))
        edges = [catalog.EdgeRow(pid, "parent" if i == 0 else "merge", i) for i, pid in enumerate(parent_ids)]
        entries = {r.name: r.tensor_id for r in result.tensors}
        if transfer is not None and transfer[0] not in parent_ids:
            # A declared mapping is recorded as given; without one, which tensors are byte-identical.
            mapping = transfer[1] if transfer[1] is not None else self._identical_tensors(entries, transfer[0])
            edges.append(catalog.EdgeRow(transfer[0], "transfer", len(edges), mapping))
        row = self._commit_row(result, entries, edges, req)
        row["persist_s"] = time.perf_counter() - req.staged_at
        now = _now()
        conflict: str | None = None
        # Write-ordering step 2: one transaction inserts the chunk index, tensors, the commit,
        # its edges and moves the branch (or, lazy, the commit, its edges and its layout as one
        # pending row, which names only packs made durable above); nothing of this commit is
        # visible before it commits.
        try:
            with write_transaction(self._sessions) as s:
                conflict, kept, layout = self._record(s, result, row, edges, entries, req, head, now, parent,
                                                      lazy=lazy)
        except DbIntegrityError as exc:
            # A foreign key names a row that is gone: a gc in another process removed chunks or
            # tensors this commit deduplicated against after it looked them up.
            raise ConcurrentChange(what="commit", other="gc", detail=str(exc.orig).splitlines()[0]) from exc
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
                              expected=short(head) if head else "(no branch)",
                              hint=f"The commit is kept on branch {kept!r}; merge it or commit again on top "
                                   f"of {req.branch}.")
        return commit

    def _record(self, s: Session, result: IngestResult, row: dict[str, Any], edges: list[catalog.EdgeRow],
                entries: dict[str, str], req: CommitRequest, head: str | None,
                now: datetime, parent: catalog.CommitLayout | None, *, lazy: bool = False,
                ) -> tuple[str | None, str, catalog.CommitLayout]:
        """Insert one commit's rows and move its branch, inside the caller's transaction
        (``parent``: the first parent's layout, read before ingest). ``lazy``: the tensor-level
        rows are left pending (``db.pending``); the layout returned then holds no keys.

        Returns ``(conflict, kept, layout)``: the branch head found instead of ``head`` (None
        when the branch moved as expected), the ``conflicts/`` branch that then keeps the commit,
        and the commit's layout (``catalog.record_commit``).
        """
        kept = ""
        packs = [catalog.PackRow(p.pack_id, p.size, len(p.locations), result.deferred) for p in result.packs]
        chunks = [
            catalog.ChunkRow(loc.chunk_id, loc.pack_id, loc.offset, loc.length, loc.raw_length,
                             loc.encoding, loc.depth, loc.base_id, result.alone_lengths.get(loc.chunk_id))
            for p in result.packs for loc in p.locations
        ]
        tensors = [catalog.TensorRow(r.tensor_id, r.dtype, r.shape, r.nbytes, r.chunk_size, r.chunk_ids, r.stats)
                   for r in result.tensors]
        if lazy:
            catalog.record_head(s, packs=packs, commit=row, edges=edges, metrics=req.metrics, now=now)
            pending.defer_layout(s, row["id"], chunks, tensors, entries)
            layout = catalog.CommitLayout(row["id"], dict(entries), {r.tensor_id: r.chunk_ids for r in result.tensors},
                                          {}, {})
        else:
            layout = catalog.record_commit(s, packs=packs, chunks=chunks, tensors=tensors, commit=row, entries=entries,
                                           edges=edges, metrics=req.metrics, now=now, parent=parent)
        conflict = catalog.move_branch(s, req.branch, row["id"], head, now)
        if conflict is not None:
            # The branch moved under us: keep the commit reachable under its own branch
            # rather than lose it, and tell the caller.
            kept = f"conflicts/{req.branch}/{short(row['id'])}"
            catalog.move_branch(s, kept, row["id"], None, now)
        faults.point("db.before_commit")
        return conflict, kept, layout

    def _locate_chunks(self, ids: Collection[str]) -> dict[str, ChunkLocation]:
        """Chunk locations by id (the reader's lookup for delta bases)."""
        with self._sessions() as s:
            return {cid: location(row) for cid, row in catalog.chunks_by_id(s, sorted(ids)).items()}

    def _identical_tensors(self, entries: dict[str, str], source: str) -> dict[str, str]:
        """{name here: name in ``source``} for this commit's tensors byte-identical to one of the source's."""
        with self._sessions() as s:
            by_id: dict[str, str] = {}
            for entry, tensor in catalog.tensor_layout(s, source):
                by_id.setdefault(tensor.id, entry.name)
        return {name: by_id[tid] for name, tid in entries.items() if tid in by_id}

    def _commit_row(
        self, result: IngestResult, entries: dict[str, str], edges: list[catalog.EdgeRow], req: CommitRequest
    ) -> dict[str, Any]:
        author = request.author()
        host = socket.gethostname()
        identity = {
            "entries": sorted(entries.items()), "skeleton": req.skeleton,
            "edges": [[e.parent_id, e.kind, e.position, e.mapping] for e in edges],
            "message": req.message, "step": req.step, "epoch": req.epoch, "metrics": sorted(req.metrics.items()),
            "config": req.config, "created_at": req.created_at.isoformat(), "author": author, "host": host,
        }
        return {
            "id": hash_json(identity), "message": req.message, "created_at": req.created_at, "author": author,
            "host": host, "branch": req.branch, "step": req.step, "epoch": req.epoch, "config": req.config,
            "code_version": req.code_version, "skeleton": req.skeleton, "n_tensors": len(entries),
            "logical_bytes": result.logical_bytes, "new_bytes": result.new_bytes,
            "stored_bytes": result.stored_bytes, "stall_s": req.stall_s, "wait_s": req.wait_s, "persist_s": 0.0,
            "nonfinite": result.nonfinite,
        }

    # -- reading ---------------------------------------------------------------------------

    def resolve(self, rev: str) -> str:
        """The full id of the commit ``rev`` names."""
        self._check_open()
        with self._sessions() as s:
            return revparse.resolve(s, rev)

    def get_commit(self, rev: str) -> t.Commit:
        """The commit ``rev`` names, with parents, metrics and refs."""
        self._check_open()
        with self._sessions() as s:
            return _commit_by_id(s, revparse.resolve(s, rev))

    def log(
        self, rev: str | None = None, *, where: str | None = None, limit: int | None = None, offset: int = 0
    ) -> list[t.Commit]:
        """``rev`` and its ancestors (every commit when None), newest first, optionally
        filtered by a ``where`` expression (``"val_loss < 2.1 and step >= 1000"``; see
        ``lineage.where``) and paged with ``limit``/``offset``."""
        self._check_open()
        return queries.log(self, rev, where=where, limit=limit, offset=offset)

    # -- lineage and analysis (read-only; see lineage.queries and lineage.analysis) ---------

    def ancestors(self, rev: str, *, kinds: Collection[str] = EDGE_KINDS, max_depth: int | None = None) -> list[str]:
        """Ids of the commits ``rev`` descends from through edges of ``kinds``, nearest first."""
        return queries.ancestors(self, rev, kinds=kinds, max_depth=max_depth)

    def descendants(
        self, rev: str, *, kinds: Collection[str] = EDGE_KINDS, max_depth: int | None = None
    ) -> list[str]:
        """Ids of the commits descending from ``rev`` through edges of ``kinds``, nearest first."""
        return queries.descendants(self, rev, kinds=kinds, max_depth=max_depth)

    def path(self, a: str, b: str, *, kinds: Collection[str] = EDGE_KINDS) -> list[str]:
        """A shortest chain of commit ids from ``a`` to ``b`` (down to a common ancestor and up);
        [] when they are unrelated."""
        return queries.path(self, a, b, kinds=kinds)

    def merge_base(self, a: str, b: str, *, kinds: Collection[str] = EDGE_KINDS) -> list[str]:
        """The best common ancestors of ``a`` and ``b`` (several after criss-cross merges)."""
        return queries.merge_base(self, a, b, kinds=kinds)

    def best(
        self, metric: str, *, maximize: bool = False, branch: str | None = None, subtree: str | None = None,
        limit: int = 1,
    ) -> list[t.Commit]:
        """The commits with the lowest (or highest) ``metric``, among a branch's history or a subtree."""
        return queries.best(self, metric, maximize=maximize, branch=branch, subtree=subtree, limit=limit)

    def diff(self, a: str, b: str, *, exact: bool = False) -> Diff:
        """Per-tensor differences from ``a`` to ``b``: from stored statistics and shared chunks
        only, or with ``exact`` the L2 distance, relative change and cosine similarity computed
        from the chunks that differ (and only those)."""
        return analysis.diff(self, a, b, exact=exact)

    def history(self, name: str, *, along: str = "main", limit: int | None = None) -> list[HistoryPoint]:
        """Statistics of tensor ``name`` and its change from the previous commit along the
        first-parent chain of ``along``, newest first (no tensor bytes read)."""
        return analysis.history(self, name, along=along, limit=limit)

    def tensors(self, rev: str) -> list[t.TensorInfo]:
        """Names, layout and ingest statistics of a commit's tensors (no tensor bytes read)."""
        with self._reading() as s:
            cid = revparse.resolve(s, rev)
            return [views.tensor_info(e.name, tr) for e, tr in catalog.tensor_layout(s, cid)]

    def checkout(self, rev: str, *, into: Mapping[str, Any] | None = None, allow_pickle: bool = False) -> Any:
        """The state committed at ``rev`` (tensors on the CPU, ties restored).

        With ``into``, also load it into live objects: modules, optimizers and schedulers
        via ``load_state_dict``, tensors in place. Every chunk's hash is verified.
        """
        with self._reading() as s:
            cid = revparse.resolve(s, rev)
            row = s.get(CommitRow, cid)
            assert row is not None
            skeleton = row.skeleton
            layout = catalog.tensor_layout(s, cid)
            chunks = catalog.chunk_locations(s, [tr for _, tr in layout])
        tensors = read_tensors(self._reader, self._pool, [(e.name, tr, chunks[tr.id]) for e, tr in layout],
                               commit_id=cid)
        restored = st.unflatten(skeleton, tensors, allow_pickle=allow_pickle)
        if into is not None:
            st.load_into(into, restored)
        return restored

    def export(self, rev: str, path: str | Path) -> str:
        """Write the state committed at ``rev`` to ``path`` (``.safetensors``, or ``.pt``/``.pth``/
        ``.bin``/``.ckpt`` for ``torch.save``), atomically; returns the commit's id.

        The file is what ``write_state(repo.checkout(rev), path)`` writes, every chunk verified;
        a flat dict of tensors going to ``.safetensors`` is streamed (each tensor written while
        the later ones are decoded) instead of restored whole first.
        """
        with self._reading() as s:
            cid = revparse.resolve(s, rev)
            row = s.get(CommitRow, cid)
            assert row is not None
            layout = catalog.tensor_layout(s, cid)
            chunks = catalog.chunk_locations(s, [tr for _, tr in layout])
        items = {e.name: (tr, chunks[tr.id]) for e, tr in layout}
        export_state(Path(path), row.skeleton, items, self._reader, self._pool, commit_id=cid,
                     checkout=lambda: self.checkout(cid))
        return cid

    def load_tensor(self, rev: str, name: str) -> torch.Tensor:
        """One tensor of a commit, reading only that tensor's chunks."""
        with self._reading() as s:
            cid = revparse.resolve(s, rev)
            layout = catalog.tensor_layout(s, cid, [name])
            if not layout:
                raise UnknownTensor(commit=short(cid), name=name)
            chunks = catalog.chunk_locations(s, [layout[0][1]])
        row = layout[0][1]
        return read_tensors(self._reader, self._pool, [(name, row, chunks[row.id])], commit_id=cid)[name]

    # -- refs ------------------------------------------------------------------------------

    def branch(self, name: str, at: str | None = None, *, force: bool = False) -> t.RefInfo:
        """Create branch ``name`` at ``at`` (default: the head of main, else the newest commit).

        An existing branch is only moved with ``force=True``.
        """
        return self._set_ref("branch", name, at, force=force)

    def tag(self, name: str, at: str | None = None) -> t.RefInfo:
        """Create tag ``name`` at ``at``; tags never move."""
        return self._set_ref("tag", name, at, force=False)

    def _set_ref(self, kind: str, name: str, at: str | None, *, force: bool) -> t.RefInfo:
        self._check_open()
        revparse.check_ref_name(name, kind)
        with write_transaction(self._sessions) as s:
            target = revparse.resolve(s, at) if at is not None else _default_target(s)
            existing = s.get(Ref, (kind, name))
            if existing is not None:
                if not force:
                    raise RefExists(kind=kind.capitalize(), name=name)
                existing.commit_id = target
                existing.updated_at = _now()
            else:
                s.add(Ref(kind=kind, name=name, commit_id=target, updated_at=_now()))
        return t.RefInfo(name=name, kind=kind, commit_id=target)

    def delete_branch(self, name: str, *, force: bool = False) -> t.RefInfo:
        """Delete branch ``name``; returns what it named. Its commits stay until ``gc``.

        Refused (UnreachableCommits) when no other ref reaches some of its commits, unless
        ``force``: those commits are then garbage that the next ``gc`` removes.
        """
        return self._delete_ref("branch", name, force=force)

    def delete_tag(self, name: str, *, force: bool = False) -> t.RefInfo:
        """Delete tag ``name``, on the same terms as ``delete_branch``."""
        return self._delete_ref("tag", name, force=force)

    def _delete_ref(self, kind: str, name: str, *, force: bool) -> t.RefInfo:
        self._check_open()
        with write_transaction(self._sessions) as s:
            ref = s.get(Ref, (kind, name))
            if ref is None:
                raise UnknownRef(kind=kind, name=name)
            info = t.RefInfo(name=name, kind=kind, commit_id=ref.commit_id)
            if not force:
                count = collector.orphaned_by_removing(s, kind, name)
                if count:
                    raise UnreachableCommits(kind=kind, name=name, count=count)
            s.execute(delete(Ref).where(Ref.kind == kind, Ref.name == name))
        return info

    def gc(self, *, grace: float = collector.DEFAULT_GRACE_S, dry_run: bool = False) -> t.GcReport:
        """Remove commits no ref reaches and every row, pack and file only they needed.

        Waits for this repository's pending commits first. Objects younger than ``grace``
        seconds are kept (a commit of another process may be writing them); see
        ``ckptrepo.gc`` for the order of deletions and what a crash leaves.
        ``dry_run`` reports the same figures and changes nothing but indexing the pending
        layouts (``db.pending``), which every gc does first.
        """
        self._check_open()
        self._settle()
        return collector.collect(self._sessions, self._backend, grace=grace, dry_run=dry_run)

    def repack(self, *, compact_below: float = 0.0, dry_run: bool = False) -> RepackReport:
        """Encode the chunks commits stored raw (deferred encoding) and, with ``compact_below``
        (a fraction), move the live chunks of packs that less than that fraction of their
        bytes is live for into new packs; see ``ckptrepo.repack`` for the order of writes.

        Waits for this repository's pending commits first; runs on the normal-priority
        workers. Old packs are retired, not deleted: ``gc`` deletes them once they have been
        retired for longer than its grace period. Pending layouts are indexed first
        (``db.pending``); ``dry_run`` then only counts.
        """
        from ckptrepo import repack as packer

        self._check_open()
        self._settle()
        return packer.repack(self._sessions, self._backend, self._reader, self._pool, self.config,
                             compact_below=compact_below, dry_run=dry_run)

    def repack_pending(self) -> tuple[int, int]:
        """``(packs, bytes)`` that commits stored raw and no repack has encoded yet."""
        from ckptrepo import repack as packer

        self._check_open()
        return packer.pending(self._sessions)

    def branches(self) -> list[t.RefInfo]:
        """Every branch, by name."""
        return self._refs("branch")

    def tags(self) -> list[t.RefInfo]:
        """Every tag, by name."""
        return self._refs("tag")

    def _refs(self, kind: str) -> list[t.RefInfo]:
        self._check_open()
        with self._sessions() as s:
            rows = s.scalars(select(Ref).where(Ref.kind == kind).order_by(Ref.name))
            return [t.RefInfo(name=r.name, kind=r.kind, commit_id=r.commit_id) for r in rows]

    # -- whole repository ------------------------------------------------------------------

    def stats(self) -> t.RepoStats:
        """Counts and sizes of the whole repository (see ``RepoStats``)."""
        with self._reading() as s:
            return t.RepoStats(**catalog.totals(s))

    @contextmanager
    def _reading(self) -> Iterator[Session]:
        """A session for reading the tensor-level tables: its snapshot holds no pending layout
        (``db.pending``), whatever other threads and processes commit meanwhile. When one
        holds some, they are indexed and a new snapshot is taken."""
        self._check_open()
        if not self._defers_layouts:  # no pending layout is ever made here (PostgreSQL)
            with self._sessions() as s:
                yield s
                return
        for _ in range(_READ_ATTEMPTS):
            with self._sessions() as s:
                if not pending.exists(s):  # the snapshot starts here (SQLite: BEGIN DEFERRED)
                    yield s
                    return
            pending.index_pending(self._sessions)
        raise ConcurrentChange(what="read", other="commit",
                               detail=f"commits kept deferring their layouts over {_READ_ATTEMPTS} attempts")

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("this repository is closed", hint="Open it again with Repo.open(path).")
        if self._committer.inherited:  # this process was forked from the one that opened it
            raise ForkedProcess(what="repository", owner=self._committer.owner, pid=os.getpid())

    def verify(self, *, full: bool = False) -> t.VerifyReport:
        """Check database and packs against each other, read-only but for indexing pending
        layouts first (see ``ckptrepo.verify``).

        Waits for this repository's pending commits (and stops its background repack) first,
        so that its own writes in progress are not reported as leftovers."""
        from ckptrepo.verify import verify

        self._check_open()
        self._settle()

        return verify(self, full=full)


def _give_way(stop: Callable[[], bool], watch: spare.BusyWatch) -> bool:
    """Whether a background repack should stop: a commit or drain came, or the machine got busy."""
    return stop() or watch.busy()


def _poll_stop(stop: Callable[[], bool], timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``stop()`` to turn true, polling; whether it did."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if stop():
            return True
        time.sleep(_POLL_S)
    return stop()


def _log_repack_failure(done: Future[None]) -> None:
    exc = None if done.cancelled() else done.exception()
    if exc is not None:
        log.warning("background repack failed (it is retried later): %s", exc)


def find_repo(path: str | Path = ".", *, search_parents: bool = False) -> Path:
    """The ``.ckpt`` folder at ``path`` (``path`` itself or ``path/.ckpt``), or with
    ``search_parents`` the nearest one at or above it; NotARepository otherwise.
    Opens nothing, so it works on a repository whose schema needs an upgrade."""
    p = Path(path).expanduser().resolve()
    if (p / "config.json").is_file() and p.name == REPO_DIRNAME:
        return p
    for folder in (p, *p.parents) if search_parents else (p,):
        if (folder / REPO_DIRNAME / "config.json").is_file():
            return folder / REPO_DIRNAME
    if not search_parents and (p / "config.json").is_file():
        return p
    raise NotARepository(path=str(p))


def upgrade_database(path: str | Path) -> tuple[str | None, str]:
    """Bring the repository's database schema to this code's head; returns (from, to)."""
    repo_dir = find_repo(path)
    config = RepoConfig.load(repo_dir)
    engine = make_engine(database_url(config.db_url, repo_dir))
    try:
        before = migrate.current_revision(engine)
        migrate.upgrade(engine)
        return before, migrate.head_revision()
    finally:
        engine.dispose()


# -- helpers ---------------------------------------------------------------------------------


def _commit_by_id(s: Session, commit_id: str) -> t.Commit:
    """The stored commit with this full id; UnknownRevision when there is none."""
    found = views.commits_by_id(s, [commit_id])
    if not found:
        raise UnknownRevision(rev=commit_id)
    return found[0]


def _default_target(s: Session) -> str:
    head = catalog.branch_head(s, DEFAULT_BRANCH)
    if head is not None:
        return head
    newest = s.scalars(select(CommitRow.id).order_by(CommitRow.created_at.desc()).limit(1)).first()
    if newest is None:
        raise UnknownRevision(rev="HEAD", hint="The repository has no commits yet; commit first.")
    return newest



