"""Checkpointer: commits by policy (rule recorded), resumes objects and RNG states, refuses what it cannot save."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ckptrepo
from ckptrepo import Checkpointer, errors
from ckptrepo.policy import Every
from ckptrepo.training import capture_rng, restore_rng


def draws() -> tuple[Any, ...]:
    return (random.random(), random.gauss(0, 1), np.random.standard_normal(3).tolist(), torch.rand(3).tolist())


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def state_dict(self) -> dict[str, int]:
        return {"n": self.n}

    def load_state_dict(self, sd: dict[str, int]) -> None:
        self.n = sd["n"]


def test_rng_states_round_trip_through_a_commit(tmp_path: Path) -> None:
    random.gauss(0, 1)  # leaves a cached gaussian in python's generator
    with ckptrepo.Repo.init(tmp_path) as repo:
        repo.commit({"rng": capture_rng()}, blocking=True).wait()
        expected = draws()
        draws()
        restore_rng(repo.checkout("main")["rng"])
    assert draws() == expected


def test_commits_follow_the_policy_and_record_the_rule(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    counter = Counter()
    with Checkpointer(tmp_path / "run", model=model, extra={"counter": counter}, policy=Every(3)) as ckpt:
        made = [s for s in range(1, 11) if ckpt.after_step(s, {"loss": 1.0 / s}, epoch=s // 5) is not None]
        assert made == [3, 6, 9] and ckpt.last_rule == "every(3)"
        counter.n = 9
        ckpt.commit_now(10, rule="end of run")
    with ckptrepo.Repo.open(tmp_path / "run") as repo:
        log = repo.log("main")
        assert [c.step for c in log] == [10, 9, 6, 3]
        assert log[1].message == "step 9 (every(3))"
        assert log[1].config == {"checkpointer": {"rule": "every(3)", "world_size": 1}}
        assert log[1].metrics == {"loss": pytest.approx(1 / 9)} and log[1].epoch == 1
        assert log[0].message == "step 10 (end of run)"


def test_resume_loads_every_object_and_returns_the_step(tmp_path: Path) -> None:
    model, counter = torch.nn.Linear(4, 2), Counter()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    counter.n = 7
    with Checkpointer(tmp_path, model=model, optimizer=opt, extra={"c": counter}, policy=Every(5)) as ckpt:
        ckpt.after_step(5)
        expected = draws()
    weights = {k: v.clone() for k, v in model.state_dict().items()}

    model2, counter2 = torch.nn.Linear(4, 2), Counter()
    opt2 = torch.optim.AdamW(model2.parameters())
    with Checkpointer(tmp_path, model=model2, optimizer=opt2, extra={"c": counter2}) as ckpt:
        assert ckpt.resume() == 5
        assert draws() == expected
        assert ckpt.resume("main") == 5
    assert counter2.n == 7
    assert all(torch.equal(weights[k], v) for k, v in model2.state_dict().items())
    assert opt2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]


def test_resume_of_an_empty_branch_starts_at_zero(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    before = model.weight.clone()
    with Checkpointer(tmp_path, model=model, branch="exp") as ckpt:
        assert ckpt.resume() == 0
        with pytest.raises(errors.UnknownRevision):
            ckpt.resume("nope")
    assert torch.equal(model.weight, before)


def test_a_commit_without_rng_refuses_an_exact_resume(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    with Checkpointer(tmp_path, model=model, rng=False) as ckpt:
        ckpt.commit_now(1)
    with Checkpointer(tmp_path, model=model) as ckpt, pytest.raises(errors.UsageError, match="no RNG states"):
        ckpt.resume()
    with Checkpointer(tmp_path, model=model, rng=False) as ckpt:
        assert ckpt.resume() == 1


def test_what_cannot_be_saved_is_refused_or_warned_about(tmp_path: Path) -> None:
    with pytest.raises(errors.UsageError, match="has no state_dict"):
        Checkpointer(tmp_path, model=object())
    with pytest.raises(errors.UsageError, match="nothing to checkpoint"):
        Checkpointer(tmp_path, rng=False)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 1)), batch_size=2)
    with pytest.warns(UserWarning, match="StatefulDataLoader"), Checkpointer(tmp_path, dataloader=loader) as ckpt:
        assert "dataloader" not in ckpt.state()


def test_a_background_failure_is_raised_once_by_the_next_step(tmp_path: Path) -> None:
    from ckptrepo import faults

    model = torch.nn.Linear(4, 2)
    with Checkpointer(tmp_path, model=model, policy=Every(1)) as ckpt:
        with faults.inject("db.before_commit"):
            handle = ckpt.after_step(1)
            assert handle is not None
            with pytest.raises(faults.InjectedFault):
                handle.wait()
        with pytest.raises(faults.InjectedFault):
            ckpt.after_step(2)  # the failed commit of step 1; step 2 was not committed
        assert ckpt.after_step(3) is not None
        assert [c.step for c in ckpt.flush()] == [3]
    with ckptrepo.Repo.open(tmp_path) as repo:
        assert [c.step for c in repo.log("main")] == [3]


def test_a_refused_checkpointer_creates_no_repository(tmp_path: Path) -> None:
    with pytest.raises(errors.UsageError):
        Checkpointer(tmp_path / "run", model=object())
    with pytest.raises(errors.UsageError):
        Checkpointer(tmp_path / "run", rng=False)
    assert not (tmp_path / "run").exists()


def test_a_path_is_opened_at_first_use_and_a_raced_create_is_opened(tmp_path: Path) -> None:
    """A data-parallel job's non-committing processes never touch the repository; one created
    by another process between this one's open and create is opened."""
    from ckptrepo.training import CommitStream, open_or_init

    idle = CommitStream(tmp_path / "idle")
    idle.due(1)
    idle.stepped()
    idle.close()
    assert not (tmp_path / "idle").exists()

    ckptrepo.Repo.init(tmp_path / "raced").close()
    real_open = ckptrepo.Repo.open
    calls = []

    def open_once_too_early(path: Any, **kw: Any) -> ckptrepo.Repo:
        calls.append(path)
        if len(calls) == 1:
            raise errors.NotARepository(path=str(path))
        return real_open(path, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ckptrepo.Repo, "open", open_once_too_early)
        open_or_init(tmp_path / "raced").close()
    assert len(calls) == 2
