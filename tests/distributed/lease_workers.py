"""Scenarios of the distributed lease test, run by ``dist_workers.rank_main`` on every rank.

Importing this module (the spawned ranks do, through ``run``) registers them in
``dist_workers.SCENARIOS``.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import dist_workers
import torch
import torch.distributed as dist


def plain_state(seed: int) -> dict[str, torch.Tensor]:
    """One replicated 1 MiB tensor (DCP splits it over the ranks), and a small one."""
    g = torch.Generator().manual_seed(seed)
    return {"big": torch.randn(512, 512, generator=g), "small": torch.randn(7, generator=g)}


def paused_commit(rank: int, world: int, path: Path, seed: int) -> None:
    """``Repo.commit`` on every rank; the coordinator stops itself once its manifest is durable,
    before its transaction (its pid goes to ``rank0.pid``), until the test sends SIGCONT."""
    import ckptrepo
    from ckptrepo import faults

    if rank == 0:
        os.environ[faults.ENV] = "commit.after_manifest=stop"
        importlib.reload(faults)  # arms it as a fresh import would
        (path.parent / "rank0.pid").write_text(str(os.getpid()))
    with ckptrepo.Repo.open(path) as repo:
        commit = repo.commit(plain_state(seed), step=seed, group=dist.group.WORLD).wait()
    if rank == 0:
        (path.parent / "commit.txt").write_text(commit.id)


def run(rank: int, world: int, port: int, scenario: str, path: str, args: tuple[Any, ...]) -> None:
    """``dist_workers.rank_main`` with this module's scenarios registered."""
    dist_workers.rank_main(rank, world, port, scenario, path, args)


dist_workers.SCENARIOS["paused_commit"] = paused_commit
