"""The stored retention setting applied by itself after the commits of this process.

``Repo`` hands ``AutoRetention.after_commit`` to its commit engine (``CommitWriter``'s
``after_commit``), which calls it once a commit is durable and visible, on the thread that
recorded it. That call only looks at a cached copy of the setting (read from the database at
most every ``REFRESH_S`` seconds, or given by ``set_rules`` when set through this process) and,
when there is one, queues a run on a thread of its own; it never blocks, never reads the
database and never raises, so a commit's ``handle.wait()`` does not wait for retention.

A run reads the setting, prunes by it (``maintenance.prune``) and, when something is pruned,
runs ``gc`` with the default grace period. At most one run at a time: triggers that come while
one is waiting to start are folded into it, so the last commit is always followed by a run
that sees it. The gc is put off while a later commit of this process is in flight (it could
share chunks only pruned commits hold, which that gc would remove under it: ``gc``'s
``ConcurrentChange``); a run after a later commit does it. A failed run is logged as a
warning (``logging``, logger ``ckptrepo``) and changes nothing for commits.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session, sessionmaker

from ckptrepo.maintenance import DEFAULT_GRACE_S
from ckptrepo.storage import Backend
from ckptrepo.types import PruneReport, RetentionRules

if TYPE_CHECKING:
    from ckptrepo.handle import CommitHandle

log = logging.getLogger("ckptrepo")
REFRESH_S = 5.0
"""How old the cached setting may get before a commit makes a run read it again."""


class AutoRetention:
    """Runs the retention setting after commits (see the module docstring). Owned by one
    ``Repo``; ``close`` waits for a run in progress."""

    def __init__(self, sessions: sessionmaker[Session], reading: Callable[[], AbstractContextManager[Session]],
                 backend: Backend, *, grace: float = DEFAULT_GRACE_S, refresh_s: float = REFRESH_S) -> None:
        self._sessions, self._reading, self._backend = sessions, reading, backend
        self._grace, self._refresh_s = grace, refresh_s
        self._lock = threading.Lock()
        self._rules: RetentionRules | None = None
        self._read_at = -math.inf  # monotonic time the cache was filled
        self._pool: ThreadPoolExecutor | None = None
        self._queued = False
        self._closed = False
        self._seq = 0
        self._handles: list[tuple[int, CommitHandle]] = []  # asynchronous commits of this process
        self._later: list[CommitHandle] = []  # in flight behind the commit that last triggered a run
        self._trigger_seq = 0
        self._gc_owed = False
        self.last: PruneReport | None = None
        """The report of the last run that pruned (None before)."""
        self.runs = 0
        self.gc_runs = 0

    # -- called by Repo and the commit engine --------------------------------------------------

    def track(self, handle: CommitHandle) -> None:
        """Note an asynchronous commit of this process (``Repo.commit``)."""
        with self._lock:
            self._seq += 1
            self._handles = [(n, h) for n, h in self._handles if not h.done()]
            self._handles.append((self._seq, handle))

    def set_rules(self, rules: RetentionRules | None) -> None:
        """The setting as this process just stored it: cached without reading it back."""
        with self._lock:
            self._rules, self._read_at = rules, time.monotonic()

    def after_commit(self, commit_id: str) -> None:
        """``CommitWriter``'s hook: queue a run unless the cached setting says there is none."""
        with self._lock:
            if self._closed or (self._rules is None and time.monotonic() - self._read_at < self._refresh_s):
                return
            pending = [h for _, h in self._handles if not h.done()]
            # Commits run in order: the oldest one not done is the one calling (none for a blocking commit).
            self._later = pending[1:]
            self._trigger_seq = self._seq
            if self._queued:
                return  # the run waiting to start sees this commit too
            self._queued = True
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-retention")
            pool = self._pool
        pool.submit(self._run)

    def wait(self) -> None:
        """Block until a queued or running run has ended."""
        with self._lock:
            pool = self._pool
        if pool is not None:
            pool.submit(lambda: None).result()

    def close(self) -> None:
        """Wait for a run to end; no run starts after this."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    # -- the run ---------------------------------------------------------------------------

    def _busy(self) -> bool:
        """Whether a commit of this process later than the one that triggered the run is in flight."""
        with self._lock:
            later = [h for h in self._later if not h.done()]
            return bool(later) or any(n > self._trigger_seq and not h.done() for n, h in self._handles)

    def _setting(self) -> RetentionRules | None:
        from ckptrepo.maintenance import setting

        with self._lock:
            if time.monotonic() - self._read_at < self._refresh_s:
                return self._rules
        with self._sessions() as s:
            rules = setting.read(s)
        self.set_rules(rules)
        return rules

    def _run(self) -> None:
        with self._lock:
            self._queued = False
        try:
            rules = self._setting()
            if rules is None:
                return
            from ckptrepo.maintenance import gc, prune

            report = prune.prune(self._sessions, self._reading, self._backend, rules)
            self.runs += 1
            if report.pruned:
                self.last = report
            if report.pruned:
                self._gc_owed = True  # until a gc has run
            if not self._gc_owed or self._busy():
                return
            gc.collect(self._sessions, self._backend, grace=self._grace)
            self._gc_owed = False
            self.gc_runs += 1
        except Exception as exc:  # commits go on; the next commit's run tries again
            log.warning("automatic retention failed (commits are not affected; it runs again after the next "
                        "commit): %s", exc)
