"""The spare-CPU gate of the background repack: reads /proc/stat, opens only after a window
with enough idle cores, never blocks where it cannot measure."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptrepo.ingest.spare import SpareCpuGate, read_cpu_times


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
