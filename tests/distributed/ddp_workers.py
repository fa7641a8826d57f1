"""The README's multi-rank block with the native API, run by ``torchrun`` on gloo (CPU).

``python -m torch.distributed.run --standalone --nproc-per-node 2 ddp_workers.py KIND REPO``
trains a model wrapped as ``KIND`` (``ddp``: DistributedDataParallel; ``fsdp2``: ``fully_shard``)
with AdamW for ``STEPS`` steps and after each runs, on every rank, the README's line
``repo.commit({"model": model, "optim": optim}, step=step)``; then loads the head into a fresh
model and optimizer (no optimizer state yet) on every rank with the README's
``repo.checkout("main", into={"model": model, "optim": optim})`` and checks, bit-exactly, that it
equals the trained one, through ``get_state_dict`` too. Rank 0 writes what the test checks
afterwards: ``ids-KIND.txt`` (the commit id each step's handle returned, the same on every rank)
and ``KIND.pt`` (the trained state, full tensors keyed by parameter name).
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

STEPS = 3


def make_model(kind: str, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A small MLP wrapped as ``kind`` (``plain``: not wrapped) and its AdamW, not stepped yet."""
    torch.manual_seed(seed)
    model: torch.nn.Module = torch.nn.Sequential(torch.nn.Linear(64, 257), torch.nn.ReLU(), torch.nn.Linear(257, 33))
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
    elif kind == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for m in model.children():
            if isinstance(m, torch.nn.Linear):
                fully_shard(m, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)


def full_state(model: torch.nn.Module, optim: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model's and optimizer's full state by parameter name (DCP's ``get_state_dict``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    return get_state_dict(model, optim, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def readme_block(kind: str, path: Path) -> None:
    import ckptrepo
    from ckptrepo.testing import assert_states_equal

    rank = dist.get_rank()
    model, optim = make_model(kind, 1)
    ids = []
    with ckptrepo.Repo.open(path) as repo:
        torch.manual_seed(10 + rank)  # each rank its own batches
        for step in range(1, STEPS + 1):
            model(torch.randn(8, 64)).sum().backward()
            optim.step()
            optim.zero_grad()
            handle = repo.commit({"model": model, "optim": optim}, step=step)  # the native API, on every rank
            ids.append(handle.wait().id)
        trained = full_state(model, optim)
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, ids)
        assert all(got == ids for got in every), every  # one commit per step, the same on every rank
        if rank == 0:
            (path / f"ids-{kind}.txt").write_text("\n".join(ids))
            torch.save(trained, path / f"{kind}.pt")

        fresh, fresh_optim = make_model(kind, 2)  # other values, no optimizer state yet
        repo.checkout("main", into={"model": fresh, "optim": fresh_optim})  # resharded into DTensor state
        restored = full_state(fresh, fresh_optim)  # gathered on rank 0 (cpu_offload)
        if rank == 0:
            assert_states_equal(restored, trained)
        # Training goes on from there exactly as it would have from the trained model.
        torch.manual_seed(99)
        batch = torch.randn(8, 64)
        for m, o in ((model, optim), (fresh, fresh_optim)):
            m(batch).sum().backward()
            o.step()
            o.zero_grad()
        after, expected = full_state(fresh, fresh_optim), full_state(model, optim)
        if rank == 0:
            assert_states_equal(after, expected)
        from torch.distributed.checkpoint.state_dict import get_state_dict

        local, local_optim = get_state_dict(fresh, fresh_optim)  # this rank's own (shards, for FSDP2)
        assert set(local_optim["state"]) == set(local), (rank, set(local_optim["state"]), set(local))

        if rank == 0:  # one process commits alone, on purpose: the other ranks do not take part
            plain, _ = make_model("plain", 3)
            alone = repo.commit({"model": plain}, branch="alone", step=0, local=True).wait()
            (path / f"alone-{kind}.txt").write_text(alone.id)


def replicated(path: Path, nodes: bool = False) -> None:
    """Commits of every rank to a repository that replicates: the coordinator's replicator pushes
    them in the background, and rank 0 waits until the remote holds the last one. ``nodes``: each
    rank is a node of its own, writing to a node-local store (``CKPT_NODE_STORE``)."""
    import ckptrepo

    if nodes:
        os.environ["CKPT_NODE_STORE"] = str(path / f"node{dist.get_rank()}")
    model, optim = make_model("ddp", 1)
    with ckptrepo.Repo.open(path) as repo:
        for step in range(1, STEPS + 1):
            model(torch.randn(8, 64)).sum().backward()
            optim.step()
            optim.zero_grad()
            last = repo.commit({"model": model, "optim": optim}, step=step).wait().id
        if dist.get_rank() == 0:
            repo.wait_replicated(last, timeout=60)
            (path / "replicated.txt").write_text(last)
            torch.save(model.module.state_dict(), path / "replicated-model.pt")


def main() -> None:
    kind, path = sys.argv[1], Path(sys.argv[2])
    if kind in ("replicate", "nodes"):
        os.environ.setdefault("CKPT_IDLE_REPACK", "0")
        torch.set_num_threads(1)
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
        try:
            replicated(path, nodes=kind == "nodes")
            dist.barrier()
        finally:
            dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    os.environ.setdefault("CKPT_IDLE_REPACK", "0")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        readme_block(kind, path)
        dist.barrier()  # gloo's thread of the last collective lets go of its tensors first
    finally:
        dist.destroy_process_group()
    # A rank that passed leaves without the interpreter's exit handlers: gloo's threads sometimes
    # still hold a tensor then, and the process would abort after a pass (dist_workers.rank_main).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
