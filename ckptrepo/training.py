"""Commit from a training loop and resume it exactly: ``Checkpointer``.

What a commit holds (the keys present depend on what was given)::

    {"model": ..., "optimizer": ...,          # by parameter name (DCP's get_state_dict)
     "scheduler": ..., "extra": {name: ...},  # their state_dict()
     "dataloader": ..., "sampler_epoch": 3,   # this process's data position
     "rng": {"python": ..., "numpy": ..., "torch": ..., "cuda": [...]}}

On several ranks the last three are each rank's own, under ``"ranks": {"0": {...}, "1": {...}}``,
and the model and optimizer are saved as the ranks hold them (DDP's replicas once, FSDP2's
shards); the commit records its world size. A resume at the same world size gives every rank
its own data position and RNG states back; at another size, the model and optimizer are
resharded and the per-rank states are left (with a warning: the run cannot continue exactly).

An exact resume needs every source of randomness and the data position: the RNG states of
python's ``random``, numpy's global generator, torch's CPU generator and every CUDA device's,
and a data loader that can resume mid-epoch (``torchdata.stateful_dataloader.StatefulDataLoader``
restores its sampler and workers at the next batch). A plain ``DataLoader`` has no state: it is
left out with a warning, and a resume starts its epoch over.

Commits are two-phase: ``after_step`` blocks only for the copy of the state; the commit becomes
durable in the background while training goes on, and a background failure is raised by the
next ``after_step`` or by ``close``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import random
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from ckptrepo.entries import join_path
from ckptrepo.errors import (
    CommitDamaged,
    CommitPruned,
    IntegrityError,
    NotARepository,
    RepositoryExists,
    StorageError,
    UnknownRevision,
    UsageError,
)
from ckptrepo.handle import CommitHandle
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

    With ``group`` (a process group), every rank of it runs one stream and each commit is one
    commit of all ranks' state (``Repo.commit(..., group=)``): rank 0 creates the repository if
    needed before the others open it, and a policy that is not ``by_step`` answers on rank 0
    for all ranks. Without one, this process commits alone, even under a process group of two or
    more ranks (``Repo.commit(..., local=True)``: the integrations commit on rank 0 only).
    """

    def __init__(self, repo: Repo | str | Path, *, branch: str | None = None, policy: Policy | None = None,
                 group: Any = None) -> None:
        self.group = group
        self._owns_repo = not isinstance(repo, Repo)
        self._repo = repo if isinstance(repo, Repo) else None
        self._path = None if isinstance(repo, Repo) else Path(repo)
        if self._path is not None and group is not None:
            from ckptrepo.distributed import native

            path = self._path
            self._repo = native.rank0_first(lambda: open_or_init(path), group)
        self._branch = branch
        self.policy: Policy = policy if policy is not None else Every(1000)
        self.last_rule: str | None = None
        self._handles: list[CommitHandle] = []
        self._last_id: str | None = None  # the last commit flushed
        self.remote_timeout: float | None = None
        """Seconds ``close`` waits for the replica remote to hold the last commit (None: no limit)."""
        self._clock: float | None = None  # when the current step began
        self._busy = False  # a commit's background phase ran while the current step did

    @property
    def repo(self) -> Repo:
        """The repository. A path given without ``group`` is opened (or created) on first use, so
        that in a data-parallel job where one process commits, the others never touch it."""
        if self._repo is None:
            assert self._path is not None
            self._repo = open_or_init(self._path)
        return self._repo

    @property
    def branch(self) -> str:
        """Where commits go (default: the repository's current branch when first asked)."""
        if self._branch is None:
            self._branch = self.repo.head
        return self._branch

    @property
    def world(self) -> tuple[int, int]:
        """``(this process's rank, world size)`` in the stream's group; ``(0, 1)`` without one."""
        if self.group is None:
            return 0, 1
        import torch.distributed as dist

        return dist.get_rank(self.group), dist.get_world_size(self.group)

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
        rule = self.policy.due(step)
        if self.group is None or getattr(self.policy, "by_step", False):
            return rule
        from ckptrepo.distributed import native

        return (rule or "rank 0") if native.rank0_decides(rule is not None, self.group) else None

    def commit(self, state: Any, step: int, rule: str, *, epoch: int | None = None,
               metrics: Mapping[str, float] | None = None, message: str | None = None,
               allow_pickle: bool = False, started: float | None = None,
               files: Mapping[str, Any] | None = None) -> CommitHandle:
        """Start a commit of ``state`` at ``step``; ``rule`` (why) goes in the message and the
        config, with the world size (on several ranks, rank 0's metrics and rule are recorded).
        ``started``: when the loop stopped for it (``time.perf_counter()``; default: now), so
        the policy hears what gathering the state cost too. ``files``: kept beside the state
        (``Repo.commit(files=)``; not on several ranks)."""
        t0 = time.perf_counter() if started is None else started
        config = {"checkpointer": {"rule": rule, "world_size": self.world[1]}}
        handle = self.repo.commit(state, branch=self.branch, step=step, epoch=epoch, metrics=metrics,
                                  message=message or f"step {step} ({rule})", config=config,
                                  allow_pickle=allow_pickle, group=self.group,
                                  local=self.group is None and _default_group() is not None, files=files)
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
        if done:
            self._last_id = done[-1].id
        return done

    def close(self) -> None:
        """``flush``; with a remote that replicates the repository, wait until it holds the last
        commit (the final step reaches durable storage: ``remote_timeout`` seconds, then the
        replication error is raised); then close the repository if this object opened it."""
        try:
            done = self.flush()
            if self._repo is not None and self._repo.replica is not None and self.world[0] == 0:
                last = done[-1].id if done else self._last_id
                if last is not None:
                    self._repo.wait_replicated(last, timeout=self.remote_timeout)
        finally:
            if self._owns_repo and self._repo is not None:
                self._repo.close()


_RESUME_CANDIDATES = 50  # commits of the branch ``resume`` tries, newest first


def config_files(model_config: Any = None, files: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The files a commit keeps for ``model_config`` and ``files``: ``config.json`` from a dict, or
    an object with ``to_json_string()`` (a transformers ``PretrainedConfig``) or ``to_dict()``, so
    that ``Repo.export(rev, DIR, format="hf")`` writes a folder ``from_pretrained`` loads; then
    ``files`` (relative path -> bytes or a path) as given."""
    out: dict[str, Any] = {}
    if model_config is not None:
        if isinstance(model_config, Mapping):
            text = json.dumps(dict(model_config), indent=2, sort_keys=True) + "\n"
        elif callable(getattr(model_config, "to_json_string", None)):
            text = model_config.to_json_string()
        elif callable(getattr(model_config, "to_dict", None)):
            text = json.dumps(model_config.to_dict(), indent=2, sort_keys=True) + "\n"
        else:
            raise UsageError(f"model_config is a {type(model_config).__name__}",
                             hint="Pass a dict, or a config with to_json_string() or to_dict() (model.config).")
        out["config.json"] = text.encode()
    out.update(files or {})
    return out


def _stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


class Checkpointer(CommitStream):
    """Commits a training loop's state when its policy says so, and resumes it exactly.

    ``repo``: an open ``Repo`` or a path (a repository is created there if there is none; the
    Checkpointer then closes it). ``model``, ``optimizer``, ``scheduler``, ``dataloader`` and the
    values of ``extra``: objects with ``state_dict``/``load_state_dict``. ``branch``: where
    commits go and what ``resume`` reads (default: the repository's current branch).
    ``policy``: when to commit (default ``Every(1000)``; see ``ckptrepo.policy``). ``rng``:
    record and restore every RNG state. ``group``: on several ranks, the process group whose
    ranks commit together (default: the default group, when one with two or more ranks is
    initialized); every rank of it runs the same loop with its own Checkpointer.
    ``model_config`` (a dict, or ``model.config``) and ``files`` (relative path -> bytes or a
    path: tokenizer files ...): kept by every commit as files (``config_files``), so that
    ``repo.export(rev, DIR, format="hf")`` writes a folder ``from_pretrained`` loads (one process only).

    Use::

        with Checkpointer("runs/exp", model=model, optimizer=opt, dataloader=loader) as ckpt:
            step = ckpt.resume()
            for batch in loader:           # a StatefulDataLoader resumes at the next batch
                ...; opt.step(); step += 1
                ckpt.after_step(step, {"loss": loss.item()})
    """

    def __init__(self, repo: Repo | str | Path, *, model: Any = None, optimizer: Any = None, scheduler: Any = None,
                 dataloader: Any = None, extra: Mapping[str, Any] | None = None, branch: str | None = None,
                 policy: Policy | None = None, rng: bool = True, group: Any = None, model_config: Any = None,
                 files: Mapping[str, Any] | None = None) -> None:
        objects = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
        for name, obj in [*objects.items(), *((f"extra[{k!r}]", v) for k, v in (extra or {}).items())]:
            if obj is not None and not _stateful(obj):
                raise UsageError(f"{name} has no state_dict()/load_state_dict(): the Checkpointer cannot save it",
                                 hint="Pass an object with both methods, or keep it out of the Checkpointer.")
        if dataloader is not None and not _stateful(dataloader):
            warnings.warn(
                f"{type(dataloader).__name__} has no state_dict(): a resume restarts its epoch from the first "
                "batch, with a new order. For an exact resume use "
                "torchdata.stateful_dataloader.StatefulDataLoader (pip install torchdata).", stacklevel=2)
            dataloader = None
        if model is None and optimizer is None and scheduler is None and not extra and dataloader is None and not rng:
            raise UsageError("nothing to checkpoint", hint="Pass a model, optimizer, ... or leave rng=True.")
        group = group if group is not None else _default_group()
        if group is not None and optimizer is not None and model is None:
            raise UsageError("on several ranks the Checkpointer saves an optimizer by parameter name, from its model",
                             hint="Pass model= as well as optimizer=.")
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.dataloader, self.extra, self.rng = dataloader, dict(extra or {}), rng
        self.files = config_files(model_config, files)
        if self.files and group is not None:
            raise UsageError("model_config= and files= are kept by a commit of one process, and this one is "
                             "collective", hint="Commit them once from one rank (Repo.commit(..., files=, "
                             "local=True)), or leave them out.")
        super().__init__(repo, branch=branch, policy=policy, group=group)

    # -- resume ------------------------------------------------------------------------------

    def resume(self, rev: str | None = None, *, tier: str = "any") -> int:
        """Load the newest commit of the branch (or ``rev``) into every object and RNG.

        Returns that commit's step (the count of completed optimizer steps), or 0 when the
        branch has no commit yet and ``rev`` is None (nothing is loaded then). A commit made
        at another world size restores the model, optimizer (resharded), scheduler and extra
        state, but not the ranks' RNG states and data positions: a warning says so.

        ``tier``: which commits may be resumed from: ``"local"`` (held by this repository's
        store), ``"remote"`` (held by the replica remote: durable there) or ``"any"``. Without
        ``rev``, a commit that cannot be read (damaged or lost data, on every tier that holds it:
        a chunk damaged here is read from the remote's copy) is skipped with a warning for the
        next older one the branch reaches, instead of failing or looping.
        """
        if tier not in ("local", "remote", "any"):
            raise UsageError(f"tier {tier!r} is not 'local', 'remote' or 'any'")
        if rev is not None:
            return self._resume_from(self.repo.get_commit(rev))
        replica = self.repo.replica
        if tier == "remote" and replica is None:
            raise UsageError("resume(tier='remote') needs a remote that replicates the repository",
                             hint="Add one with `ckpt remote add NAME URL --replicate`.")
        try:
            line = self.repo.log(self.branch, limit=_RESUME_CANDIDATES)
        except UnknownRevision:
            return 0
        failure: Exception | None = None
        for commit in line:
            if commit.pruned or commit.damage is not None:
                continue
            if (tier == "local" and "local" not in commit.tiers) or (tier == "remote" and replica not in commit.tiers):
                continue
            try:
                return self._resume_from(commit)
            except (IntegrityError, StorageError, CommitDamaged, CommitPruned) as exc:
                failure = failure or exc
                warnings.warn(f"commit {commit.id[:12]} (step {commit.step}) cannot be read ({exc}); resuming from "
                              "an older one", stacklevel=2)
        if failure is not None:
            raise failure
        return 0

    def _resume_from(self, commit: Commit) -> int:
        rank, world = self.world
        made = commit.config.get("checkpointer", {}) if isinstance(commit.config, dict) else {}
        made_at = made.get("world_size", 1) if isinstance(made, dict) else 1
        self._load_shared(commit.id)
        if made_at == world:
            self._load_own(commit.id, "" if world == 1 else f"ranks/{rank}/")
        elif self.rng or self.dataloader is not None:
            warnings.warn(f"commit {commit.id[:12]} was made on {made_at} rank(s), this job has {world}: the weights "
                          "and optimizer, scheduler and extra state are restored, the RNG states and data loader "
                          "positions are not, so the run does not continue exactly as it would have", stacklevel=2)
        self.restart_clock()
        return commit.step or 0

    def _load_shared(self, cid: str) -> None:
        read = functools.partial(self.repo.checkout, cid)
        if self.model is not None:
            from torch.distributed.checkpoint.state_dict import set_state_dict

            # By parameter name (torch.distributed.checkpoint.state_dict), as state() stored them:
            # on several ranks DCP reads each rank's shards into these, at any world size.
            model_sd, optim_sd = _model_state(self.model, self.optimizer)
            if self.group is not None:
                into = {"model": model_sd} if self.optimizer is None else {"model": model_sd, "optimizer": optim_sd}
                read(into=into, group=self.group)
            else:
                model_sd = read(part="model")
                optim_sd = read(part="optimizer") if self.optimizer is not None else {}
            set_state_dict(self.model, self.optimizer or (), model_state_dict=model_sd, optim_state_dict=optim_sd)
        elif self.optimizer is not None:
            self.optimizer.load_state_dict(read(part="optimizer"))
        if self.scheduler is not None:
            self.scheduler.load_state_dict(read(part="scheduler"))
        for key, obj in self.extra.items():
            obj.load_state_dict(read(part=join_path(["extra", key])))

    def _load_own(self, cid: str, prefix: str) -> None:
        """This process's (rank's) data position and RNG states, stored under ``prefix``."""
        if self.dataloader is not None:
            set_epoch = getattr(getattr(self.dataloader, "sampler", None), "set_epoch", None)
            if callable(set_epoch):
                with contextlib.suppress(UsageError):  # committed without one (its sampler had no epoch)
                    set_epoch(self.repo.checkout(cid, part=prefix + "sampler_epoch"))
            self.dataloader.load_state_dict(self.repo.checkout(cid, part=prefix + "dataloader"))
            # A loader makes its next iterator from the loaded state when asked for its state (so
            # StatefulDataLoader does), drawing seeds from torch's generator; done here, before the
            # generators are restored, the loop's `for batch in loader` takes that iterator as is.
            self.dataloader.state_dict()
        if self.rng:
            try:
                state = self.repo.checkout(cid, part=prefix + "rng")
            except UsageError as exc:
                raise UsageError(f"commit {cid[:12]} holds no RNG states, so the resume cannot be exact",
                                 hint="Resume with Checkpointer(..., rng=False) to accept that.") from exc
            restore_rng(state)

    # -- commit --------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What a commit stores now (live objects and state dicts; the commit copies them).

        Shared by all ranks: ``model`` and ``optimizer`` (by parameter name), ``scheduler``,
        ``extra``. Each process's own: ``dataloader``, ``sampler_epoch``, ``rng``; at the top level
        in one process, under ``ranks/<rank>`` on several.
        """
        out: dict[str, Any] = {}
        if self.model is not None:
            out["model"], optim_sd = _model_state(self.model, self.optimizer)
            if self.optimizer is not None:
                out["optimizer"] = optim_sd
        elif self.optimizer is not None:
            out["optimizer"] = self.optimizer
        if self.scheduler is not None:
            out["scheduler"] = self.scheduler
        if self.extra:
            out["extra"] = dict(self.extra)
        own: dict[str, Any] = {}
        if self.dataloader is not None:
            epoch = getattr(getattr(self.dataloader, "sampler", None), "epoch", None)
            if type(epoch) is int:
                own["sampler_epoch"] = epoch
            own["dataloader"] = self.dataloader.state_dict()
        if self.rng:
            own["rng"] = capture_rng()
        rank, world = self.world
        if world == 1:
            return out | own
        return out | {"ranks": {str(rank): own}}

    def after_step(self, step: int, metrics: Mapping[str, float] | None = None, *,
                   epoch: int | None = None) -> CommitHandle | None:
        """Call after every optimizer step with the count of completed steps; commits if the policy says so.

        Returns the commit's handle when it committed (durable later; ``close`` waits), else None.
        Raises the error of an earlier commit that failed in the background. On several ranks,
        every rank calls it after every step (a commit is collective).
        """
        rule = self.due(step)
        handle = self.commit_now(step, metrics, epoch=epoch, rule=rule) if rule is not None else None
        self.stepped()
        return handle

    def commit_now(self, step: int, metrics: Mapping[str, float] | None = None, *, epoch: int | None = None,
                   rule: str = "explicit") -> CommitHandle:
        """Commit now, whatever the policy; ``rule`` names why (recorded in the message and config).
        On several ranks, every rank calls it at the same step (a commit is collective)."""
        started = time.perf_counter()
        return self.commit(self.state(), step, rule, epoch=epoch, metrics=metrics, started=started,
                           files=self.files or None)

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _model_state(model: Any, optimizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model's and optimizer's state dicts keyed by parameter name, as DCP's
    ``get_state_dict`` gives them (FSDP2's as local shards; no optimizer: an empty dict)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer if optimizer is not None else ())
    return model_sd, optim_sd


def open_or_init(path: Path) -> Repo:
    """The repository at ``path``, created there if there is none (by this process or, racing
    it, another: every process of a job may call this at once)."""
    try:
        return Repo.open(path)
    except NotARepository:
        pass
    try:
        return Repo.init(path)
    except RepositoryExists:
        return Repo.open(path)


def _default_group() -> Any:
    """The default process group when one of two or more ranks is initialized, else None."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.group.WORLD
    return None
