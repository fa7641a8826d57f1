"""``Repo.commit`` and ``Repo.checkout(into=...)`` on every rank of a process group.

A distributed commit is two-phase as a single-process one. Phase 1, on the caller's thread of
every rank: the state is flattened as DCP flattens it, every tensor's local part (a DTensor's
local shard, a plain tensor whole) is copied into a reused staging slot, and the ranks agree
that all of them got this far (a one-element all-reduce: a rank that failed makes every rank
raise ``RankFailed`` at once, nothing staged stays). Phase 2, on each rank's committer thread in
call order: the coordinator's metadata is broadcast, the staged shards become DTensors again, and
``dcp.save`` of the staged state runs through ``writer.ShareWriter`` on a process group of
ckptrepo's own (gloo, so that its collectives never interleave with the training loop's), which
writes every rank's share and records one commit on the coordinator. Plain tensors count as
replicated: DCP gives each to one rank, and ``ShareWriter`` spreads the large ones over all
ranks by bytes. Every rank's handle returns the same commit.

A rank that fails or dies in phase 2 makes the others' ``wait()`` raise ``RankFailed`` (DCP
reports the failure to every rank; a dead rank's peers see its connections close, or the group's
timeout, knob ``CKPT_DIST_TIMEOUT``, expire); no commit is made. Each rank's packs are under its
lease (``ledger.leases``) from its ``write_data`` until the coordinator's transaction has ended
(``writer.ShareWriter``), all on the committer threads, never on the caller's.

``load`` runs ``dcp.load`` through ``reader.CommitReader``: every rank reads the regions of each
tensor its shards hold, whatever layout and world size committed them. Modules and optimizers are
loaded through their state dicts; an optimizer without state yet is given it first, as DCP's
``get_state_dict`` does, so a fresh job's optimizer is restored too.

Whether a call runs here at all (every rank of a group, or this process alone) is decided by
``scope.collective_group``; a DDP module comes here as the module it wraps (``scope.unwrapped``).
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.checkpoint._nested_dict import flatten_state_dict, unflatten_state_dict
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.tensor import DTensor

from ckptrepo import knobs
from ckptrepo import state as st
from ckptrepo import types as t
from ckptrepo.distributed.keys import int_keys
from ckptrepo.distributed.reader import CommitReader
from ckptrepo.distributed.scope import DDP_PREFIX
from ckptrepo.distributed.writer import ShareWriter, commit_id
from ckptrepo.errors import RankFailed
from ckptrepo.handle import CommitHandle
from ckptrepo.ingest.writer import CommitWriter

ALONE_HINT = ("Under a process group of two or more ranks, commit() and checkout(into=...) run on every rank "
              "together: call them on every rank, or pass local=True where one process commits or loads alone. "
              "If a rank died instead, no commit was made; packs already written are reclaimed by `ckpt gc`.")
_groups: dict[Any, tuple[Any, Any]] = {}  # user group -> (phase-1 group, phase-2 group), both gloo
_lock = threading.Lock()
T = TypeVar("T")


def _own_groups(group: Any) -> tuple[Any, Any]:
    """ckptrepo's two gloo groups over the ranks of ``group`` (made on first use, by every rank)."""
    with _lock:
        found = _groups.get(group)
        if found is None:
            if not dist.is_available() or not dist.is_initialized():
                raise RankFailed(rank=-1, detail="no process group is initialized",
                                 hint="Call torch.distributed.init_process_group first, on every rank.")
            ranks = dist.get_process_group_ranks(group) if group is not None else None
            timeout = timedelta(seconds=knobs.get_int("DIST_TIMEOUT"))
            try:
                found = (dist.new_group(ranks, backend="gloo", timeout=timeout),
                         dist.new_group(ranks, backend="gloo", timeout=timeout))
            except Exception as exc:  # every rank of the default group makes them: one did not come
                raise RankFailed(rank=-1, detail=f"not every rank joined ckptrepo's process group "
                                                 f"({_summary(exc)})", hint=ALONE_HINT) from exc
            _groups[group] = found
        return found


def _on_cpu(mesh: Any) -> Any:
    """``mesh``, or for a CUDA mesh its CPU twin (the same ranks and layout, no process groups): the
    staged copies of CUDA shards are host memory, and ``DTensor.from_local`` would move them back."""
    if mesh.device_type == "cpu":
        return mesh
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh("cpu", mesh.mesh, mesh_dim_names=mesh.mesh_dim_names, _init_backend=False)


def _stateful(state: Any) -> Any:
    """``state`` with every module, optimizer or scheduler at its top two levels as its state dict."""
    if isinstance(state, dict):
        return {k: _stateful(v) for k, v in state.items()}
    if callable(getattr(state, "state_dict", None)) and callable(getattr(state, "load_state_dict", None)):
        return state.state_dict()
    return state


def commit(engine: CommitWriter, state: Any, meta: dict[str, Any], *, group: Any, blocking: bool, entered: float,
           allow_pickle: bool = False) -> CommitHandle:
    """Commit ``state`` on every rank of ``group`` (None: the default group) as one commit;
    ``meta``: ``CommitRequest``'s metadata fields, validated (the coordinator's are recorded);
    ``entered``: ``time.perf_counter()`` when the caller's ``commit()`` began.

    Phase 1 (this thread) does only what must precede the return: copy the local parts and
    agree. Building the staged DTensors, sharing the coordinator's metadata and the save run in
    phase 2."""
    agree, save_group = _own_groups(group)
    snap = None
    failure = ""
    dtensors: dict[str, tuple[Any, Any, Any, Any]] = {}  # fqn -> (mesh, placements, shape, stride)
    values: dict[str, Any] = {}
    mappings: Any = None
    try:
        flat, mappings = flatten_state_dict(_stateful(state))
        local: dict[str, torch.Tensor] = {}
        for fqn, value in flat.items():
            if isinstance(value, DTensor):
                local[fqn] = value.to_local().detach()
                dtensors[fqn] = (value.device_mesh, value.placements, value.shape, value.stride())
            elif isinstance(value, torch.Tensor):
                local[fqn] = value.detach()
            else:
                st.flatten(value, allow_pickle=allow_pickle)  # refused here, as a single-process commit would
                values[fqn] = copy.deepcopy(value)  # the caller may change it once commit() returns
        snap = engine.snapshots().take(local, raw=False, unchanged=frozenset(), summarize=False)
    except Exception as exc:
        failure = f"{type(exc).__name__}: {exc}"
    try:
        _agree(agree, failure)
    except BaseException:
        if snap is not None:
            snap.release()
        raise
    assert snap is not None
    release, staged_local = snap.release, snap.staged
    staged_at = time.perf_counter()
    timing = (staged_at - entered, snap.waited, staged_at)

    def phase_2() -> t.Commit:
        from torch.distributed.checkpoint.state_dict_saver import save

        try:
            shared = [meta]  # the coordinator's message, step, metrics and time are the commit's
            dist.broadcast_object_list(shared, src=dist.get_global_rank(save_group, 0), group=save_group)
            staged: dict[str, Any] = dict(values)
            for fqn, tensor in staged_local.items():
                found = dtensors.get(fqn)
                if found is None:
                    staged[fqn] = tensor
                else:
                    mesh, placements, shape, stride = found
                    staged[fqn] = DTensor.from_local(tensor, _on_cpu(mesh), placements, run_check=False,
                                                     shape=shape, stride=stride)
            writer = ShareWriter(engine, shared[0], allow_pickle=allow_pickle, timing=timing)
            metadata = save(unflatten_state_dict(staged, mappings), storage_writer=writer, process_group=save_group)
            # gloo releases a collective's tensors on its own thread after the call returns; in a
            # process that exits right after wait() that thread would need the interpreter while
            # it finalizes, and abort. A barrier (no Python tensors) gives it the time first.
            dist.barrier(group=save_group)
            if writer.commit is not None:
                return writer.commit
            return engine.read_commit(commit_id(metadata))
        except RankFailed:
            raise
        except Exception as exc:
            raise RankFailed(rank=_failed_rank(exc, dist.get_rank(save_group)), detail=_summary(exc)) from exc
        finally:
            release()

    handle = engine.submit_job(phase_2)
    if blocking:
        handle.wait()
    return handle


def rank0_decides(wanted: bool, group: Any) -> bool:
    """Rank 0's ``wanted``, on every rank of ``group`` (None: the default group): a one-element
    broadcast on ckptrepo's own gloo group, so it never interleaves with the loop's collectives."""
    agree, _ = _own_groups(group)
    flag = torch.tensor([1 if wanted else 0], dtype=torch.int32)
    dist.broadcast(flag, src=dist.get_global_rank(agree, 0), group=agree)
    return bool(flag.item())


def rank0_first(make: Callable[[], T], group: Any) -> T:
    """``make()`` on rank 0 of ``group``, then on the other ranks once it succeeded (creating a
    repository once, say). When rank 0's fails, it raises its error and the others RankFailed."""
    agree, _ = _own_groups(group)
    if dist.get_rank(agree) != 0:
        _agree(agree, "")
        return make()
    try:
        made = make()
    except Exception as exc:
        with contextlib.suppress(RankFailed):
            _agree(agree, f"{type(exc).__name__}: {exc}")
        raise
    _agree(agree, "")
    return made


def _agree(group: Any, failure: str) -> None:
    """Every rank of ``group`` got through phase 1 (``failure`` empty here), or raise RankFailed
    naming the first rank that did not, on every rank. One one-element all-reduce when all went
    well; the reasons are gathered only after a failure."""
    flag = torch.tensor([1 if failure else 0], dtype=torch.int32)
    try:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        if not flag.item():
            return
        outcomes: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(outcomes, (dist.get_rank(group), failure), group=group)
    except Exception as exc:  # a rank died or the group timed out
        raise RankFailed(rank=-1, detail=f"a rank stopped answering before the commit was staged "
                                         f"({_summary(exc)})", hint=ALONE_HINT) from exc
    rank, why = next((r, w) for r, w in outcomes if w)
    raise RankFailed(rank=rank, detail=why)


def load(reader: CommitReader, into: Any, *, group: Any) -> None:
    """Load the commit ``reader`` serves into ``into`` on every rank of ``group`` (None: the
    default group), through ``dcp.load``: tensors and DTensors in place (each rank reads the
    regions its shards hold), modules, optimizers and other objects with ``state_dict`` /
    ``load_state_dict`` (in dicts, at any depth) through their state dicts, other values replaced.

    An optimizer that has no state yet (a fresh job resuming) gets it first, as DCP's
    ``get_state_dict`` does it (one step at learning rate 0 on zero gradients; the gradients the
    parameters had are put back), so that the commit's moments have somewhere to go; parameters
    the commit holds no state for are left without. The targets are checked against the commit
    before anything is read, on every rank (DCP's load planner: a key the commit lacks fails).
    A DDP module's commit made with ``module.`` names (``scope.DDP_PREFIX``) loads too."""
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    targets, loaders = _targets(into, ())
    dcp_load(targets, storage_reader=reader, process_group=group, planner=_Planner(loaders))
    for loader in loaders:
        loader.finish()
    _put_back(into, targets)


class _Loader:
    """One object of ``into`` loaded through its state dict ``sd``, the target of the dict at
    key path ``path``."""

    def __init__(self, obj: Any, path: tuple[str, ...]) -> None:
        self.obj, self.prefix = obj, "".join(f"{p}." for p in path)
        if isinstance(obj, torch.optim.Optimizer):
            _init_state(obj)
        self.sd: dict[Any, Any] = obj.state_dict()
        self.renamed = False

    def fit(self, stored: set[str]) -> None:
        """Fit the target to the commit's fqns (``stored``) before DCP plans the load."""
        if isinstance(self.obj, torch.optim.Optimizer) and isinstance(self.sd.get("state"), dict):
            base = f"{self.prefix}state."
            held = {f[len(base):].split(".", 1)[0] for f in stored if f.startswith(base)}
            for key in [k for k in self.sd["state"] if str(k) not in held]:
                del self.sd["state"][key]  # no state for this parameter in the commit: none after the load
        elif isinstance(self.obj, torch.nn.Module) and self.sd:
            plain = any(f"{self.prefix}{k}" in stored for k in self.sd)
            if not plain and all(f"{self.prefix}{DDP_PREFIX}{k}" in stored for k in self.sd):
                items = list(self.sd.items())
                self.sd.clear()
                self.sd.update((f"{DDP_PREFIX}{k}", v) for k, v in items)
                self.renamed = True

    def finish(self) -> None:
        sd = self.sd
        if self.renamed:
            sd = {k[len(DDP_PREFIX):]: v for k, v in sd.items()}
        if isinstance(self.obj, torch.optim.Optimizer):
            sd = int_keys(sd)  # a value DCP set by its string key path ("0"), next to the int
        self.obj.load_state_dict(sd)


def _targets(node: Any, path: tuple[str, ...]) -> tuple[Any, list[_Loader]]:
    """``node`` with every object with ``state_dict``/``load_state_dict`` as its state dict (to be
    loaded into it after DCP's load, by the ``_Loader``s returned); dicts copied, the rest as is."""
    if isinstance(node, dict):
        loaders: list[_Loader] = []
        out: dict[Any, Any] = {}
        for key, value in node.items():
            out[key], found = _targets(value, (*path, str(key)))
            loaders.extend(found)
        return out, loaders
    if not isinstance(node, torch.Tensor) and callable(getattr(node, "state_dict", None)) and callable(
            getattr(node, "load_state_dict", None)):
        loader = _Loader(node, path)
        return loader.sd, [loader]
    return node, []


def _put_back(into: Any, loaded: Any) -> None:
    """The values DCP replaced (not tensors, loaded in place; not objects, loaded by their
    ``_Loader``) set in ``into``'s dicts, as DCP sets them in the dicts it is given."""
    if not isinstance(into, dict) or not isinstance(loaded, dict):
        return
    for key, value in into.items():
        if isinstance(value, dict):
            _put_back(value, loaded[key])
        elif not isinstance(value, torch.Tensor) and not (callable(getattr(value, "state_dict", None))
                                                          and callable(getattr(value, "load_state_dict", None))):
            into[key] = loaded[key]


def _init_state(optim: torch.optim.Optimizer) -> None:
    """Give an optimizer without state its state (``torch.distributed.checkpoint.state_dict``'s
    ``_init_optim_state``, but the parameters keep the gradients they had)."""
    if optim.state:
        return
    params = [p for g in optim.param_groups for p in g["params"]]
    grads = [p.grad for p in params]
    for p in params:
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    lrs = [g["lr"] for g in optim.param_groups if "lr" in g]
    for g in optim.param_groups:
        if "lr" in g:
            g["lr"] = torch.tensor(0.0) if isinstance(g["lr"], torch.Tensor) else 0.0
    try:
        optim.step()
    finally:
        for g in optim.param_groups:
            if "lr" in g:
                g["lr"] = lrs.pop(0)
        for p, grad in zip(params, grads, strict=True):
            p.grad = grad


class _Planner(DefaultLoadPlanner):
    """DCP's load planner, after each ``_Loader`` fitted its target to the commit's contents
    (every rank sees the same ``Metadata``, so all fit alike)."""

    def __init__(self, loaders: list[_Loader]) -> None:
        super().__init__()
        self._loaders = loaders

    def set_up_planner(self, state_dict: Any, metadata: Any = None, is_coordinator: bool = False) -> None:
        if metadata is not None:
            stored = set(metadata.state_dict_metadata)
            for loader in self._loaders:
                loader.fit(stored)
        super().set_up_planner(state_dict, metadata, is_coordinator)


def _failed_rank(exc: BaseException, here: int) -> int:
    failures = getattr(exc, "failures", None)  # DCP's CheckpointException: {rank: exception}
    return min(failures) if isinstance(failures, dict) and failures else here


def _summary(exc: BaseException) -> str:
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        rank = min(failures)
        inner = failures[rank]
        cause = inner[0] if isinstance(inner, tuple) and inner else inner
        return f"{type(cause).__name__}: {cause}".splitlines()[0]
    return f"{type(exc).__name__}: {exc}".splitlines()[0]
