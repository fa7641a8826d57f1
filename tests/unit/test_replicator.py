"""The background replicator's wait (``remote.replicate.Replicator``): it returns once the remote
holds the commit and the round that carried it has ended, starts a round only when none is
running or due, and raises the last error when the remote stays out of reach."""

from __future__ import annotations

import threading
import time

import pytest

from ckptrepo.errors import StorageError
from ckptrepo.remote.replicate import Replicator


class FakeRemote:
    """A push that records the commit as held part-way through the round, then keeps writing."""

    def __init__(self, tail_s: float = 0.3, fail: bool = False) -> None:
        self.held: set[str] = set()
        self.pending: set[str] = set()
        self.rounds = 0
        self.ended = threading.Event()
        self.tail_s, self.fail = tail_s, fail

    def push_all(self) -> None:
        self.rounds += 1
        self.ended.clear()
        if self.fail:
            raise StorageError(detail="remote unreachable")
        self.held |= self.pending  # the refs moved: the commit is on the remote
        time.sleep(self.tail_s)  # what the round writes after that (its bookkeeping)
        self.ended.set()


def test_wait_returns_once_the_round_that_carried_the_commit_has_ended() -> None:
    remote = FakeRemote()
    replicator = Replicator("r", remote.push_all, remote.held.__contains__)
    remote.pending.add("c1")
    replicator.after_commit("c1")
    replicator.wait("c1", timeout=10)
    assert "c1" in remote.held and remote.ended.is_set()  # nothing of that round is still in flight
    time.sleep(0.2)
    assert remote.rounds == 1  # the commit's own round carried it: wait started no other
    replicator.close()


def test_wait_starts_a_round_for_a_commit_an_earlier_process_left() -> None:
    remote = FakeRemote(tail_s=0.0)
    replicator = Replicator("r", remote.push_all, remote.held.__contains__)
    remote.pending.add("old")
    replicator.wait("old", timeout=10)
    assert remote.rounds == 1 and "old" in remote.held
    replicator.wait("old", timeout=10)  # held already and nothing running: no round
    assert remote.rounds == 1
    replicator.close()


def test_wait_raises_the_last_error_when_the_remote_stays_out_of_reach() -> None:
    remote = FakeRemote(fail=True)
    replicator = Replicator("r", remote.push_all, remote.held.__contains__)
    replicator.after_commit("c1")
    with pytest.raises(StorageError, match="unreachable"):
        replicator.wait("c1", timeout=0.5)
    replicator.close()
    assert replicator.failures >= 1
