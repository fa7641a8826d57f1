"""Crash consistency of distributed commits: SIGKILL one rank of a job in a loop of ``dcp.save``s.

Two spawned gloo ranks save DTensor states (seeded, so any process can rebuild them) through
``ckptrepo.dcp.Writer`` in a loop; after a random delay one rank, chosen at random, is killed.
Then, from the outside:

- the surviving rank exits, with an error, within a bounded time (it never hangs);
- every visible commit restores bit-exactly to the state its seed names (no partial commit is
  ever visible), and every commit rank 0 saw acknowledged is visible;
- after ``gc`` (grace 0), ``verify`` finds nothing: the dead rank's and the survivor's packs
  of the interrupted save were unreferenced and are gone.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import ckptrepo

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from dist_workers import free_port, rank_main, reference

KILLS = 10
SURVIVOR_BOUND_S = 90.0  # the workers' process group times out after 60 s; a closed peer is seen at once


def _check(repo_path: Path) -> int:
    acked = {}
    if (repo_path / "acked.txt").exists():
        for line in (repo_path / "acked.txt").read_text().splitlines():
            cid, seed = line.split()
            acked[cid] = int(seed)
    with ckptrepo.Repo.open(repo_path) as repo:
        visible = repo.log()
        assert set(acked) <= {c.id for c in visible}, "an acknowledged commit is missing"
        for commit in visible:
            state = repo.checkout(commit.id)
            expected = reference(state["seed"])
            assert all(torch.equal(state["t"][k], v) for k, v in expected.items()), commit.id
        repo.gc(grace=0)
        report = repo.verify(full=True)
        assert report.ok and not report.warnings, report.to_json()
        return len(visible)


def _acked(repo_path: Path) -> int:
    path = repo_path / "acked.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _wait_for_a_save(repo_path: Path, processes: list[Any], bound_s: float = 180.0) -> None:
    """Until rank 0 acknowledges one more save: both ranks are past their start-up (a rank killed
    before the other reached the rendezvous would test the process group's start, not a save)."""
    before, end = _acked(repo_path), time.monotonic() + bound_s
    while _acked(repo_path) == before:
        assert all(p.is_alive() for p in processes), "a rank died before its first save"
        assert time.monotonic() < end, f"no save in {bound_s} s"
        time.sleep(0.05)


@pytest.mark.parametrize("kills", [3, pytest.param(KILLS, marks=pytest.mark.slow)])
def test_killing_one_rank_mid_save_never_shows_a_partial_commit(tmp_path: Path, kills: int) -> None:
    ckptrepo.Repo.init(tmp_path, chunk_size=4096).close()
    rng = random.Random(7)
    seen = 0
    for kill in range(kills):
        ctx = mp.start_processes(rank_main, args=(2, free_port(), "save_loop", str(tmp_path), (1000,)), nprocs=2,
                                 join=False, start_method="spawn")
        _wait_for_a_save(tmp_path, ctx.processes)  # past start-up (a slow one too): the ranks are saving
        time.sleep(rng.uniform(0.0, 3.0))  # somewhere in the loop of saves
        victim = rng.randrange(2)
        ctx.processes[victim].kill()
        survivor = ctx.processes[1 - victim]
        survivor.join(SURVIVOR_BOUND_S)
        assert not survivor.is_alive(), f"kill {kill}: rank {1 - victim} hung after rank {victim} died"
        assert survivor.exitcode != 0, f"kill {kill}: rank {1 - victim} went on as if nothing happened"
        count = _check(tmp_path)
        assert count >= seen
        seen = count
    assert seen >= 3  # saves completed between the kills
