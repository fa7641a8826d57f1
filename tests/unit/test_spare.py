"""The spare-CPU gate of the background repack: reads /proc/stat, opens only after a window
with enough idle cores, never blocks where it cannot measure."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from ckptrepo.ingest.spare import BusyWatch, SpareCpuGate, read_cpu_times, thread_cpu_ns, threads_named


def _stat(path: Path, user: int, idle: int, iowait: int = 0, cpus: int = 2) -> None:
    per = "".join(f"cpu{i} 0 0 0 0 0 0 0 0 0 0\n" for i in range(cpus))
    path.write_text(f"cpu  {user} 0 0 {idle} {iowait} 0 0 0 0 0\n{per}intr 1 2 3\n")


def test_read_cpu_times_counts_idle_iowait_and_cpus(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    _stat(stat, user=100, idle=50, iowait=7, cpus=4)
    assert read_cpu_times(stat) == (57, 157, 4)
    assert read_cpu_times(tmp_path / "missing") is None
    (tmp_path / "bad").write_text("nonsense\n")
    assert read_cpu_times(tmp_path / "bad") is None


def test_the_gate_opens_only_after_a_window_with_spare_cores(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    gate = SpareCpuGate(min_spare=0.5, path=stat)
    _stat(stat, user=0, idle=0)
    gate.start()
    _stat(stat, user=190, idle=10)  # 2 CPUs, 5% idle: 0.1 of a core spare
    assert not gate.passed()
    assert gate.last_spare == pytest.approx(0.1)
    _stat(stat, user=290, idle=110)  # the next window: half idle, one core spare
    assert gate.passed()
    assert gate.last_spare == pytest.approx(1.0)
    assert not gate.passed()  # no tick since: nothing measured, no start


def test_the_gate_does_not_block_where_it_cannot_measure(tmp_path: Path) -> None:
    gate = SpareCpuGate(min_spare=0.5, path=tmp_path / "missing")
    gate.start()
    assert gate.passed()


def test_the_threshold_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CKPT_IDLE_REPACK_SPARE", "0")
    stat = tmp_path / "stat"
    _stat(stat, user=0, idle=0)
    gate = SpareCpuGate(path=stat)
    gate.start()
    _stat(stat, user=200, idle=0)
    assert gate.min_spare == 0 and gate.passed()
    monkeypatch.setenv("CKPT_IDLE_REPACK_SPARE", "150")
    assert SpareCpuGate(path=stat).min_spare == pytest.approx(1.5)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_busy_watch_leaves_the_repacks_own_cpu_out(tmp_path: Path) -> None:
    # 2 CPUs at 100 ticks/s: a 1 s window has 200 ticks.
    stat, clock, own_ns = tmp_path / "stat", _Clock(), [0]
    _stat(stat, user=0, idle=0)
    watch = BusyWatch(lambda: [1], min_spare=0.5, window=0.5, path=stat, clock=clock,
                      thread_ns=lambda ids: own_ns[0], ticks=100)
    # The repack alone took a whole core, the rest of the machine half of one: 1.5 cores spare.
    clock.now, own_ns[0] = 1.0, 10**9
    _stat(stat, user=150, idle=50)
    assert not watch.busy()
    assert watch.last_spare == pytest.approx(1.5)
    # Within the window nothing is measured: the last answer holds.
    _stat(stat, user=350, idle=50)
    clock.now = 1.2
    assert not watch.busy()
    # The next window: 2 cores busy, the repack's own share 0.2 core: 0.2 spare for it.
    clock.now, own_ns[0] = 2.0, int(1.2e9)
    assert watch.busy()
    assert watch.last_spare == pytest.approx(0.2)
    # Once busy it stays busy, whatever the next window shows.
    clock.now = 5.0
    _stat(stat, user=350, idle=650)
    assert watch.busy()


def test_busy_watch_never_trips_where_it_cannot_measure_or_at_zero(tmp_path: Path) -> None:
    clock = _Clock()
    blind = BusyWatch(list, min_spare=0.5, path=tmp_path / "missing", clock=clock, ticks=100)
    clock.now = 10.0
    assert not blind.busy()
    stat = tmp_path / "stat"
    _stat(stat, user=0, idle=0)
    lax = BusyWatch(list, min_spare=0.0, path=stat, clock=clock, ticks=100)
    _stat(stat, user=2000, idle=0)
    clock.now = 20.0
    assert not lax.busy()


def test_threads_named_and_their_cpu_time() -> None:
    ready, done = threading.Event(), threading.Event()

    def spin() -> None:
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
        ready.set()
        done.wait(5)

    worker = threading.Thread(target=spin, name="ckpt-probe-1")
    worker.start()
    try:
        ready.wait(5)
        ids = threads_named("ckpt-probe")
        assert ids == [worker.native_id]
        assert thread_cpu_ns(ids) >= 40_000_000
        assert thread_cpu_ns([]) == 0
    finally:
        done.set()
        worker.join()
