"""Who runs a ``Repo.commit`` or ``Repo.checkout(into=...)``: this process alone, or every rank of a
process group together; and how live objects are seen by either.

The decision (``collective_group``), the same for a commit and for a checkout into live state:

- ``local=True``: this process alone, always (a commit or a load of its own; ``group`` must not be
  given, and a state holding DTensors is refused: its shards are only whole on all ranks).
- ``group`` given: every rank of ``group``, together.
- otherwise, under an initialised default process group of two or more ranks (torchrun with DDP,
  FSDP2, DTensors or none of them), or for a state holding DTensors: every rank of the default
  group, together (``dist.group.WORLD``). Each rank calls the same line; one commit of all ranks'
  state is made and every rank's handle returns it.
- otherwise (no process group, or one of one rank): this process alone.

A commit is collective in its first call (ckptrepo's own gloo groups are created by every rank),
so a rank that calls it alone waits for the others until ``CKPT_DIST_TIMEOUT`` and then raises
``RankFailed``, whose hint names ``local=True``.

``DistributedDataParallel`` wraps a module and prefixes its names with ``module.``; a commit
stores, and a checkout loads, the module it wraps (``unwrapped``), so that a DDP job's commit holds
the parameter names a plain model, an FSDP2 model (and DCP's ``get_state_dict``) use. A commit an
older version made with the prefix still loads into a DDP model (``strip_ddp_prefix``;
``native.load`` likewise).

Nothing here imports torch: a state can only hold DTensors or DDP modules once torch has loaded
them, so ``sys.modules`` answers first.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ckptrepo.errors import UsageError

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

DDP_PREFIX = "module."  # what DistributedDataParallel puts before its module's names


def collective_group(state: Any, group: ProcessGroup | None, *, local: bool, what: str) -> ProcessGroup | None:
    """The process group every rank of which runs this commit or checkout of ``state`` together,
    or None when this process runs it alone (the module docstring says which). ``what``: the call,
    for errors. UsageError for ``local=True`` with a ``group`` or with a state holding DTensors."""
    if local:
        if group is not None:
            raise UsageError(f"{what} was given both group= and local=True",
                             hint="Pass group= to run it on every rank of that group, or local=True to run it "
                                  "in this process alone; not both.")
        if _holds_dtensors(state):
            raise UsageError(f"{what} with local=True got a state holding DTensors, whose shards are whole only "
                             "on all ranks together",
                             hint="Drop local=True and make the same call on every rank (one commit of all ranks' "
                                  "shards), or pass full tensors (DTensor.full_tensor()).")
        return None
    if group is not None:
        return group
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.group.WORLD  # type: ignore[no-any-return]
    if _holds_dtensors(state):
        import torch.distributed as tdist

        return tdist.group.WORLD
    return None


def _holds_dtensors(state: Any) -> bool:
    if sys.modules.get("torch.distributed.tensor") is None:  # no DTensor can exist yet
        return False
    import torch
    from torch.distributed.tensor import DTensor

    def holds(value: Any) -> bool:
        """Whether ``value`` holds a DTensor (its modules' and optimizers' parameters, other stateful
        objects' state dicts included)."""
        if isinstance(value, DTensor):
            return True
        if isinstance(value, dict):
            return any(holds(v) for v in value.values())
        if isinstance(value, list | tuple):
            return any(holds(v) for v in value)
        # Modules and optimizers by their parameters (FSDP2's are DTensors): their state dicts are
        # built once, by the commit.
        if isinstance(value, torch.nn.Module):
            return any(isinstance(p, DTensor) for p in itertools.chain(value.parameters(), value.buffers()))
        if isinstance(value, torch.optim.Optimizer):
            return any(isinstance(p, DTensor) for g in value.param_groups for p in g["params"])
        if callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None)):
            return holds(value.state_dict())
        return False

    return holds(state)


def _ddp_type() -> type | None:
    """``DistributedDataParallel`` once torch has loaded it, else None."""
    parallel = sys.modules.get("torch.nn.parallel")
    found = getattr(parallel, "DistributedDataParallel", None) if parallel is not None else None
    return found if isinstance(found, type) else None


def unwrapped(state: Any) -> Any:
    """``state`` with every ``DistributedDataParallel`` in it (in dicts, lists and tuples, at any
    depth) replaced by the module it wraps; the very same object when it holds none (containers on
    the way to one are copied, never changed)."""
    ddp = _ddp_type()
    return state if ddp is None else _unwrap(state, ddp)


def _unwrap(node: Any, ddp: type) -> Any:
    if isinstance(node, ddp):
        return getattr(node, "module")  # noqa: B009 (the type is only known at run time)
    if isinstance(node, dict):
        out = {k: _unwrap(v, ddp) for k, v in node.items()}
        return node if all(out[k] is v for k, v in node.items()) else out
    if isinstance(node, list | tuple) and type(node) in (list, tuple):
        items = [_unwrap(v, ddp) for v in node]
        return node if all(a is b for a, b in zip(items, node, strict=True)) else type(node)(items)
    return node


def strip_ddp_prefix(targets: Any, restored: Any) -> Any:
    """``restored`` with the ``module.`` prefix taken off the names of each module state loaded
    into a ``DistributedDataParallel`` of ``targets`` when every name there has it (a commit made
    before commits stored the module DDP wraps); ``restored`` itself when there is none."""
    ddp = _ddp_type()
    if ddp is None:
        return restored
    return _strip(targets, restored, ddp)


def _strip(target: Any, value: Any, ddp: type) -> Any:
    if isinstance(target, ddp):
        if isinstance(value, Mapping) and value and all(isinstance(k, str) and k.startswith(DDP_PREFIX)
                                                        for k in value):
            return {k[len(DDP_PREFIX):]: v for k, v in value.items()}
        return value
    if isinstance(target, Mapping) and isinstance(value, dict):
        out = dict(value)
        for k, sub in target.items():
            if k in value:
                out[k] = _strip(sub, value[k], ddp)
        return value if all(out[k] is value[k] for k in value) else out
    return value
