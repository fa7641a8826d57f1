"""A training loop SIGKILLed mid-run and resumed from the repository ends bit-identical to one
never stopped: in one process, and on two ranks (gloo, DDP) with one rank killed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ckptrepo

pytest.importorskip("torchdata")

CHILD = Path(__file__).with_name("train_child.py")
STEPS = 38


def run(repo: Path, out: Path, kill_after: int | None = None) -> int:
    """One child run; with ``kill_after``, SIGKILL it once it printed that step. Returns its exit status."""
    proc = subprocess.Popen([sys.executable, str(CHILD), str(repo), str(out), str(STEPS)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if kill_after is not None and line.strip() == f"step {kill_after}":
            proc.send_signal(signal.SIGKILL)
            break
    _, err = proc.communicate(timeout=300)
    if kill_after is None:
        assert proc.returncode == 0, err
    return proc.returncode


@pytest.mark.parametrize("kill_after", [13, pytest.param(22, marks=pytest.mark.slow)])
def test_a_killed_and_resumed_run_equals_an_uninterrupted_one(tmp_path: Path, kill_after: int) -> None:
    run(tmp_path / "straight", tmp_path / "straight.pt")
    assert run(tmp_path / "killed", tmp_path / "killed.pt", kill_after=kill_after) == -signal.SIGKILL
    assert not (tmp_path / "killed.pt").exists()
    with ckptrepo.Repo.open(tmp_path / "killed") as repo:
        resumed_from = repo.get_commit("main").step
    assert resumed_from is not None and 0 < resumed_from <= kill_after
    run(tmp_path / "killed", tmp_path / "killed.pt")  # resumes from the newest durable commit
    straight = torch.load(tmp_path / "straight.pt", weights_only=True)
    resumed = torch.load(tmp_path / "killed.pt", weights_only=True)
    assert straight.keys() == resumed.keys()
    for name, value in straight.items():
        assert torch.equal(value, resumed[name]), name
    with ckptrepo.Repo.open(tmp_path / "killed") as repo:
        steps = [c.step for c in repo.log("main")]
        assert steps[0] == 35 and resumed_from in steps  # the resumed run went on committing on main


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(repo: Path, out: Path, kill_after: int | None = None, world: int = 2) -> list[int]:
    """One run of ``world`` ranks; with ``kill_after``, SIGKILL the last rank once rank 0 printed
    that step (the others then fail on their own or are killed). Returns the exit statuses."""
    env = os.environ | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world),
                        "CKPT_DIST_TIMEOUT": "30"}
    procs = [subprocess.Popen([sys.executable, str(CHILD), str(repo), str(out), str(STEPS)],
                              env=env | {"RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    assert procs[0].stdout is not None
    for line in procs[0].stdout:
        if kill_after is not None and line.strip() == f"step {kill_after}":
            procs[-1].send_signal(signal.SIGKILL)
            break
    errors = []
    for p in procs:
        try:
            errors.append(p.communicate(timeout=120 if kill_after is None else 60)[1])
        except subprocess.TimeoutExpired:  # a survivor stuck on its dead peer: the job is lost anyway
            p.kill()
            errors.append(p.communicate()[1])
    if kill_after is None:
        assert all(p.returncode == 0 for p in procs), "\n".join(errors)
    return [p.returncode for p in procs]


@pytest.mark.parametrize("kill_after", [13, pytest.param(17, marks=pytest.mark.slow)])
def test_two_ranks_killed_and_resumed_equal_an_uninterrupted_run(tmp_path: Path, kill_after: int) -> None:
    """13: resumed mid-epoch from step 10; 17: from step 15, the end of an epoch (3 batches per rank)."""
    run_ranks(tmp_path / "straight", tmp_path / "straight.pt")
    codes = run_ranks(tmp_path / "killed", tmp_path / "killed.pt", kill_after=kill_after)
    assert codes[-1] == -signal.SIGKILL and codes[0] != 0
    with ckptrepo.Repo.open(tmp_path / "killed") as repo:
        head = repo.get_commit("main")
        assert head.config["checkpointer"]["world_size"] == 2
        resumed_from = head.step
        assert resumed_from is not None and 0 < resumed_from <= kill_after
        for commit in repo.log("main"):  # every visible commit is whole
            state = repo.checkout(commit.id)
            assert set(state["ranks"]) == {"0", "1"}
    run_ranks(tmp_path / "killed", tmp_path / "killed.pt")
    for rank in range(2):
        straight = torch.load(f"{tmp_path / 'straight.pt'}.rank{rank}", weights_only=True)
        resumed = torch.load(f"{tmp_path / 'killed.pt'}.rank{rank}", weights_only=True)
        assert straight.keys() == resumed.keys()
        for name, value in straight.items():
            assert torch.equal(value, resumed[name]), (rank, name)
    with ckptrepo.Repo.open(tmp_path / "killed") as repo:
        assert repo.verify(full=True).ok
        steps = [c.step for c in repo.log("main")]
        assert steps[0] == 35 and resumed_from in steps
