"""PyTorch Lightning with RepoCheckpoint: commits every N steps, is interrupted, resumes from the repository."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import ckptrepo

pl = pytest.importorskip("lightning.pytorch")

from ckptrepo.integrations.lightning import RepoCheckpoint  # noqa: E402


class Regressor(pl.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)}


class Interrupt(Exception):
    pass


class StopAt(pl.Callback):  # type: ignore[misc]
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step == self.step:
            raise Interrupt


def fit(root: Path, callbacks: list[Any], ckpt_path: str | None = None) -> Regressor:
    pl.seed_everything(0)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    model = Regressor()
    saving = any(isinstance(c, pl.callbacks.ModelCheckpoint) for c in callbacks)
    trainer = pl.Trainer(max_steps=24, accelerator="cpu", devices=1, logger=False, enable_checkpointing=saving,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(root),
                         callbacks=callbacks)
    trainer.fit(model, loader, ckpt_path=ckpt_path)
    return model


def test_lightning_commits_every_n_steps_and_resumes_from_the_repository(tmp_path: Path) -> None:
    straight = fit(tmp_path / "straight", [])

    callback = RepoCheckpoint(tmp_path / "repo", every_n_steps=8, branch="pl")
    with pytest.raises(Interrupt):
        fit(tmp_path / "run", [callback, StopAt(13)])
    callback.close()
    with ckptrepo.Repo.open(tmp_path / "repo") as repo:
        log = repo.log("pl")
        assert [c.step for c in log] == [8] and log[0].epoch == 0
        assert log[0].metrics is not None and "train_loss" in log[0].metrics

    resumed_cb = RepoCheckpoint(tmp_path / "repo", every_n_steps=8, branch="pl")
    path = resumed_cb.checkout("pl", tmp_path / "resume" / "step8.ckpt")
    resumed = fit(tmp_path / "run2", [resumed_cb], ckpt_path=path)
    resumed_cb.close()
    with ckptrepo.Repo.open(tmp_path / "repo") as repo:
        assert [c.step for c in repo.log("pl")] == [24, 16, 8]
    want, got = straight.state_dict(), resumed.state_dict()
    for name in want:
        assert torch.equal(want[name], got[name]), name


def test_ckpt_commit_of_a_lightning_checkpoint_takes_its_step_epoch_and_score(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ckptrepo.cli.app import app

    saver = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ckpts"), monitor="train_loss", every_n_train_steps=10,
                                         save_top_k=-1)
    fit(tmp_path / "run", [saver])
    path = sorted((tmp_path / "ckpts").glob("*.ckpt"))[0]
    runner = CliRunner()
    repo = tmp_path / "repo"
    assert runner.invoke(app, ["--repo", str(repo), "init"]).exit_code == 0
    result = runner.invoke(app, ["--repo", str(repo), "commit", str(path), "--json"])
    assert result.exit_code == 0, result.output
    with ckptrepo.Repo.open(repo) as r:
        commit = r.get_commit("main")
        assert (commit.step, commit.epoch) == (10, 1) and set(commit.metrics or {}) == {"train_loss"}
        assert torch.equal(r.checkout("main")["state_dict"]["net.0.weight"],
                           torch.load(path, weights_only=True)["state_dict"]["net.0.weight"])


def test_import_run_of_a_lightning_checkpoint_folder_is_a_lineage_in_step_order(tmp_path: Path) -> None:
    """A real run's .ckpt files (ModelCheckpoint every 5 steps, top-k by loss, plus last.ckpt)
    and one renamed so its step is only inside: one commit per step, in step order."""
    from typer.testing import CliRunner

    from ckptrepo.cli.app import app

    ckpts = tmp_path / "ckpts"
    saver = pl.callbacks.ModelCheckpoint(dirpath=str(ckpts), monitor="train_loss", every_n_train_steps=5,
                                         save_top_k=-1, save_last=True)
    fit(tmp_path / "run", [saver])
    assert (ckpts / "last.ckpt").exists()
    (ckpts / "epoch=2-step=20.ckpt").rename(ckpts / "renamed.ckpt")
    runner = CliRunner()
    repo = tmp_path / "repo"
    assert runner.invoke(app, ["--repo", str(repo), "init"]).exit_code == 0
    result = runner.invoke(app, ["--repo", str(repo), "import-run", str(ckpts), "--json"])
    assert result.exit_code == 0, result.output
    assert "left out last.ckpt" in result.stderr
    with ckptrepo.Repo.open(repo) as r:
        log = r.log("main")
        assert [c.step for c in log] == [20, 15, 10, 5] and [c.epoch for c in log] == [2, 1, 1, 0]
        assert log[0].message == "renamed.ckpt" and all(set(c.metrics or {}) == {"train_loss"} for c in log)
        assert [len(c.parents) for c in log] == [1, 1, 1, 0]
        final = torch.load(ckpts / "renamed.ckpt", weights_only=True)["state_dict"]
        assert all(torch.equal(r.checkout("main")["state_dict"][k], v) for k, v in final.items())


def test_a_checkpoint_with_pickled_objects_needs_allow_pickle(tmp_path: Path) -> None:
    import argparse

    from typer.testing import CliRunner

    from ckptrepo.cli.app import app

    path = tmp_path / "hp.ckpt"
    torch.save({"pytorch-lightning_version": "2.6.6", "global_step": 3, "epoch": 0, "loops": {},
                "state_dict": {"w": torch.ones(2)}, "hyper_parameters": {"args": argparse.Namespace(lr=0.1)}}, path)
    runner = CliRunner()
    repo = tmp_path / "repo"
    assert runner.invoke(app, ["--repo", str(repo), "init"]).exit_code == 0
    refused = runner.invoke(app, ["--repo", str(repo), "commit", str(path)])
    assert refused.exit_code == 2 and "allow_pickle" in refused.output
    allowed = runner.invoke(app, ["--repo", str(repo), "commit", str(path), "--allow-pickle"])
    assert allowed.exit_code == 0, allowed.output
    assert "runs any code" in allowed.stderr
    with ckptrepo.Repo.open(repo) as r:
        assert r.get_commit("main").step == 3
        assert r.checkout("main", allow_pickle=True)["hyper_parameters"]["args"].lr == 0.1


def test_a_refused_checkpoint_leaves_the_repository_unchanged(tmp_path: Path) -> None:
    import argparse

    from typer.testing import CliRunner

    from ckptrepo.cli.app import app

    path = tmp_path / "hp.ckpt"
    torch.save({"pytorch-lightning_version": "2.6.6", "global_step": 3, "loops": {},
                "hyper_parameters": {"args": argparse.Namespace(lr=0.1)}}, path)
    repo = tmp_path / "repo"
    with ckptrepo.Repo.init(repo) as r:
        r.commit({"w": torch.zeros(2)}, blocking=True).wait()
        before = r.stats()
    assert CliRunner().invoke(app, ["--repo", str(repo), "commit", str(path)]).exit_code == 2
    with ckptrepo.Repo.open(repo) as r:
        after = r.stats()
        assert (after.commits, after.pack_bytes) == (before.commits, before.pack_bytes)
