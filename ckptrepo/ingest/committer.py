"""Phase 2 runner: one background thread per repository makes staged commits durable,
in the order they were staged.

The thread is owned by the ``Committer``; ``submit`` hands it a job and returns the
future the ``CommitHandle`` waits on. A failed job is remembered so that the next
``commit()`` raises it instead of silently continuing (``take_failure``). Pending jobs
are flushed by ``drain``/``close``, and at interpreter exit before ``concurrent.futures``
refuses new work (the jobs themselves use a worker pool).

Idle jobs (``submit_idle``: the background repack) run on the same thread between commits
(or hand their work to another thread and wait for it there, as the repack does to run at
idle priority), so they never run concurrently with one; one starts only after ``idle_delay`` seconds without
a new commit (a training loop that commits more often than that never pays for starting
and abandoning them) and, with an ``idle_gate``, only at the end of such a window in which the
gate saw spare CPU (``ingest.spare``: on cores a training job keeps busy it keeps waiting,
window after window, until a commit or a drain comes). Each receives a ``stop`` callable that turns true
as soon as a commit is submitted or a drain begins; it must return promptly then. A commit
submitted while an idle job runs starts once that job has returned.

A process forked from the owner inherits a copy of the committer but not its thread: there
``inherited`` is True, ``drain`` and ``close`` return at once (the pending jobs are the
parent's) and ``submit`` raises ForkedProcess, so a child's normal exit never waits for
jobs no thread of it will run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from ckptrepo.errors import ForkedProcess

T = TypeVar("T")
log = logging.getLogger("ckptrepo")

_live: weakref.WeakSet[Committer] = weakref.WeakSet()


def _flush_all_at_exit() -> None:
    for committer in list(_live):
        committer.drain()  # returns at once in a forked child (``inherited``)


try:
    # Runs before concurrent.futures' own exit hook (hooks run in reverse order of
    # registration), so pending commits can still use the worker pool at exit.
    threading._register_atexit(_flush_all_at_exit)  # type: ignore[attr-defined]
except (AttributeError, RuntimeError):  # pragma: no cover - other Pythons
    import atexit

    atexit.register(_flush_all_at_exit)


class IdleGate(Protocol):
    """Whether an idle job may start at the end of a waiting window (see ``ingest.spare``)."""

    def start(self) -> None: ...

    def passed(self) -> bool: ...


def wait_for_spare(gate: IdleGate, wait: Callable[[float], bool], window: float) -> bool:
    """Wait window after window until the gate passes one (True), or until ``wait(window)``,
    which waits up to ``window`` seconds, reports that a stop came (False)."""
    gate.start()
    while True:
        if wait(window):
            return False
        if gate.passed():
            return True


class Committer:
    """Runs commit jobs one at a time on a background thread, first in, first out."""

    def __init__(self, name: str = "ckpt-commit", *, initializer: Callable[[], None] | None = None,
                 idle_delay: float = 1.0, idle_gate: IdleGate | None = None) -> None:
        self.idle_delay = idle_delay
        self.idle_gate = idle_gate
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name, initializer=initializer)
        self._pending: set[Future[Any]] = set()
        self._lock = threading.Lock()
        self._failure: BaseException | None = None
        self._idle: dict[Future[Any], threading.Event] = {}
        self.owner = os.getpid()  # the process whose thread runs the jobs
        _live.add(self)

    @property
    def inherited(self) -> bool:
        """True in a process forked from the one that made this committer."""
        return os.getpid() != self.owner

    def submit(self, job: Callable[[], T], *, finally_: Callable[[], None] | None = None) -> Future[T]:
        """Queue ``job``; ``finally_`` runs after it on the background thread, whatever happens.
        ForkedProcess in a forked child (``inherited``)."""
        if self.inherited:
            raise ForkedProcess(what="repository's committer", owner=self.owner, pid=os.getpid())

        def run() -> T:
            try:
                return job()
            except BaseException as exc:
                with self._lock:
                    self._failure = exc
                raise
            finally:
                if finally_ is not None:
                    finally_()

        self._stop_idle()
        future = self._executor.submit(run)
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._forget)
        return future

    def submit_idle(self, job: Callable[[Callable[[], bool]], object]) -> None:
        """Queue ``job(stop)`` to run after the queued commits unless another commit or a
        drain comes first (and, with an idle gate, only once a window had spare CPU); its
        failure is logged, never reported to a commit."""
        stop = threading.Event()
        gate = self.idle_gate

        def run() -> None:
            with self._lock:
                if stop.is_set() or self._pending:
                    return
            due = not stop.wait(self.idle_delay) if gate is None else wait_for_spare(gate, stop.wait, self.idle_delay)
            if not due:  # a commit or a drain came first
                return
            try:
                job(stop.is_set)
            except Exception as exc:
                log.warning("background repack failed (it is retried later): %s", exc)

        future = self._executor.submit(run)
        with self._lock:
            self._idle[future] = stop
        future.add_done_callback(self._forget_idle)

    def _forget_idle(self, future: Future[Any]) -> None:
        with self._lock:
            self._idle.pop(future, None)

    def _stop_idle(self) -> list[Future[Any]]:
        """Ask every queued or running idle job to give way; return their futures."""
        with self._lock:
            idle = list(self._idle.items())
        for _, stop in idle:
            stop.set()
        return [f for f, _ in idle]

    def _forget(self, future: Future[Any]) -> None:
        with self._lock:
            self._pending.discard(future)

    def take_failure(self) -> BaseException | None:
        """The last background failure nobody has seen yet (through ``wait()`` or an earlier
        ``commit()``), once."""
        with self._lock:
            failure, self._failure = self._failure, None
        return failure

    def acknowledge(self, failure: BaseException) -> None:
        """``failure`` reached the caller (``wait()`` re-raised it): ``commit()`` need not report it."""
        with self._lock:
            if self._failure is failure:
                self._failure = None

    def wait_commits(self) -> None:
        """Block until every commit queued so far has finished (successfully or not: a failure
        stays on its handle); an idle job goes on. In a forked child, return at once."""
        if self.inherited:
            return
        with self._lock:
            pending = list(self._pending)
        for future in pending:
            with contextlib.suppress(BaseException):  # reported through the handle and the next commit()
                future.result()

    def drain(self) -> None:
        """Block until every queued job has finished (successfully or not); an idle job in
        progress is asked to stop and waited for. In a forked child, return at once."""
        if self.inherited:
            return
        idle = self._stop_idle()
        with self._lock:
            pending = list(self._pending)
        for future in idle:
            future.exception()
        for future in pending:
            try:
                future.result()
            except BaseException as exc:  # reported through the handle and the next commit()
                log.warning("a background commit failed: %s", exc)

    def close(self) -> None:
        """Drain, then stop the background thread (in a forked child: only forget it)."""
        if self.inherited:
            _live.discard(self)
            return
        self.drain()
        self._executor.shutdown(wait=True)
        _live.discard(self)
