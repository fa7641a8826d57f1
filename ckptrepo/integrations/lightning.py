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
On a first run (the callback's branch has no commit yet) ``checkout`` returns None, so the same
line starts afresh. A checkpoint value that is not a tensor or JSON (some ``hyper_parameters``)
is refused with the key path named, unless ``allow_pickle=True``.

Exact resume (the weights bit-identical to a run never stopped) from a commit mid-epoch needs a
loader that keeps its position (``torchdata.stateful_dataloader.StatefulDataLoader``; Lightning
saves and restores it), and the RNG states this callback saves. The interrupted run made its
epoch's loader iterator before the commit, and making one draws from torch's generator (its
base seed; torch's ``RandomSampler`` its seed too): the committed states come after those draws.
Lightning restores the states (``load_state_dict``) before it makes the resumed run's iterator,
which draws again, so ``on_train_start`` (after that, before the first batch is fetched) sets
them again: dropout, augmentation in the main process and the like then draw what the run never
stopped would have. After a commit at an epoch's last batch the resumed iterator is spent, and
Lightning would count the next epoch as an empty one, without its ``on_train_epoch_start``
hooks, and count epochs so that a later resume stops early: ``on_train_start`` makes the next
epoch's iterator, from the committed states (as the interrupted run made it, after the commit),
and tells the fit loop to start that epoch as a fresh one (``fit_loop.reset_restart_stage()``).
Making that iterator needs Lightning's private ``fit_loop._data_fetcher``: a Lightning without it
(or without ``reset_restart_stage``) gets a warning that the resume is not exact, not an error.

Not exact: a plain ``DataLoader`` resumed mid-epoch (it starts the epoch again; Lightning warns);
randomness inside loader workers (they are seeded again from the epoch's seed); after a commit at
an epoch's last batch, an ``on_train_epoch_start`` hook that draws random numbers or changes the
data (the resumed run makes the iterator before that hook, the interrupted one after it); a
validation due at the committed step, which the interrupted run ran after the commit and
Lightning does not run again (its logged values, and any random numbers it drew, are missing).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from ckptrepo.atomic import atomic_output
from ckptrepo.integrations._resume import first_run
from ckptrepo.policy import Every, Policy
from ckptrepo.repository import Repo
from ckptrepo.training import CommitStream, capture_rng, config_files, restore_rng

__all__ = ["RepoCheckpoint"]


class RepoCheckpoint(Callback):
    """Commit Lightning's checkpoint to ``repo`` (an open ``Repo`` or a path; created if missing).

    ``every_n_steps`` (default 1000) or ``policy`` choose the optimizer steps after which to
    commit; ``branch``: where commits go (default: the repository's current branch).
    ``allow_pickle``: commit (and check out) checkpoint values that are neither tensors nor JSON.
    ``model_config`` (a dict or a transformers config) and ``files`` (relative path -> bytes or a
    path): kept by every commit as files (``training.config_files``), so that ``repo.export(rev,
    DIR, format="hf")`` writes the ``state_dict`` as a model folder.
    """

    def __init__(self, repo: Repo | str | Path, *, every_n_steps: int | None = None, policy: Policy | None = None,
                 branch: str | None = None, allow_pickle: bool = False, model_config: Any = None,
                 files: Mapping[str, Any] | None = None) -> None:
        if every_n_steps is not None and policy is not None:
            raise ValueError("give every_n_steps or policy, not both")
        self.stream = CommitStream(repo, branch=branch, policy=policy or Every(every_n_steps or 1000))
        self.allow_pickle = allow_pickle
        self.files = config_files(model_config, files)
        self._last_step = -1
        self._committing = False  # dump_checkpoint runs for this callback's commit (at a batch's end)
        self._forget_resume()

    def _forget_resume(self) -> None:
        self._resumed_rng: dict[str, Any] | None = None  # the RNG states a resume restored
        self._at_batch_end = False  # ... from a checkpoint made at a training batch's end
        self._loader_resumes = False  # ... that holds the train loader's position

    @property
    def repo(self) -> Repo:
        return self.stream.repo

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        # Before Lightning restores a checkpoint: nothing is left from an earlier fit that failed.
        self._forget_resume()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = int(trainer.global_step)
        if step == self._last_step:  # gradient accumulation: no optimizer step in this batch
            return
        self._last_step = step
        rule = self.stream.due(step)
        if rule is not None and trainer.is_global_zero:
            started = time.perf_counter()
            self._committing = True
            try:
                checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
            finally:
                self._committing = False
            metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if _scalar(v)}
            self.stream.commit(checkpoint, step, rule, epoch=int(trainer.current_epoch), metrics=metrics or None,
                               allow_pickle=self.allow_pickle, started=started, files=self.files or None)
        self.stream.stepped()

    def state_dict(self) -> dict[str, Any]:
        """Saved in Lightning's checkpoint: the RNG states at that moment, which Lightning does not
        keep, and (``"at": "train_batch_end"``) whether this callback's own commit made it."""
        state: dict[str, Any] = {"rng": capture_rng()}
        if self._committing:
            state["at"] = "train_batch_end"
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the RNG states now (before Lightning makes the data loader's iterator: right
        for a resume at an epoch's start), and keep them for ``on_train_start``."""
        if "rng" in state_dict:
            restore_rng(state_dict["rng"])
            self._resumed_rng = state_dict["rng"]
            self._at_batch_end = state_dict.get("at") == "train_batch_end"

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        # Called before load_state_dict. Lightning restores a loader's position when the checkpoint holds it.
        fit_loop = _get(_get(checkpoint, "loops"), "fit_loop")
        self._loader_resumes = bool(_get(_get(fit_loop, "state_dict"), "combined_loader"))

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Finish an exact resume from a commit made at a batch's end, with a loader that resumed
        its position: Lightning has made the loader's iterator (drawing from torch's generator)
        since the RNG states were restored; they are set again, before the first batch is
        fetched. After an epoch's last batch, the resumed iterator is spent: the next epoch's is
        made now, from the committed states, as the interrupted run made it after the commit,
        and the fit loop starts that epoch as a fresh one. Nothing happens on a fit that did not
        resume from such a commit; a Lightning without the loop internals this needs gets a
        warning, never an error."""
        rng, at_batch_end, loader_resumes = self._resumed_rng, self._at_batch_end, self._loader_resumes
        self._forget_resume()
        loop = trainer.fit_loop
        if not at_batch_end:  # a checkpoint this callback did not commit (older commits, ModelCheckpoint)
            at_batch_end = bool(getattr(loop.epoch_loop, "restarted_on_train_batch_end", False))
        if rng is None or not at_batch_end:
            return
        if loader_resumes:
            restore_rng(rng)
        if not loop.epoch_loop.batch_progress.is_last_batch or loop.done:
            return
        # After the epoch's last batch. A plain loader's iterator, made since, starts the next epoch.
        fetcher = getattr(loop, "_data_fetcher", None) if loader_resumes else None
        restart_afresh = getattr(loop, "reset_restart_stage", None)
        if (loader_resumes and fetcher is None) or not callable(restart_afresh):
            warnings.warn(
                "resuming from a commit at the last batch of an epoch: this Lightning version has no "
                "fit_loop._data_fetcher or fit_loop.reset_restart_stage(), which RepoCheckpoint uses to start "
                "the next epoch (its data loader iterator, its hooks and its count). The run does not continue "
                "exactly as it would have: resume from a commit made mid-epoch, or use a Lightning version that "
                "has them (2.6 does).", stacklevel=2)
            return
        restart_afresh()  # the next epoch starts as a fresh one: on_train_epoch_start, its progress counted
        if fetcher is not None:
            iter(fetcher)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.wait()

    def wait(self) -> None:
        """Block until every commit made so far is durable (raises a failed one's error)."""
        self.stream.flush()

    def close(self) -> None:
        """``wait``, then close the repository if this callback opened it."""
        self.stream.close()

    def checkout(self, rev: str, path: str | Path) -> str | None:
        """Write commit ``rev`` as a Lightning checkpoint file at ``path`` (atomically; parent
        folders created) and return its path, for ``trainer.fit(..., ckpt_path=)``.

        Waits for this callback's commits first. Returns None, writing nothing, when ``rev`` is
        this callback's own branch and it has no commit yet (a first run: ``ckpt_path=None``
        starts afresh). Raises UnknownRevision for any other revision that names no commit, and
        UsageError for a commit RepoCheckpoint did not make.
        """
        import torch

        self.wait()
        if first_run(self.stream, rev):
            return None
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


def _get(mapping: Any, key: str) -> Any:
    return mapping.get(key) if isinstance(mapping, Mapping) else None


def _scalar(value: Any) -> bool:
    try:
        number = float(value)
    except (TypeError, ValueError, RuntimeError):
        return False
    return math.isfinite(number)
