"""``Repo.commit`` and ``Repo.checkout(into=...)`` on every rank of a process group.

A distributed commit is two-phase as a single-process one. Phase 1, on the caller's thread of
every rank: the state is flattened as DCP flattens it, every tensor's local part (a DTensor's
local shard, a plain tensor whole) is copied into a reused staging slot, and the ranks agree
that all of them got this far (one small all-gather: a rank that failed makes every rank raise
``RankFailed`` at once, nothing staged stays). Phase 2, on each rank's committer thread in call
order: ``dcp.save`` of the staged state through ``writer.ShareWriter`` on a process group of
ckptrepo's own (gloo, so that its collectives never interleave with the training loop's), which
writes every rank's share and records one commit on the coordinator. Plain tensors count as
replicated: DCP gives each to one rank, and ``ShareWriter`` spreads the large ones over all
ranks by bytes. Every rank's handle returns the same commit.

A rank that fails or dies in phase 2 makes the others' ``wait()`` raise ``RankFailed`` (DCP
reports the failure to every rank; a dead rank's peers see its connections close, or the group's
timeout, knob ``CKPT_DIST_TIMEOUT``, expire); no commit is made.

``load`` runs ``dcp.load`` through ``reader.CommitReader``: every rank reads the regions of each
tensor its shards hold, whatever layout and world size committed them.
"""

from __future__ import annotations

import copy
import threading
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint._nested_dict import flatten_state_dict, unflatten_state_dict
from torch.distributed.tensor import DTensor

from ckptrepo import knobs
from ckptrepo import state as st
from ckptrepo import types as t
from ckptrepo.dist.reader import CommitReader
from ckptrepo.dist.writer import ShareWriter, commit_id
from ckptrepo.errors import RankFailed
from ckptrepo.ingest.handle import CommitHandle
from ckptrepo.ingest.writer import CommitWriter

_groups: dict[Any, tuple[Any, Any]] = {}  # user group -> (phase-1 group, phase-2 group), both gloo
_lock = threading.Lock()


def is_distributed(state: Any) -> bool:
    """Whether ``state`` holds a DTensor (its modules' and optimizers' state dicts included)."""
    if isinstance(state, DTensor):
        return True
    if isinstance(state, dict):
        return any(is_distributed(v) for v in state.values())
    if isinstance(state, list | tuple):
        return any(is_distributed(v) for v in state)
    if callable(getattr(state, "state_dict", None)) and callable(getattr(state, "load_state_dict", None)):
        return is_distributed(state.state_dict())
    return False


def _own_groups(group: Any) -> tuple[Any, Any]:
    """ckptrepo's two gloo groups over the ranks of ``group`` (made on first use, by every rank)."""
    with _lock:
        found = _groups.get(group)
        if found is None:
            if not dist.is_available() or not dist.is_initialized():
                raise RankFailed(rank=-1, detail="no process group is initialized",
                                 hint="Call torch.distributed.init_process_group first, on every rank.")
            ranks = dist.get_process_group_ranks(group) if group is not None else None
            timeout = timedelta(seconds=knobs.get_int("DIST_TIMEOUT", 300))
            found = _groups[group] = (dist.new_group(ranks, backend="gloo", timeout=timeout),
                                      dist.new_group(ranks, backend="gloo", timeout=timeout))
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


def commit(engine: CommitWriter, state: Any, meta: dict[str, Any], *, group: Any, blocking: bool,
           allow_pickle: bool = False) -> CommitHandle:
    """Commit ``state`` on every rank of ``group`` (None: the default group) as one commit;
    ``meta``: ``CommitRequest``'s metadata fields, validated (the coordinator's are recorded)."""
    agree, save_group = _own_groups(group)
    rank = dist.get_rank(agree)
    snap = None
    failure = ""
    try:
        flat, mappings = flatten_state_dict(_stateful(state))
        local = {fqn: (v.to_local() if isinstance(v, DTensor) else v).detach()
                 for fqn, v in flat.items() if isinstance(v, torch.Tensor)}
        snap = engine.snapshots().take(local, raw=False, unchanged=frozenset(), summarize=False)
        staged: dict[str, Any] = {}
        for fqn, value in flat.items():
            if isinstance(value, DTensor):
                staged[fqn] = DTensor.from_local(snap.staged[fqn], _on_cpu(value.device_mesh), value.placements,
                                                 run_check=False, shape=value.shape, stride=value.stride())
            elif isinstance(value, torch.Tensor):
                staged[fqn] = snap.staged[fqn]
            else:
                st.flatten(value, allow_pickle=allow_pickle)  # refused here, as a single-process commit would
                staged[fqn] = copy.deepcopy(value)  # the caller may change it once commit() returns
        staged_state = unflatten_state_dict(staged, mappings)
    except Exception as exc:
        failure = f"{type(exc).__name__}: {exc}"
    outcomes: list[Any] = [None] * dist.get_world_size(agree)
    dist.all_gather_object(outcomes, (rank, failure), group=agree)
    failed = [(r, why) for r, why in outcomes if why]
    if failed:
        if snap is not None:
            snap.release()
        raise RankFailed(rank=failed[0][0], detail=failed[0][1])
    assert snap is not None
    release = snap.release
    shared = [meta]  # the coordinator's message, step, metrics and time are the commit's
    dist.broadcast_object_list(shared, src=dist.get_global_rank(agree, 0), group=agree)
    recorded: dict[str, Any] = shared[0]

    def phase_2() -> t.Commit:
        from torch.distributed.checkpoint.state_dict_saver import save

        try:
            writer = ShareWriter(engine, recorded, allow_pickle=allow_pickle)
            metadata = save(staged_state, storage_writer=writer, process_group=save_group)
            if writer.commit is not None:
                return writer.commit
            return engine.read_commit(commit_id(metadata))
        except RankFailed:
            raise
        except Exception as exc:
            raise RankFailed(rank=_failed_rank(exc, rank), detail=_summary(exc)) from exc
        finally:
            release()

    handle = engine.submit_job(phase_2)
    if blocking:
        handle.wait()
    return handle


def load(reader: CommitReader, into: Any, *, group: Any) -> None:
    """Load the commit ``reader`` serves into ``into`` (modules, optimizers, DTensors and tensors
    in place) on every rank of ``group`` (None: the default group)."""
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    dcp_load(into, storage_reader=reader, process_group=group)


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
