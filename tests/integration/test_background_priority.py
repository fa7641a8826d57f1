"""Background priority of asynchronous commits: which threads are lowered, and which never are."""

from __future__ import annotations

import os
import threading
from pathlib import Path

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
    monkeypatch.delenv(priority.ENV, raising=False)
    assert priority.resolve(None) == "idle"
    monkeypatch.setenv(priority.ENV, "normal")
    assert priority.resolve(None) == "normal"
    assert priority.resolve("idle") == "idle"
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
