"""A push or a fetch killed part-way (SIGKILL of a real process at each fault point, and while a
clone fetches) never shows half of itself: the remote's refs name only commits whose manifests
and data are all there, a clone of it restores every commit it shows bit-exactly, and running
the push or fetch again completes it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptrepo
from ckptrepo import faults
from ckptrepo.testing import assert_states_equal

CHUNK = 16 * 1024
PUSH = "import sys, ckptrepo\nckptrepo.Repo.open(sys.argv[1]).push('origin')\n"
FETCH = "import sys, ckptrepo\nckptrepo.Repo.open(sys.argv[1]).fetch('origin')\n"


def _state(i: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(i)
    return {"w": torch.randn(CHUNK, generator=g), "i": torch.tensor(i)}


def _killed(code: str, repo_dir: Path, point: str) -> None:
    env = {**__import__("os").environ, faults.ENV: f"{point}=kill"}
    done = subprocess.run([sys.executable, "-c", code, str(repo_dir)], env=env, capture_output=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()


@pytest.mark.parametrize("point", ["push.after_packs", "push.after_manifests", "push.after_refs"])
def test_a_killed_push_shows_nothing_half_done(tmp_path: Path, point: str) -> None:
    remote = tmp_path / "remote"
    states: dict[str, Any] = {}
    with ckptrepo.Repo.init(tmp_path / "a", chunk_size=CHUNK) as repo:
        states.update({repo.commit(_state(i), step=i).wait().id: _state(i) for i in range(2)})
        repo.add_remote("origin", str(remote))
        repo.push()
        states.update({repo.commit(_state(i), step=i).wait().id: _state(i) for i in range(2, 4)})
        head = repo.resolve("main")
    _killed(PUSH, tmp_path / "a", point)
    with ckptrepo.Repo.clone(str(remote), tmp_path / "b") as clone:
        shown = clone.resolve("main")
        assert shown == head if point == "push.after_refs" else shown != head
        for c in clone.log("main"):
            assert_states_equal(clone.checkout(c.id), states[c.id])
    with ckptrepo.Repo.open(tmp_path / "a") as repo:
        repo.push()  # completes it
        assert repo.push().packs == 0
    with ckptrepo.Repo.clone(str(remote), tmp_path / "c") as clone:
        assert clone.resolve("main") == head
        for cid, s in states.items():
            assert_states_equal(clone.checkout(cid), s)
        assert clone.verify(full=True).ok


@pytest.mark.parametrize("point", ["fetch.before_commit", "fetch.after_commit"])
def test_a_killed_fetch_changes_nothing_or_everything(tmp_path: Path, point: str) -> None:
    remote = tmp_path / "remote"
    states: dict[str, Any] = {}
    with ckptrepo.Repo.init(tmp_path / "a", chunk_size=CHUNK) as repo:
        states.update({repo.commit(_state(i), step=i).wait().id: _state(i) for i in range(2)})
        repo.add_remote("origin", str(remote))
        repo.push()
    ckptrepo.Repo.clone(str(remote), tmp_path / "b").close()
    with ckptrepo.Repo.open(tmp_path / "a") as repo:
        states.update({repo.commit(_state(i), step=i).wait().id: _state(i) for i in range(2, 5)})
        repo.push()
        head = repo.resolve("main")
    _killed(FETCH, tmp_path / "b", point)
    with ckptrepo.Repo.open(tmp_path / "b") as clone:
        moved = clone.resolve("origin/main")
        assert (moved == head) == (point == "fetch.after_commit")
        assert clone.verify().ok
        clone.fetch()
        assert clone.resolve("origin/main") == head
        for cid, s in states.items():
            assert_states_equal(clone.checkout(cid), s)
