"""Background replication: commits durable on the local tier are pushed to a remote (the
durable tier) on a thread of their own, never on the training loop's path.

``Repo`` hands ``Replicator.after_commit`` to its commit engine (after the retention hook): the
call only marks work and wakes the thread. The thread pushes every branch (``push_all``, the
usual push: packs, manifests, then refs by compare-and-swap) until nothing is left, then sleeps.
A failed push (the remote unreachable, a ref that moved there) is logged, kept as
``last_error``, and retried with a growing pause (up to ``MAX_PAUSE_S``) while commits keep
landing locally; ``wait`` lets a caller block until a commit is on the remote (the final step of
a run), raising the last error when the remote stays out of reach past its timeout.

What is waiting is the *backlog*: the commits on the local branches the remote does not hold
yet, and their bytes (``backlog``). When it exceeds ``CKPT_REPLICATION_BACKLOG`` bytes, a new
commit is refused with ``ReplicationBacklog`` before anything is written (the documented policy:
never silent loss, never an unbounded local tier), until replication catches up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ckptrepo.errors import CkptError, ReplicaWaiting

log = logging.getLogger("ckptrepo")
MIN_PAUSE_S = 0.5
MAX_PAUSE_S = 30.0


class Replicator:
    """Pushes in the background (module docstring). ``push_all`` pushes every branch and returns
    the commits the remote now holds at their heads; ``held(commit_id)`` says whether the remote
    holds a commit."""

    def __init__(self, remote: str, push_all: Callable[[], object], held: Callable[[str], bool]) -> None:
        self.remote = remote
        self._push_all, self._held = push_all, held
        self._cond = threading.Condition()
        self._dirty = False
        self._closed = False
        self._running = False
        self._thread: threading.Thread | None = None
        self.last_error: CkptError | Exception | None = None
        self.pushes = 0
        self.failures = 0
        self.publishes = True
        """False: only this node's own packs go up (a rank of a job over node-local stores that is not
        its coordinator); the coordinator's rounds publish the commits."""

    def after_commit(self, commit_id: str) -> None:
        """The commit engine's hook: mark work and wake the thread (never blocks, never raises)."""
        with self._cond:
            if self._closed:
                return
            self._dirty = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="ckpt-replicate", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def kick(self) -> None:
        """Start a round now (commits an earlier process left on the local tier go with it: a
        repository opened again starts replicating at its first commit or wait)."""
        self.after_commit("")

    def _loop(self) -> None:
        pause = MIN_PAUSE_S
        while True:
            with self._cond:
                while not self._dirty and not self._closed:
                    self._cond.wait()
                if not self._dirty:
                    return
                self._dirty = False
                self._running = True
            try:
                self._push_all()
            except ReplicaWaiting:  # other nodes' packs are on their way up: look again soon
                if not self._again(MIN_PAUSE_S / 5):
                    return
                continue
            except Exception as exc:  # the training loop goes on; the next round retries
                self.failures += 1
                # One warning per outage (then debug lines), and one line when it ends.
                report = log.warning if self.last_error is None else log.debug
                self.last_error = exc
                report("replication to remote %r failed (commits stay on the local tier and are pushed when it is "
                       "reachable again; retrying): %s", self.remote, exc)
                if not self._again(pause):
                    return
                pause = min(pause * 2, MAX_PAUSE_S)
                continue
            self.pushes += 1
            if self.last_error is not None:
                log.warning("replication to remote %r works again", self.remote)
            self.last_error = None
            pause = MIN_PAUSE_S
            with self._cond:
                self._running = False
                self._cond.notify_all()

    def _again(self, pause: float) -> bool:
        """Mark the round to be run again after ``pause`` seconds; False once closed (stop)."""
        with self._cond:
            self._dirty = True
            self._running = False
            self._cond.notify_all()
            if self._closed:
                return False
            self._cond.wait(pause)
        return True

    def wait(self, commit_id: str, timeout: float | None = None) -> None:
        """Block until the remote holds ``commit_id`` and the round that carried it has ended (no
        write to the remote is left in flight for it); after ``timeout`` seconds, raise the last
        replication error (or TimeoutError when there was none). A round is started only when none
        is running or due (a commit an earlier process left); one that is would carry it anyway."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            idle = not self._dirty and not self._running
        if idle and not self._held(commit_id):
            self.kick()
        while True:
            held = self._held(commit_id)
            with self._cond:
                if held and not self._running:
                    return
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    if held:
                        return
                    if self.last_error is not None:
                        raise self.last_error
                    raise TimeoutError(f"commit {commit_id[:10]} did not reach remote {self.remote!r} in {timeout} s")
                self._cond.wait(0.05 if left is None else min(left, 0.05))

    def close(self) -> None:
        """Stop after the round in progress (commits not pushed stay on the local tier)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()
