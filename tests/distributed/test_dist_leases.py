"""A distributed commit keeps every rank's lease until the coordinator's transaction has ended.

Two ranks commit a replicated tensor that DCP splits over them, so each writes packs of its own;
the coordinator stops itself between its manifest and its transaction while this process runs
``gc(grace=0)``. Every rank's packs are kept (rank 1's lease lasts although its ``write_data``
returned long before), the commit restores bit-exactly, and no lease is left.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

import ckptrepo

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dist_workers import free_port
from lease_workers import plain_state, run


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] in ("T", "t")
    except FileNotFoundError:
        return False


def test_gc_with_grace_0_keeps_every_ranks_packs_until_the_commit_is_recorded(tmp_path: Path) -> None:
    path = tmp_path / "repo"
    ckptrepo.Repo.init(path, chunk_size=64 * 1024).close()
    ctx = mp.start_processes(run, args=(2, free_port(), "paused_commit", str(path), (5,)), nprocs=2, join=False,
                             start_method="spawn")
    joined: list[BaseException] = []

    def join() -> None:
        try:
            while not ctx.join(timeout=1):
                pass
        except BaseException as exc:  # re-raised below
            joined.append(exc)

    waiter = threading.Thread(target=join)
    waiter.start()
    pid_file = tmp_path / "rank0.pid"
    end = time.monotonic() + 180
    while not (pid_file.exists() and pid_file.read_text().strip() and _stopped(int(pid_file.read_text()))):
        assert time.monotonic() < end and waiter.is_alive(), f"the coordinator never stopped: {joined}"
        time.sleep(0.02)
    try:
        with ckptrepo.Repo.open(path) as repo:
            report = repo.gc(grace=0)
    finally:
        os.kill(int(pid_file.read_text()), signal.SIGCONT)
        waiter.join(timeout=180)
    assert not joined and not waiter.is_alive(), joined
    with ckptrepo.Repo.open(path) as repo:
        got = repo.checkout((tmp_path / "commit.txt").read_text())
        assert all(torch.equal(got[k], v) for k, v in plain_state(5).items())
        found = repo.verify(full=True)
        assert found.ok and not found.warnings, found.to_json()
    # Both ranks' leases were live; what they protected: each rank's packs and the manifest.
    assert report.live_leases == 2 and report.leased_objects_kept >= 3, report
    assert not list((path / ".ckpt" / "store" / "leases").glob("*"))
