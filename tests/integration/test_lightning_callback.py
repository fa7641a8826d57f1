"""PyTorch Lightning with RepoCheckpoint: commits every N steps, is interrupted, resumes from the repository."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptrepo
from ckptrepo.errors import UnknownRevision

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


def test_a_plain_loader_resumed_twice_at_epoch_ends_runs_to_the_end_bit_identical(tmp_path: Path) -> None:
    """A plain DataLoader (8 batches an epoch), stopped at the end of epoch 0, resumed, stopped
    at the end of epoch 1 by the resumed run, resumed again: the resumed epoch is counted as
    Lightning counts a fresh one, so the second resume neither skips nor repeats an epoch."""
    want = dict(fit(tmp_path / "straight", []).state_dict())
    path: str | None = None
    for n, stop in enumerate((8, 16)):
        callback = RepoCheckpoint(tmp_path / "repo", every_n_steps=8, branch="pl")
        with pytest.raises(Interrupt):
            fit(tmp_path / f"run{n}", [callback, StopAt(stop)], ckpt_path=path)
        path = callback.checkout("pl", tmp_path / "resume" / f"step{stop}.ckpt")
        callback.close()
    resumed_cb = RepoCheckpoint(tmp_path / "repo", every_n_steps=8, branch="pl")
    got = fit(tmp_path / "resumed", [resumed_cb], ckpt_path=path)
    resumed_cb.close()
    with ckptrepo.Repo.open(tmp_path / "repo") as repo:
        assert [(c.step, c.epoch) for c in repo.log("pl")] == [(24, 2), (16, 1), (8, 0)]
    assert differing(dict(got.state_dict()), want) == []


class Noisy(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Each sample with noise from torch's generator: augmentation, here in the main process."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i] + 0.1 * torch.randn(8), self.y[i]


def fit_stateful(root: Path, callbacks: list[Any], ckpt_path: str | None = None, *, workers: int = 0,
                 epochs: int = 1, max_steps: int = -1, augment: bool = False) -> Regressor:
    """Up to ``epochs`` epochs of 32 shuffled batches from a ``StatefulDataLoader``, with dropout
    (and ``augment``: noise added to each sample as it is loaded)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    pl.seed_everything(0)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(256, 8, generator=g), torch.randn(256, generator=g)
    data = Noisy(x, y) if augment else torch.utils.data.TensorDataset(x, y)
    loader = StatefulDataLoader(data, batch_size=8, shuffle=True, num_workers=workers)
    model = Regressor()
    trainer = pl.Trainer(max_epochs=epochs, max_steps=max_steps, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=str(root), callbacks=callbacks)
    trainer.fit(model, loader, ckpt_path=ckpt_path)
    assert trainer.global_step == (32 * epochs if max_steps < 0 else max_steps)
    return model


def interrupt_and_resume(tmp_path: Path, *stops: int, workers: int = 0, epochs: int = 1, augment: bool = False,
                         crash: bool = True) -> dict[str, torch.Tensor]:
    """Run to the first of ``stops`` (committing every 4 steps; ``crash``: an exception there,
    else ``max_steps``), resume from the repository's commit there with a new Trainer (and
    callback) to the next stop, and so on, then to the end; the final weights."""
    pytest.importorskip("torchdata")
    repo, branch = tmp_path / "repo", "run"
    path: str | None = None
    for n, stop in enumerate(stops):
        callback = RepoCheckpoint(repo, every_n_steps=4, branch=branch)
        root = tmp_path / f"run{n}"
        if crash:
            with pytest.raises(Interrupt):
                fit_stateful(root, [callback, StopAt(stop)], path, workers=workers, epochs=epochs, augment=augment)
        else:
            fit_stateful(root, [callback], path, workers=workers, epochs=epochs, augment=augment, max_steps=stop)
        path = callback.checkout(branch, tmp_path / "resume" / f"step{stop}.ckpt")
        callback.close()
        assert path is not None
    resumed_cb = RepoCheckpoint(repo, every_n_steps=4, branch=branch)
    got = fit_stateful(tmp_path / "resumed", [resumed_cb], path, workers=workers, epochs=epochs, augment=augment)
    resumed_cb.close()
    with ckptrepo.Repo.open(repo) as r:
        steps = [c.step for c in r.log(branch)]
    assert steps == list(range(32 * epochs, 0, -4)), steps  # each resume committed on from its commit
    return dict(got.state_dict())


def differing(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> list[str]:
    return [name for name, w in want.items() if not torch.equal(got[name], w)]


@pytest.mark.parametrize("stop", [16, 20, 24])
def test_a_stateful_loader_with_dropout_resumes_mid_epoch_bit_identical(tmp_path: Path, stop: int) -> None:
    """Issue 45: interrupted mid-epoch (steps 16, 20, 24 of 32) and resumed from the repository,
    a run with dropout ends with the weights of the run never stopped. The resumed Trainer makes
    the loader's iterator (drawing its seed from torch's generator) after restoring the RNG
    states; they are set again once it has."""
    want = dict(fit_stateful(tmp_path / "straight", []).state_dict())
    assert differing(interrupt_and_resume(tmp_path, stop), want) == []


def test_a_run_stopped_by_max_steps_resumes_bit_identical(tmp_path: Path) -> None:
    """``Trainer(max_steps=20)`` ends at the commit of step 20; a new Trainer with the full
    length resumes from it to the uninterrupted run's weights."""
    want = dict(fit_stateful(tmp_path / "straight", []).state_dict())
    assert differing(interrupt_and_resume(tmp_path, 20, crash=False), want) == []


def test_augmentation_in_the_main_process_and_two_interruptions_resume_bit_identical(tmp_path: Path) -> None:
    """Samples drawing noise as they are loaded (``num_workers=0``), interrupted at step 12, then
    the resumed run at 28: the states are set before the first batch is fetched, and a commit
    of a resumed run resumes as exactly."""
    want = dict(fit_stateful(tmp_path / "straight", [], augment=True).state_dict())
    assert differing(interrupt_and_resume(tmp_path, 12, 28, augment=True), want) == []


@pytest.mark.parametrize("stops", [(32, 40), (48,)])
def test_a_stateful_loader_resumes_at_and_after_an_epoch_end_bit_identical(tmp_path: Path,
                                                                           stops: tuple[int, ...]) -> None:
    """Two epochs, with augmentation: stopped exactly at the first epoch's last batch (step 32:
    the resumed iterator is spent, and the next epoch's must be made from the committed RNG
    states, not counted as an empty epoch), then again in the resumed run (step 40: its epoch
    counted as Lightning counts it, so that this resume restarts mid-epoch too); or once, mid-way
    through the second epoch (step 48)."""
    want = dict(fit_stateful(tmp_path / "straight", [], epochs=2, augment=True).state_dict())
    assert differing(interrupt_and_resume(tmp_path, *stops, epochs=2, augment=True), want) == []


@pytest.mark.parametrize("stop", [20, 32])
def test_a_checkpoint_without_the_commit_mark_resumes_bit_identical(tmp_path: Path, stop: int) -> None:
    """A commit made before RepoCheckpoint marked its own (or Lightning's ModelCheckpoint saving
    at a batch's end, with RepoCheckpoint's RNG states in it): Lightning's restart stage says
    the checkpoint was made at a batch's end, and the resume is as exact."""
    pytest.importorskip("torchdata")
    want = dict(fit_stateful(tmp_path / "straight", [], epochs=2).state_dict())
    callback = RepoCheckpoint(tmp_path / "repo", every_n_steps=4, branch="run")
    with pytest.raises(Interrupt):
        fit_stateful(tmp_path / "run", [callback, StopAt(stop)], epochs=2)
    path = callback.checkout("run", tmp_path / "resume.ckpt")
    callback.close()
    assert path is not None
    checkpoint = torch.load(path, weights_only=False)
    assert [state.pop("at") for state in checkpoint["callbacks"].values()] == ["train_batch_end"]
    torch.save(checkpoint, path)
    got = fit_stateful(tmp_path / "resumed", [RepoCheckpoint(tmp_path / "repo2", every_n_steps=100)], path, epochs=2)
    assert differing(dict(got.state_dict()), want) == []


@pytest.mark.parametrize("stop", [20, pytest.param(32, marks=pytest.mark.slow)])
def test_a_stateful_loader_with_workers_resumes_bit_identical(tmp_path: Path, stop: int) -> None:
    """As above, with ``num_workers=2`` (the loader's workers restart from its saved state)."""
    want = dict(fit_stateful(tmp_path / "straight", [], workers=2, epochs=2).state_dict())
    assert differing(interrupt_and_resume(tmp_path, stop, workers=2, epochs=2), want) == []


def test_without_lightnings_data_fetcher_a_resume_at_an_epoch_end_warns(tmp_path: Path) -> None:
    """A Lightning without ``fit_loop._data_fetcher``: the RNG states are set again and a
    warning says the next epoch's iterator could not be made; nothing raises."""
    from types import SimpleNamespace

    from ckptrepo.training import capture_rng

    callback = RepoCheckpoint(tmp_path / "repo")
    saved = {"rng": capture_rng(), "at": "train_batch_end"}
    callback.on_load_checkpoint(None, None, {"loops": {"fit_loop": {"state_dict": {"combined_loader": [{}]}}}})
    callback.load_state_dict(saved)
    drawn = torch.rand(3)
    loop = SimpleNamespace(done=False, epoch_loop=SimpleNamespace(batch_progress=SimpleNamespace(is_last_batch=True)))
    with pytest.warns(UserWarning, match="_data_fetcher"):
        callback.on_train_start(SimpleNamespace(fit_loop=loop), None)
    assert torch.equal(torch.rand(3), drawn)  # the committed states were set again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        callback.on_train_start(SimpleNamespace(fit_loop=loop), None)  # once per resume
    callback.close()


def test_checkout_of_the_callbacks_empty_branch_is_none_and_starts_afresh(tmp_path: Path) -> None:
    """Issue 45 item 7: the README's one-liner on a first run. ``checkout`` of the callback's own
    branch without a commit returns None (no file), and ``ckpt_path=None`` trains from scratch;
    any other unknown revision still raises UnknownRevision."""
    straight = fit(tmp_path / "straight", [])
    callback = RepoCheckpoint(tmp_path / "repo", every_n_steps=8, branch="pl")
    with pytest.raises(UnknownRevision):
        callback.checkout("other", tmp_path / "other.ckpt")
    assert callback.checkout("pl", tmp_path / "resume" / "last.ckpt") is None
    assert not (tmp_path / "resume").exists()
    got = fit(tmp_path / "run", [callback], ckpt_path=callback.checkout("pl", tmp_path / "resume" / "last.ckpt"))
    assert differing(dict(got.state_dict()), dict(straight.state_dict())) == []
    assert callback.checkout("pl", tmp_path / "resume" / "last.ckpt") == str(tmp_path / "resume" / "last.ckpt")
    with pytest.raises(UnknownRevision):
        callback.checkout("pl~9", tmp_path / "old.ckpt")
    callback.close()
    default = RepoCheckpoint(tmp_path / "fresh")  # no branch: the repository's current one
    assert default.checkout("main", tmp_path / "fresh.ckpt") is None
    with pytest.raises(UnknownRevision):
        default.checkout("pl", tmp_path / "fresh.ckpt")
    default.close()


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
