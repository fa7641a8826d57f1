"""The background repack between asynchronous commits: an idle job of the committer thread.

Asynchronous commits store their new chunks raw (deferred encoding); ``IdleRepack.run``
encodes them (``maintenance.repack``) while the committing process has nothing else to do. It
runs on idle-priority threads whatever the commits' priority, so that once started it never
takes CPU a training job wants, in runs of at most ``_PACKS_PER_RUN`` deferred packs until none
is left or ``stop()`` turns true (a commit or a drain came).

The committer thread waits in ``run`` until the repack is done or ``stop()``, then returns at
once: the repack notices ``stop`` at its next chunk, but an idle-priority thread on cores a
training job keeps busy may take seconds to get there, and a commit must not wait for it (a
repack is safe beside commits: it moves only chunk rows still where it read them). ``wait``
blocks until it has ended (gc, repack, verify and close call it).

The repack also gives way when the rest of the machine leaves it less spare CPU than the gate
asked for (``spare.BusyWatch``: a training loop resumed without committing), then waits on its
own thread for the next window with spare CPU.

Like any repack, each batch holds a lease in the store (``ledger.leases``) from its first
chunk until its transaction has ended, so a ``gc`` of another process, whatever its grace
period, keeps the new pack the batch's rows are about to name.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from sqlalchemy.orm import Session, sessionmaker

from ckptrepo.chunks.store import ChunkReader
from ckptrepo.config import RepoConfig
from ckptrepo.ingest import priority, spare
from ckptrepo.ingest.committer import wait_for_spare
from ckptrepo.ingest.spare import SpareCpuGate
from ckptrepo.maintenance import repack as packer
from ckptrepo.storage.base import Backend

log = logging.getLogger("ckptrepo")
# Deferred packs one run plans at a time (oldest first; ~64 MiB each): its planning reads every
# chunk of the packs it takes, and must not grow with the backlog.
_PACKS_PER_RUN = 8
_INDEX_BATCH = 4  # pending layouts per transaction (this thread may get little CPU while it holds the lock)
_POLL_S = 0.05


class IdleRepack:
    """Runs the background repack of one repository on a thread of its own at idle priority,
    encoding on ``pool`` (idle-priority workers)."""

    def __init__(self, sessions: sessionmaker[Session], backend: Backend, reader: ChunkReader, config: RepoConfig,
                 pool: ThreadPoolExecutor, *, idle_delay: float) -> None:
        self._sessions, self._backend, self._reader, self._config = sessions, backend, reader, config
        self._pool = pool
        self._idle_delay = idle_delay
        lowest = functools.partial(priority.lower_this_thread, "idle")
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-repack", initializer=lowest)
        self._running: Future[None] | None = None

    def run(self, stop: Callable[[], bool]) -> None:
        """The committer's idle job: start the repack and wait for it or for ``stop()``."""

        def own() -> list[int]:
            return spare.threads_named("ckpt-repack", "ckpt-idle", "ckpt-bg")

        def work() -> None:
            while not stop():
                watch = spare.BusyWatch(own)
                report = packer.repack(self._sessions, self._backend, self._reader, self._pool, self._config,
                                       stop=functools.partial(_give_way, stop, watch), max_packs=_PACKS_PER_RUN,
                                       index_batch=_INDEX_BATCH)
                if report.stopped and not stop():  # the machine got busy: wait for spare CPU again
                    # A gate of its own: the committer thread's may be in use once stop() turns true.
                    if not wait_for_spare(SpareCpuGate(), functools.partial(_poll_stop, stop), self._idle_delay):
                        return
                    continue
                if report.stopped or not report.chunks_encoded + report.chunks_copied:
                    return

        running = self._thread.submit(work)
        self._running = running
        running.add_done_callback(_log_failure)
        while not stop():
            try:
                running.exception(timeout=_POLL_S)  # a failure is logged by _log_failure
                return
            except FutureTimeout:
                continue

    def wait(self) -> None:
        """Block until a repack (running, or winding down after ``stop``) has ended."""
        running = self._running
        if running is not None:
            running.exception()

    def close(self) -> None:
        """Wait for a repack to end and stop the thread (the caller has stopped the committer)."""
        self.wait()
        self._thread.shutdown(wait=True)


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


def _log_failure(done: Future[None]) -> None:
    exc = None if done.cancelled() else done.exception()
    if exc is not None:
        log.warning("background repack failed (it is retried later): %s", exc)
