"""Hugging Face Trainer with RepoCallback: commits at save steps, is interrupted, resumes from the repository."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import ckptrepo
from ckptrepo.errors import UnknownRevision

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from ckptrepo.integrations.transformers import RepoCallback  # noqa: E402


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.net(x).squeeze(-1), labels)}


class Data(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(64, 8, generator=g), torch.randn(64, generator=g)

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


class Interrupt(Exception):
    pass


class StopAt(transformers.TrainerCallback):  # type: ignore[misc]
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            raise Interrupt


def trainer(out: Path, callbacks: list[Any]) -> Any:
    transformers.set_seed(0)
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=12, save_steps=4, per_device_train_batch_size=8, logging_steps=1,
        learning_rate=1e-2, report_to=[], use_cpu=True, seed=0, data_seed=0, dataloader_num_workers=0,
        disable_tqdm=True)
    return transformers.Trainer(model=Regressor(), args=args, train_dataset=Data(), callbacks=callbacks)


def test_trainer_commits_at_save_steps_and_resumes_from_the_repository(tmp_path: Path) -> None:
    straight = trainer(tmp_path / "straight", [])
    straight.train()

    callback = RepoCallback(tmp_path / "repo", branch="ft")
    interrupted = trainer(tmp_path / "out", [callback, StopAt(6)])
    with pytest.raises(Interrupt):
        interrupted.train()
    callback.close()
    with ckptrepo.Repo.open(tmp_path / "repo") as repo:
        log = repo.log("ft")
        assert [c.step for c in log] == [4] and log[0].message == "checkpoint-4"
        assert log[0].metrics is not None and "loss" in log[0].metrics and log[0].epoch == 0

    resumed_cb = RepoCallback(tmp_path / "repo", branch="ft")
    folder = resumed_cb.checkout("ft", tmp_path / "from-repo" / "checkpoint-4")
    resumed = trainer(tmp_path / "out2", [resumed_cb])
    resumed.train(resume_from_checkpoint=folder)
    assert resumed.state.global_step == 12
    resumed_cb.close()
    with ckptrepo.Repo.open(tmp_path / "repo") as repo:
        assert [c.step for c in repo.log("ft")] == [12, 8, 4]
    want, got = straight.model.state_dict(), resumed.model.state_dict()
    for name in want:
        assert torch.equal(want[name], got[name]), name


def test_checkout_of_the_callbacks_empty_branch_is_none_and_starts_afresh(tmp_path: Path) -> None:
    """Issue 45 item 7: the README's one-liner on a first run. ``checkout`` of the callback's own
    branch without a commit returns None (no folder), and ``resume_from_checkpoint=None`` trains
    from scratch; any other unknown revision still raises UnknownRevision."""
    straight = trainer(tmp_path / "straight", [])
    straight.train()
    callback = RepoCallback(tmp_path / "repo", branch="ft")
    with pytest.raises(UnknownRevision):
        callback.checkout("other", tmp_path / "other")
    assert callback.checkout("ft", tmp_path / "from-repo" / "ckpt") is None
    assert not (tmp_path / "from-repo").exists()
    first = trainer(tmp_path / "out", [callback])
    first.train(resume_from_checkpoint=callback.checkout("ft", tmp_path / "from-repo" / "ckpt"))
    assert first.state.global_step == 12
    want, got = straight.model.state_dict(), first.model.state_dict()
    assert [name for name in want if not torch.equal(want[name], got[name])] == []
    assert callback.checkout("ft", tmp_path / "from-repo" / "ckpt") == str(tmp_path / "from-repo" / "ckpt")
    with pytest.raises(UnknownRevision):
        callback.checkout("ft~7", tmp_path / "old")
    callback.close()
    with ckptrepo.Repo.open(tmp_path / "repo") as repo:
        assert [c.step for c in repo.log("ft")] == [12, 8, 4]
    default = RepoCallback(tmp_path / "fresh")  # no branch: the repository's current one
    assert default.checkout("main", tmp_path / "fresh") is None
    with pytest.raises(UnknownRevision):
        default.checkout("ft", tmp_path / "fresh")
    default.close()
