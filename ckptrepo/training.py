"""Commit from a training loop and resume it exactly: ``Checkpointer``.

What a commit holds (the keys present depend on what was given)::

    {"model": ..., "optimizer": ..., "scheduler": ..., "dataloader": ...,  # their state_dict()
     "extra": {name: obj.state_dict()},
     "rng": {"python": ..., "numpy": ..., "torch": ..., "cuda": [...]}}

An exact resume needs every source of randomness and the data position: the RNG states of
python's ``random``, numpy's global generator, torch's CPU generator and every CUDA device's,
and a data loader that can resume mid-epoch (``torchdata.stateful_dataloader.StatefulDataLoader``
restores its sampler and workers at the next batch). A plain ``DataLoader`` has no state: it is
left out with a warning, and a resume starts its epoch over.

Commits are two-phase: ``after_step`` blocks only for the copy of the state; the commit becomes
durable in the background while training goes on, and a background failure is raised by the
next ``after_step`` or by ``close``. One process only for now: on several ranks of a process
group the Checkpointer refuses to start (use ``repo.commit(..., group=...)`` or ``ckptrepo.dcp``).
"""

from __future__ import annotations

import random
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from ckptrepo.errors import NotARepository, UnknownRevision, UsageError
from ckptrepo.ingest.handle import CommitHandle
from ckptrepo.policy import Every, Policy
from ckptrepo.repository import Repo
from ckptrepo.types import Commit

__all__ = ["Checkpointer", "CommitStream", "capture_rng", "native_rng", "open_or_init", "restore_rng"]


def capture_rng() -> dict[str, Any]:
    """The state of every random number generator a training loop draws from, as tensors and JSON values."""
    import numpy as np
    import torch

    version, words, gauss = random.getstate()
    out: dict[str, Any] = {
        "python": {"version": version, "words": torch.tensor(words, dtype=torch.int64), "gauss": gauss},
        "torch": torch.get_rng_state(),
    }
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    out["numpy"] = {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
                    "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    if torch.cuda.is_available():
        out["cuda"] = list(torch.cuda.get_rng_state_all())
    return out


def native_rng(state: Mapping[str, Any]) -> dict[str, Any]:
    """``capture_rng``'s record in the shapes the generators take back: ``"python"`` as
    ``random.getstate()`` gives it, ``"numpy"`` as ``np.random.get_state()``, ``"torch"`` and
    ``"cuda"`` as torch's (byte tensors); generators not recorded are absent."""
    out: dict[str, Any] = {}
    if "python" in state:
        py = state["python"]
        out["python"] = (int(py["version"]), tuple(int(w) for w in py["words"].tolist()), py["gauss"])
    if "numpy" in state:
        import numpy as np

        n = state["numpy"]
        out["numpy"] = (n["kind"], n["keys"].numpy().astype(np.uint32), int(n["pos"]), int(n["has_gauss"]),
                        float(n["cached_gaussian"]))
    if "torch" in state:
        out["torch"] = state["torch"]
    if "cuda" in state:
        out["cuda"] = list(state["cuda"])
    return out


def restore_rng(state: Mapping[str, Any]) -> None:
    """Set every generator ``capture_rng`` recorded; generators it did not record are left alone."""
    import torch

    native = native_rng(state)
    if "python" in native:
        random.setstate(native["python"])
    if "numpy" in native:
        import numpy as np

        np.random.set_state(native["numpy"])
    if "torch" in native:
        torch.set_rng_state(native["torch"])
    if "cuda" in native and torch.cuda.is_available():
        devices = torch.cuda.device_count()
        if len(native["cuda"]) != devices:
            warnings.warn(f"the commit holds RNG states of {len(native['cuda'])} CUDA devices, this process sees "
                          f"{devices}: restoring the first {min(devices, len(native['cuda']))}", stacklevel=3)
        torch.cuda.set_rng_state_all(native["cuda"][:devices])


class CommitStream:
    """Commits from a training loop to one branch, timed by a policy.

    Holds the repository (an open ``Repo``, or a path opened or created there, then owned and
    closed by ``close``), the commits in flight and the policy. After each optimizer step the
    loop calls ``due(step)``: it raises the first failure among the commits that finished since
    (once, as ``reap`` does), gives the policy the step's time, and returns the rule that wants a
    commit now, or None; ``commit`` starts one (two-phase) and tells the policy how long it blocked; ``stepped``
    starts the next step's clock (so a step's time leaves the commit's stall out). ``flush``
    waits for every commit, then raises the first failure.
    """

    def __init__(self, repo: Repo | str | Path, *, branch: str | None = None, policy: Policy | None = None) -> None:
        self._owns_repo = not isinstance(repo, Repo)
        self.repo = repo if isinstance(repo, Repo) else open_or_init(Path(repo))
        self.branch = branch or self.repo.head
        self.policy: Policy = policy if policy is not None else Every(1000)
        self.last_rule: str | None = None
        self._handles: list[CommitHandle] = []
        self._clock: float | None = None  # when the current step began
        self._busy = False  # a commit's background phase ran while the current step did

    def reap(self) -> None:
        """Forget the commits that finished; raise the first failure among them (once)."""
        finished = [h for h in self._handles if h.done()]
        self._handles = [h for h in self._handles if h not in finished]
        for h in finished:
            h.wait()

    def due(self, step: int) -> str | None:
        now = time.perf_counter()
        self.reap()
        if self._clock is not None:
            self.policy.step(step, now - self._clock, self._busy)
        return self.policy.due(step)

    def commit(self, state: Any, step: int, rule: str, *, epoch: int | None = None,
               metrics: Mapping[str, float] | None = None, message: str | None = None,
               allow_pickle: bool = False) -> CommitHandle:
        """Start a commit of ``state`` at ``step``; ``rule`` (why) goes in the message and the config."""
        t0 = time.perf_counter()
        handle = self.repo.commit(state, branch=self.branch, step=step, epoch=epoch, metrics=metrics,
                                  message=message or f"step {step} ({rule})", config={"checkpointer": {"rule": rule}},
                                  allow_pickle=allow_pickle)
        self.policy.committed(step, time.perf_counter() - t0)
        self._handles.append(handle)
        self.last_rule = rule
        return handle

    def stepped(self) -> None:
        """The loop's step is over: the next one's clock starts now."""
        self._busy = any(not h.done() for h in self._handles)
        self._clock = time.perf_counter()

    def restart_clock(self) -> None:
        """Forget the step in progress (after a resume: the next step's time is unknown)."""
        self._clock = None

    def flush(self) -> list[Commit]:
        """Wait until every commit made so far is durable; returns them (raises a failed one's error)."""
        handles, self._handles = self._handles, []
        done: list[Commit] = []
        failure: BaseException | None = None
        for h in handles:
            try:
                done.append(h.wait())
            except Exception as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
        return done

    def close(self) -> None:
        """``flush``, then close the repository if this object opened it."""
        try:
            self.flush()
        finally:
            if self._owns_repo:
                self.repo.close()


def _stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


class Checkpointer(CommitStream):
    """Commits a training loop's state when its policy says so, and resumes it exactly.

    ``repo``: an open ``Repo`` or a path (a repository is created there if there is none; the
    Checkpointer then closes it). ``model``, ``optimizer``, ``scheduler``, ``dataloader`` and the
    values of ``extra``: objects with ``state_dict``/``load_state_dict``. ``branch``: where
    commits go and what ``resume`` reads (default: the repository's current branch).
    ``policy``: when to commit (default ``Every(1000)``; see ``ckptrepo.policy``). ``rng``:
    record and restore every RNG state.

    Use::

        with Checkpointer("runs/exp", model=model, optimizer=opt, dataloader=loader) as ckpt:
            step = ckpt.resume()
            for batch in loader:           # a StatefulDataLoader resumes at the next batch
                ...; opt.step(); step += 1
                ckpt.after_step(step, {"loss": loss.item()})
    """

    def __init__(self, repo: Repo | str | Path, *, model: Any = None, optimizer: Any = None, scheduler: Any = None,
                 dataloader: Any = None, extra: Mapping[str, Any] | None = None, branch: str | None = None,
                 policy: Policy | None = None, rng: bool = True) -> None:
        _refuse_several_ranks()
        objects = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
        for name, obj in [*objects.items(), *((f"extra[{k!r}]", v) for k, v in (extra or {}).items())]:
            if obj is not None and not _stateful(obj):
                raise UsageError(f"{name} has no state_dict()/load_state_dict(): the Checkpointer cannot save it",
                                 hint="Pass an object with both methods, or keep it out of the Checkpointer.")
        self._targets: dict[str, Any] = {k: v for k, v in objects.items() if v is not None}
        if dataloader is not None:
            if _stateful(dataloader):
                self._targets["dataloader"] = dataloader
            else:
                warnings.warn(
                    f"{type(dataloader).__name__} has no state_dict(): a resume restarts its epoch from the first "
                    "batch, with a new order. For an exact resume use "
                    "torchdata.stateful_dataloader.StatefulDataLoader (pip install torchdata).", stacklevel=2)
        if extra:
            self._targets["extra"] = dict(extra)
        if not self._targets and not rng:
            raise UsageError("nothing to checkpoint", hint="Pass a model, optimizer, ... or leave rng=True.")
        super().__init__(repo, branch=branch, policy=policy)
        self.rng = rng

    # -- resume ------------------------------------------------------------------------------

    def resume(self, rev: str | None = None) -> int:
        """Load the newest commit of the branch (or ``rev``) into every object and RNG.

        Returns that commit's step (the count of completed optimizer steps), or 0 when the
        branch has no commit yet and ``rev`` is None (nothing is loaded then).
        """
        try:
            commit = self.repo.get_commit(rev if rev is not None else self.branch)
        except UnknownRevision:
            if rev is not None:
                raise
            return 0
        restored = self.repo.checkout(commit.id)
        from ckptrepo.state import load_into

        load_into(self._targets, restored)
        if "dataloader" in self._targets:
            # A loader makes its next iterator from the loaded state when asked for its state (so
            # StatefulDataLoader does), drawing seeds from torch's generator; done here, before the
            # generators are restored, the loop's `for batch in loader` takes that iterator as is.
            self._targets["dataloader"].state_dict()
        if self.rng:
            if "rng" not in restored:
                raise UsageError(f"commit {commit.id[:12]} holds no RNG states, so the resume cannot be exact",
                                 hint="Resume with Checkpointer(..., rng=False) to accept that.")
            restore_rng(restored["rng"])
        self.restart_clock()
        return commit.step or 0

    # -- commit --------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What a commit stores now (live objects; the commit copies their state)."""
        out = dict(self._targets)
        if self.rng:
            out["rng"] = capture_rng()
        return out

    def after_step(self, step: int, metrics: Mapping[str, float] | None = None, *,
                   epoch: int | None = None) -> CommitHandle | None:
        """Call after every optimizer step with the count of completed steps; commits if the policy says so.

        Returns the commit's handle when it committed (durable later; ``close`` waits), else None.
        Raises the error of an earlier commit that failed in the background.
        """
        rule = self.due(step)
        handle = self.commit_now(step, metrics, epoch=epoch, rule=rule) if rule is not None else None
        self.stepped()
        return handle

    def commit_now(self, step: int, metrics: Mapping[str, float] | None = None, *, epoch: int | None = None,
                   rule: str = "explicit") -> CommitHandle:
        """Commit now, whatever the policy; ``rule`` names why (recorded in the message and config)."""
        return self.commit(self.state(), step, rule, epoch=epoch, metrics=metrics)

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def open_or_init(path: Path) -> Repo:
    """The repository at ``path``, created there if there is none."""
    try:
        return Repo.open(path)
    except NotARepository:
        return Repo.init(path)


def _refuse_several_ranks() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        raise UsageError("the Checkpointer runs in one process; this one is a rank of a process group",
                         hint="On several ranks, commit with repo.commit(state, group=...) or ckptrepo.dcp.Writer.")
