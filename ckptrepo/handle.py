"""``CommitHandle``: what ``Repo.commit`` returns while the commit becomes durable."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING

from ckptrepo.errors import ForkedProcess, UsageError

if TYPE_CHECKING:
    from ckptrepo.types import Commit


class CommitHandle:
    """A commit in flight.

    ``staged`` is True once the state has been copied: the caller may mutate it again.
    ``wait()`` blocks until the commit is durable and visible and returns it, or
    re-raises the error that stopped it (the repository is then as it was before, unless
    the error is ``CommitReadFailed``: durable and visible, but not returned). An error ``wait()``
    re-raised is not reported again by the next ``commit()``. In a process forked while
    the commit was in flight, ``wait()`` raises ForkedProcess: the commit is the parent's.
    """

    def __init__(
        self,
        future: Future[Commit],
        *,
        staged: bool = True,
        on_failure_seen: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._future = future
        self._staged = staged
        self._on_failure_seen = on_failure_seen
        self._owner = os.getpid()

    @property
    def staged(self) -> bool:
        return self._staged

    def done(self) -> bool:
        """True once the commit is durable or has failed."""
        return self._future.done()

    def add_done_callback(self, fn: Callable[[Commit], None]) -> None:
        """Call ``fn(commit)`` once the commit is durable and visible (on the thread that finished
        it, or at once if it has); not called when the commit fails."""
        def done(future: Future[Commit]) -> None:
            if not future.cancelled() and future.exception() is None:
                fn(future.result())

        self._future.add_done_callback(done)

    def wait(self, timeout: float | None = None) -> Commit:
        """The durable commit; re-raises a background failure; UsageError on timeout;
        ForkedProcess in a forked child while the commit is still in flight there."""
        if not self._future.done() and os.getpid() != self._owner:
            raise ForkedProcess(what="commit", owner=self._owner, pid=os.getpid())
        try:
            return self._future.result(timeout)
        except FutureTimeout as exc:
            raise UsageError(f"commit not durable within {timeout} s",
                             hint="Call wait() again, or without a timeout.") from exc
        except BaseException as exc:
            if self._on_failure_seen is not None:
                self._on_failure_seen(exc)
            raise

    def __repr__(self) -> str:
        state = "done" if self.done() else ("staged" if self._staged else "staging")
        return f"<CommitHandle {state}>"
