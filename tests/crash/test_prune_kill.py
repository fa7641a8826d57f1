"""Crash consistency of retention: SIGKILL a process in the middle of prune and of the gc of pruned
data, at each of their fault points and at random moments.

After each kill: every visible commit that is not pruned restores bit-exactly to the state its
``counter`` metric names, every pruned one refuses (CommitPruned), no branch head is pruned,
refs name existing commits and ``verify()`` finds no error; then a repeated prune and gc
complete. The child is ``child_prune.py``, a real process armed through ``CKPT_FAULTS``.
"""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
import torch

import ckptrepo
from ckptrepo import faults
from ckptrepo.ledger import journal
from ckptrepo.testing import parts

CHILD = Path(__file__).with_name("child_prune.py")
RANDOM_KILLS = 6
RANDOM_SEED = 20261128


def _load_child() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ckpt_prune_child", CHILD)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


child = _load_child()


def _env(spec: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != faults.ENV}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if spec:
        env[faults.ENV] = spec
    return env


def _run(*args: str, spec: str = "") -> int:
    proc = subprocess.run([sys.executable, str(CHILD), *args], env=_env(spec), timeout=120, capture_output=True)
    assert proc.returncode in (0, -signal.SIGKILL), proc.stderr.decode()[-2000:]
    return proc.returncode


def _check(path: Path, label: str) -> tuple[int, int]:
    """The invariants after a kill; returns (commits, pruned)."""
    with ckptrepo.Repo.open(path) as repo:
        commits = repo.log()
        ids = {c.id for c in commits}
        heads = {b.commit_id for b in repo.branches()}
        assert heads <= ids, f"{label}: a ref names a missing commit"
        pruned = [c for c in commits if c.pruned]
        for c in pruned[:1] + pruned[-1:]:  # (each refusal walks to the nearest commit with data)
            with pytest.raises(ckptrepo.errors.CommitPruned):
                repo.checkout(c.id)
        for c in commits:
            n = int(c.metrics["counter"])
            if c.pruned:
                assert c.id not in heads, f"{label}: head {n} pruned"
                continue
            got, want = repo.checkout(c.id), child.expected_state(n)
            assert all(torch.equal(got[k], v) for k, v in want.items()), f"{label}: commit {n} restores wrong"
        report = repo.verify()
        assert report.ok, (label, report.to_json())
        return len(commits), sum(c.pruned for c in commits)


def _prune_entries(path: Path) -> int:
    with ckptrepo.Repo.open(path) as repo:
        return sum(e["op"] == "prune" for _, e in journal.entries(parts(repo).backend))


def test_kill_prune_and_gc_at_their_fault_points(tmp_path: Path) -> None:
    path = tmp_path / "repo"
    assert _run("commit", str(path), "8") == 0
    assert _check(path, "start") == (8, 0)

    # Killed inside the transaction that marks: nothing is pruned (its journal entry stays: a
    # rebuild applies it, as the change was about to commit).
    assert _run("prune", str(path), spec="prune.before_commit=kill") == -signal.SIGKILL
    assert _check(path, "prune.before_commit") == (8, 0)
    assert _prune_entries(path) == 1

    # Killed right after it committed: the marks are there, no data went.
    assert _run("prune", str(path), spec="prune.after_commit=kill") == -signal.SIGKILL
    assert _check(path, "prune.after_commit") == (8, 6)
    assert _prune_entries(path) == 2
    with ckptrepo.Repo.open(path) as repo:
        stored = repo.stats().stored_bytes

    # gc of the pruned data, killed before and after its transaction commits.
    assert _run("gc", str(path), spec="gc.before_commit=kill") == -signal.SIGKILL
    assert _check(path, "gc.before_commit") == (8, 6)
    with ckptrepo.Repo.open(path) as repo:
        assert repo.stats().stored_bytes == stored  # rolled back
    assert _run("gc", str(path), spec="gc.after_commit=kill") == -signal.SIGKILL
    assert _check(path, "gc.after_commit") == (8, 6)
    with ckptrepo.Repo.open(path) as repo:
        assert repo.stats().stored_bytes < stored
        assert repo.verify().unreferenced_packs  # the packs whose rows went: the next gc deletes them

    # Repeated prune and gc complete.
    assert _run("commit", str(path), "2") == 0
    assert _run("prune", str(path)) == 0
    assert _run("gc", str(path)) == 0
    assert _check(path, "end") == (10, 8)
    with ckptrepo.Repo.open(path) as repo:
        report = repo.verify(full=True)
        assert report.ok and not report.warnings, report.to_json()


@pytest.mark.slow
def test_kill_a_commit_prune_gc_loop_at_random_moments(tmp_path: Path) -> None:
    rng = random.Random(RANDOM_SEED)
    path = tmp_path / "loop"
    assert _run("commit", str(path), "3") == 0
    seen = 3
    for k in range(RANDOM_KILLS):
        proc = subprocess.Popen([sys.executable, str(CHILD), "loop", str(path)], env=_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(2.5, 5.0))  # past the imports, into the loop
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
        commits, pruned = _check(path, f"random kill {k}")
        assert commits >= seen
        seen = commits
    assert _run("prune", str(path)) == 0 and _run("gc", str(path)) == 0
    commits, pruned = _check(path, "random end")
    assert pruned == commits - 2 and commits > 3
    with ckptrepo.Repo.open(path) as repo:
        report = repo.verify(full=True)
        assert report.ok and not report.warnings, report.to_json()
