"""The committer's idle jobs (the background repack): run only when no commit is queued, give
way to a commit or a drain, never run concurrently with a commit, never fail one."""

from __future__ import annotations

import threading

from ckptrepo.ingest.committer import Committer


def test_an_idle_job_runs_when_nothing_is_queued() -> None:
    c = Committer()
    ran = threading.Event()
    try:
        c.submit(lambda: None).result()
        c.submit_idle(lambda stop: ran.set())
        c.drain()  # asks it to stop: a job that had not started yet is skipped, so wait for it below
        c.submit_idle(lambda stop: ran.set())
        assert ran.wait(30)
    finally:
        c.close()


def test_a_commit_stops_a_running_idle_job_and_runs_after_it() -> None:
    c = Committer()
    started, order = threading.Event(), []
    release = threading.Event()

    def idle(stop: object) -> None:
        assert callable(stop)
        started.set()
        while not stop():
            release.wait(0.001)
        order.append("idle stopped")

    try:
        c.submit_idle(idle)
        assert started.wait(30)
        c.submit(lambda: order.append("commit")).result()
        assert order == ["idle stopped", "commit"]
    finally:
        c.close()


def test_an_idle_job_queued_behind_a_commit_is_skipped() -> None:
    c = Committer()
    gate, ran = threading.Event(), []
    try:
        first = c.submit(gate.wait)
        c.submit_idle(lambda stop: ran.append("idle"))
        second = c.submit(lambda: ran.append("commit"))
        gate.set()
        first.result()
        second.result()
        c.drain()
        assert ran == ["commit"]
    finally:
        c.close()


def test_a_failing_idle_job_is_not_a_commit_failure() -> None:
    c = Committer()
    done = threading.Event()

    def boom(stop: object) -> None:
        done.set()
        raise RuntimeError("repack failed")

    try:
        c.submit_idle(boom)
        assert done.wait(30)
        c.drain()
        assert c.take_failure() is None
    finally:
        c.close()


class _Gate:
    """An idle gate whose answer the test sets; counts the windows it was asked about."""

    def __init__(self, open_: bool) -> None:
        self.open = open_
        self.asked = 0

    def start(self) -> None:
        pass

    def passed(self) -> bool:
        self.asked += 1
        return self.open


def test_a_closed_gate_keeps_the_idle_job_waiting_until_it_opens() -> None:
    gate = _Gate(open_=False)
    c = Committer(idle_delay=0.01, idle_gate=gate)
    ran = threading.Event()
    try:
        c.submit_idle(lambda stop: ran.set())
        assert not ran.wait(0.3)  # window after window without spare CPU
        assert gate.asked >= 3
        gate.open = True
        assert ran.wait(30)
    finally:
        c.close()


def test_a_commit_ends_an_idle_job_waiting_at_a_closed_gate() -> None:
    gate = _Gate(open_=False)
    c = Committer(idle_delay=0.01, idle_gate=gate)
    ran = []
    try:
        c.submit_idle(lambda stop: ran.append("idle"))
        while gate.asked == 0:
            threading.Event().wait(0.005)
        c.submit(lambda: ran.append("commit")).result()
        gate.open = True
        c.drain()
        assert ran == ["commit"]  # the waiting idle job gave way for good
    finally:
        c.close()
