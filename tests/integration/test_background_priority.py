"""Background priority of asynchronous commits: which threads are lowered, and which never are."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptrepo
from ckptrepo.errors import UsageError
from ckptrepo.ingest import priority

pytestmark = pytest.mark.skipif(not priority.supported(), reason="needs Linux SCHED_IDLE")


def _policies() -> dict[str, int]:
    """Scheduling policy of every live thread, by thread name."""
    return {t.name: os.sched_getscheduler(t.native_id) for t in threading.enumerate() if t.native_id is not None}


def _state() -> dict[str, torch.Tensor]:
    return {"w": torch.randn(3, 300_000), "b": torch.zeros(7)}


def test_resolve_defaults_env_and_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CKPT_" + priority.ENV, raising=False)
    assert priority.resolve(None) == "normal"
    monkeypatch.setenv("CKPT_" + priority.ENV, "idle")
    assert priority.resolve(None) == "idle"
    assert priority.resolve("normal") == "normal"
    with pytest.raises(UsageError, match="background priority 'low'"):
        priority.resolve("low")


def test_async_commits_run_on_idle_threads_blocking_ones_and_checkouts_do_not(tmp_path: Path) -> None:
    state = _state()
    with ckptrepo.Repo.init(tmp_path / "r", background_priority="idle") as repo:
        first = repo.commit(state, step=1).wait()
        policies = _policies()
        lowered = {name for name, pol in policies.items() if pol == os.SCHED_IDLE}
        assert any(n.startswith("ckpt-commit") for n in lowered), policies
        assert any(n.startswith("ckpt-bg") for n in lowered), policies
        assert os.sched_getscheduler(0) != os.SCHED_IDLE  # the caller's thread is never touched
        second = repo.commit(state | {"b": torch.ones(7)}, step=2, blocking=True).wait()
        restored = repo.checkout(second.id)
        assert torch.equal(restored["b"], torch.ones(7)) and torch.equal(restored["w"], state["w"])
        normal_pool = {n: p for n, p in _policies().items() if n.startswith("ckpt_")}
        assert normal_pool and all(p != os.SCHED_IDLE for p in normal_pool.values()), normal_pool
        assert [c.id for c in repo.log("main")] == [second.id, first.id]


def test_normal_priority_lowers_nothing(tmp_path: Path) -> None:
    with ckptrepo.Repo.init(tmp_path / "r", background_priority="normal") as repo:
        repo.commit(_state(), step=1).wait()
        assert all(p != os.SCHED_IDLE for p in _policies().values())


@pytest.mark.parametrize("prio", ["normal", "idle"])
def test_the_repack_between_commits_runs_on_idle_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         prio: str) -> None:
    from ckptrepo.maintenance import repack as packer

    monkeypatch.setenv("CKPT_IDLE_REPACK_SPARE", "0")  # the spare-CPU gate opens whatever else runs here
    seen: list[tuple[int, int]] = []
    real = packer.repack

    def spy(sessions: Any, backend: Any, reader: Any, pool: Executor, config: Any, **kw: Any) -> Any:
        seen.append((os.sched_getscheduler(0), pool.submit(os.sched_getscheduler, 0).result()))
        return real(sessions, backend, reader, pool, config, **kw)

    monkeypatch.setattr(packer, "repack", spy)
    with ckptrepo.Repo.init(tmp_path / "r", background_priority=prio, idle_repack=True) as repo:
        repo.commit(_state(), step=1).wait()
        commit_threads = {n: p for n, p in _policies().items() if n.startswith(("ckpt-commit", "ckpt_"))}
        deadline = time.monotonic() + 60
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
    assert seen and all(loop == os.SCHED_IDLE and workers == os.SCHED_IDLE for loop, workers in seen), seen
    if prio == "normal":
        assert commit_threads and all(p != os.SCHED_IDLE for p in commit_threads.values()), commit_threads
