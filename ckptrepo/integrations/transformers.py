"""Hugging Face Transformers: a ``Trainer`` callback that commits every checkpoint it saves, and resume.

``RepoCallback(repo)`` commits, at each of the Trainer's save steps, what an exact resume needs:
the model's weights, the optimizer's and scheduler's state, every RNG state and the Trainer's
state (``trainer_state.json`` as JSON), with the step, the completed epochs and the metrics
logged at that step. Commits are two-phase: training goes on while they become durable, and
``on_train_end`` waits for them. On several processes only the main one commits (the Trainer's
data-parallel replicas hold the same state) and only it opens a repository given as a path,
at its first commit (the others touch it only to ``checkout``).

To resume, ``RepoCallback.checkout(rev, folder)`` writes the commit as a Trainer checkpoint
folder (``model.safetensors``, ``optimizer.pt``, ``scheduler.pt``, ``rng_state.pth``,
``trainer_state.json``); ``trainer.train(resume_from_checkpoint=folder)`` then restores
everything and skips the batches already seen, as from its own checkpoint. On a first run (the
callback's branch has no commit yet) ``checkout`` returns None, so the same line starts afresh.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from ckptrepo.atomic import atomic_output, write_atomic
from ckptrepo.formats.run_meta import logged_at
from ckptrepo.integrations._resume import first_run
from ckptrepo.repository import Repo
from ckptrepo.training import CommitStream, capture_rng, native_rng

__all__ = ["RepoCallback"]


class RepoCallback(TrainerCallback):
    """Commit each checkpoint the ``Trainer`` saves to ``repo`` (an open ``Repo`` or a path; created if missing),
    with the files saved beside its weights (config, tokenizer files), so that ``repo.export(rev,
    DIR, format="hf")`` writes a folder ``from_pretrained`` loads.

    ``branch``: where the commits go (default: the repository's current branch).
    """

    def __init__(self, repo: Repo | str | Path, *, branch: str | None = None) -> None:
        self.stream = CommitStream(repo, branch=branch)

    @property
    def repo(self) -> Repo:
        return self.stream.repo

    def on_save(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                lr_scheduler: Any = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or model is None:
            return
        self.stream.reap()
        trainer_state = json.loads(json.dumps(dataclasses.asdict(state)))  # as trainer_state.json holds it
        snapshot: dict[str, Any] = {"model": model.state_dict(), "rng": capture_rng(), "trainer_state": trainer_state}
        if optimizer is not None:
            snapshot["optimizer"] = optimizer.state_dict()
        if lr_scheduler is not None:
            snapshot["scheduler"] = lr_scheduler.state_dict()
        step = int(state.global_step)
        self.stream.commit(snapshot, step, "trainer save", epoch=math.floor(state.epoch or 0),
                           metrics=logged_at(trainer_state.get("log_history") or [], step) or None,
                           message=f"checkpoint-{step}", files=_saved_files(args, step, model))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.wait()

    def wait(self) -> None:
        """Block until every commit made so far is durable (raises a failed one's error)."""
        self.stream.flush()

    def close(self) -> None:
        """``wait``, then close the repository if this callback opened it."""
        self.stream.close()

    def checkout(self, rev: str, folder: str | Path) -> str | None:
        """Write commit ``rev`` as a Trainer checkpoint folder at ``folder`` (created if missing;
        each file written atomically) and return its path, for
        ``trainer.train(resume_from_checkpoint=...)``.

        Waits for this callback's commits first. Returns None, writing nothing, when ``rev`` is
        this callback's own branch and it has no commit yet (a first run:
        ``resume_from_checkpoint=None`` starts afresh). Raises UnknownRevision for any other
        revision that names no commit, and UsageError for a commit RepoCallback did not make.
        """
        import torch
        from safetensors.torch import save_file

        self.wait()
        if first_run(self.stream, rev):
            return None
        state = self.repo.checkout(rev)
        if "trainer_state" not in state:
            raise _not_a_trainer_commit(rev)
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        weights = {k: v.contiguous().clone() for k, v in state["model"].items()}  # ties written as copies
        with atomic_output(out / "model.safetensors") as tmp:
            save_file(weights, str(tmp), metadata={"format": "pt"})
        for key, name in (("optimizer", "optimizer.pt"), ("scheduler", "scheduler.pt")):
            if key in state:
                with atomic_output(out / name) as tmp:
                    torch.save(state[key], tmp)
        rng = native_rng(state["rng"])  # the Trainer's own rng_state.pth names torch's CPU state "cpu"
        rng["cpu"] = rng.pop("torch")
        with atomic_output(out / "rng_state.pth") as tmp:
            torch.save(rng, tmp)
        write_atomic(out / "trainer_state.json",
                     (json.dumps(state["trainer_state"], indent=2, sort_keys=True) + "\n").encode())
        return str(out)


def _saved_files(args: Any, step: int, model: Any) -> dict[str, Any]:
    """The files the Trainer saved beside the weights of checkpoint ``step`` (config, generation
    config, tokenizer files ...: ``formats.files.scan_folder``, no code, pickles or weights), so
    that the commit exports as a model folder (``Repo.export(format="hf")``); the model's config
    alone when that folder is not there."""
    from ckptrepo.formats.files import scan_folder
    from ckptrepo.training import config_files

    folder = Path(getattr(args, "output_dir", None) or ".") / f"checkpoint-{step}"
    if folder.is_dir():
        return dict(scan_folder(folder).kept)
    config = getattr(model, "config", None)
    return config_files(config) if config is not None and hasattr(config, "to_json_string") else {}


def _not_a_trainer_commit(rev: str) -> Exception:
    from ckptrepo.errors import UsageError

    return UsageError(f"{rev} was not committed by RepoCallback (it holds no trainer_state)",
                      hint="Resume a Trainer from a commit its RepoCallback made.")
