"""PyTorch Lightning: a callback that commits the Trainer's full checkpoint every N steps, and resume.

``RepoCheckpoint(repo, every_n_steps=N)`` (or ``policy=``, see ``ckptrepo.policy``) commits,
after the optimizer steps it chooses, the checkpoint Lightning itself would write (weights,
optimizers, schedulers, loop progress, callback states, precision state), with the step, the
epoch and the logged values (``trainer.callback_metrics``) as metrics. Commits are two-phase:
training goes on while they become durable; ``on_train_end`` waits for them. Only global rank 0
commits (Lightning's data-parallel strategies hold the same state on every rank) and only it
opens a repository given as a path, at its first commit; as with Lightning's own checkpoints,
a resume gives every rank rank 0's RNG states.

To resume, ``RepoCheckpoint.checkout(rev, path)`` writes the commit as a Lightning ``.ckpt``
file; ``trainer.fit(model, ckpt_path=path)`` restores everything and continues from that step.
A checkpoint value that is not a tensor or JSON (some ``hyper_parameters``) is refused with the
key path named, unless ``allow_pickle=True``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from ckptrepo.atomic import atomic_output
from ckptrepo.policy import Every, Policy
from ckptrepo.repository import Repo
from ckptrepo.training import CommitStream, capture_rng, restore_rng

__all__ = ["RepoCheckpoint"]


class RepoCheckpoint(Callback):
    """Commit Lightning's checkpoint to ``repo`` (an open ``Repo`` or a path; created if missing).

    ``every_n_steps`` (default 1000) or ``policy`` choose the optimizer steps after which to
    commit; ``branch``: where commits go (default: the repository's current branch).
    """

    def __init__(self, repo: Repo | str | Path, *, every_n_steps: int | None = None, policy: Policy | None = None,
                 branch: str | None = None, allow_pickle: bool = False) -> None:
        if every_n_steps is not None and policy is not None:
            raise ValueError("give every_n_steps or policy, not both")
        self.stream = CommitStream(repo, branch=branch, policy=policy or Every(every_n_steps or 1000))
        self.allow_pickle = allow_pickle
        self._last_step = -1

    @property
    def repo(self) -> Repo:
        return self.stream.repo

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = int(trainer.global_step)
        if step == self._last_step:  # gradient accumulation: no optimizer step in this batch
            return
        self._last_step = step
        rule = self.stream.due(step)
        if rule is not None and trainer.is_global_zero:
            started = time.perf_counter()
            checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
            metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if _scalar(v)}
            self.stream.commit(checkpoint, step, rule, epoch=int(trainer.current_epoch), metrics=metrics or None,
                               allow_pickle=self.allow_pickle, started=started)
        self.stream.stepped()

    def state_dict(self) -> dict[str, Any]:
        """Saved in Lightning's checkpoint: the RNG states at that moment, which Lightning does not keep."""
        return {"rng": capture_rng()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "rng" in state_dict:
            restore_rng(state_dict["rng"])

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.wait()

    def wait(self) -> None:
        """Block until every commit made so far is durable (raises a failed one's error)."""
        self.stream.flush()

    def close(self) -> None:
        """``wait``, then close the repository if this callback opened it."""
        self.stream.close()

    def checkout(self, rev: str, path: str | Path) -> str:
        """Write commit ``rev`` as a Lightning checkpoint file at ``path``; returns it for ``ckpt_path=``."""
        import torch

        self.wait()
        state = self.repo.checkout(rev, allow_pickle=self.allow_pickle)
        if not isinstance(state, dict) or "loops" not in state or "state_dict" not in state:
            from ckptrepo.errors import UsageError

            raise UsageError(f"{rev} is not a Lightning checkpoint committed by RepoCheckpoint",
                             hint="Resume from a commit RepoCheckpoint made.")
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_output(out) as tmp:
            torch.save(state, tmp)
        return str(out)


def _scalar(value: Any) -> bool:
    try:
        number = float(value)
    except (TypeError, ValueError, RuntimeError):
        return False
    return math.isfinite(number)
