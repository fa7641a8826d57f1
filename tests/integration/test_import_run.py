"""Existing runs in: a Trainer's checkpoint-N folders become a lineage with steps, epochs and metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

import ckptrepo
from ckptrepo import errors
from ckptrepo.cli.app import app
from ckptrepo.formats import run_checkpoints, run_meta


def trainer_checkpoint(root: Path, step: int, epoch: float, loss: float, eval_loss: float | None = None) -> Path:
    """A folder shaped like a Hugging Face Trainer checkpoint: weights and trainer_state.json."""
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    save_file({"w": torch.full((8, 8), float(step)), "b": torch.zeros(8)}, str(folder / "model.safetensors"))
    history: list[dict[str, object]] = [{"loss": 9.0, "step": step - 1, "epoch": epoch},
                                        {"loss": loss, "grad_norm": 0.5, "learning_rate": 1e-4, "step": step,
                                         "epoch": epoch}]
    if eval_loss is not None:
        history.append({"eval_loss": eval_loss, "eval_runtime": 1.5, "step": step, "epoch": epoch, "note": "x"})
    (folder / "trainer_state.json").write_text(json.dumps(
        {"global_step": step, "epoch": epoch, "log_history": history, "best_metric": None}))
    return folder


def test_run_meta_reads_the_step_epoch_and_the_metrics_logged_at_that_step(tmp_path: Path) -> None:
    folder = trainer_checkpoint(tmp_path, 500, 1.75, 0.25, eval_loss=0.5)
    assert run_meta(folder) == {"step": 500, "epoch": 1, "metrics": {
        "loss": 0.25, "grad_norm": 0.5, "learning_rate": 1e-4, "eval_loss": 0.5, "eval_runtime": 1.5}}
    assert run_meta(folder / "model.safetensors") == {}  # a file: nothing beside it is read
    (folder / "trainer_state.json").write_text("{not json")
    with pytest.raises(errors.InvalidInput, match="not readable JSON"):
        run_meta(folder)
    (folder / "trainer_state.json").write_text(json.dumps({"epoch": 1}))
    with pytest.raises(errors.InvalidInput, match="global_step"):
        run_meta(folder)


def test_checkpoint_folders_are_in_step_order(tmp_path: Path) -> None:
    for step in (1000, 20, 300):
        trainer_checkpoint(tmp_path, step, 0.0, 1.0)
    (tmp_path / "checkpoint-final").mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "stray.ckpt").write_bytes(b"")  # folders first: files are not read
    found, left = run_checkpoints(tmp_path, lambda p: pytest.fail("no file is read"))
    assert [p.name for p in found] == ["checkpoint-20", "checkpoint-300", "checkpoint-1000"] and left == []
    with pytest.raises(errors.InvalidInput, match="no checkpoint-N folders"):
        run_checkpoints(tmp_path / "runs", lambda p: None)


def test_commit_file_takes_what_the_run_recorded_unless_given(tmp_path: Path) -> None:
    folder = trainer_checkpoint(tmp_path / "out", 40, 2.0, 0.125)
    with ckptrepo.Repo.init(tmp_path / "repo") as repo:
        recorded = repo.commit_file(folder)
        assert (recorded.step, recorded.epoch, recorded.metrics["loss"]) == (40, 2, 0.125)
        given = repo.commit_file(folder, step=7, metrics={"acc": 1.0})
        assert (given.step, given.epoch, given.metrics) == (7, 2, {"acc": 1.0})


def test_import_run_makes_one_commit_per_checkpoint_in_step_order(tmp_path: Path) -> None:
    out = tmp_path / "trainer-out"
    for step, loss in [(300, 0.5), (100, 2.0), (200, 1.0)]:
        trainer_checkpoint(out, step, step / 100, loss, eval_loss=loss * 2)
    runner = CliRunner()
    repo_dir = tmp_path / "repo"
    assert runner.invoke(app, ["--repo", str(repo_dir), "init"]).exit_code == 0
    result = runner.invoke(app, ["--repo", str(repo_dir), "import-run", str(out), "-b", "ft", "--json"])
    assert result.exit_code == 0, result.output
    done = json.loads(result.stdout)
    assert [c["step"] for c in done] == [100, 200, 300]
    with ckptrepo.Repo.open(repo_dir) as repo:
        log = repo.log("ft")
        assert [(c.step, c.epoch, c.metrics["eval_loss"]) for c in log] == [(300, 3, 1.0), (200, 2, 2.0), (100, 1, 4.0)]
        assert [c.message for c in log] == ["checkpoint-300", "checkpoint-200", "checkpoint-100"]
        assert log[0].parents[0].id == log[1].id and log[1].parents[0].id == log[2].id
        assert torch.equal(repo.checkout("ft~1")["w"], torch.full((8, 8), 200.0))
    missing = runner.invoke(app, ["--repo", str(repo_dir), "import-run", str(tmp_path / "repo")])
    assert missing.exit_code == 2 and "no checkpoint-N folders" in missing.output


def test_lightning_meta_reads_a_loaded_checkpoint() -> None:
    from ckptrepo.formats import lightning_meta

    ckpt = {"pytorch-lightning_version": "2.6.6", "global_step": 120, "epoch": 3, "state_dict": {},
            "callbacks": {"ModelCheckpoint{'monitor': 'val_loss'}": {"monitor": "val_loss",
                                                                     "current_score": torch.tensor(0.25)},
                          "EarlyStopping": {"wait_count": 1}, "other": {"monitor": None, "current_score": 1.0}}}
    assert lightning_meta(ckpt) == {"step": 120, "epoch": 3, "metrics": {"val_loss": 0.25}}
    assert lightning_meta({"global_step": 5}) == {}  # not a Lightning checkpoint
    assert lightning_meta({"loops": {}, "global_step": "x"}) == {}


def test_a_broken_trainer_state_changes_nothing(tmp_path: Path) -> None:
    good = trainer_checkpoint(tmp_path / "out", 10, 1.0, 0.5)
    bad = trainer_checkpoint(tmp_path / "out", 20, 2.0, 0.25)
    (bad / "trainer_state.json").write_text("{not json")
    with ckptrepo.Repo.init(tmp_path / "repo") as repo:
        first = repo.commit_file(good)
        before = repo.stats()
        with pytest.raises(errors.InvalidInput, match="not readable JSON"):
            repo.commit_file(bad)
        assert [c.id for c in repo.log("main")] == [first.id]
        after = repo.stats()
        assert (after.commits, after.pack_bytes) == (before.commits, before.pack_bytes)
    runner = CliRunner()
    result = runner.invoke(app, ["--repo", str(tmp_path / "repo"), "import-run", str(tmp_path / "out"), "-b", "x"])
    assert result.exit_code == 2 and "checkpoint-20" in result.output
    with ckptrepo.Repo.open(tmp_path / "repo") as repo:  # the input before the broken one stays
        assert [c.step for c in repo.log("x")] == [10]
