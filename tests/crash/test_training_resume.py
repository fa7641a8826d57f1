"""A training loop SIGKILLed mid-run and resumed from the repository ends bit-identical to one never stopped."""

from __future__ import annotations

import signal
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


@pytest.mark.parametrize("kill_after", [13, 22])
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
