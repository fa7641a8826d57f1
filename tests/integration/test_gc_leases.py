"""``gc --grace 0`` beside a writer that has put objects no row names yet: its lease keeps them.

A child process commits (blocking, asynchronous with write-ahead, or a file) or repacks, and
stops itself (``CKPT_FAULTS=POINT=stop``) between putting its first staging file or pack and
the transaction that names them; this process runs ``gc(grace=0)`` meanwhile, then resumes it.
The commit is acknowledged and restores bit-exactly, and verify finds nothing. A writer killed
there leaves a lease that no longer holds gc back: the next gc reclaims what it left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

import ckptrepo
from ckptrepo.ledger import leases
from ckptrepo.storage import LocalBackend

CHILD = Path(__file__).with_name("lease_child.py")
sys.path.insert(0, str(CHILD.parent))
from lease_child import CHUNK, PACK_TARGET, state  # noqa: E402


def _init(path: Path, db_url: str) -> None:
    """A repository with one commit (the child's commit shares no chunk with it)."""
    with ckptrepo.Repo.init(path, db_url=db_url, chunk_size=CHUNK, pack_target=PACK_TARGET) as repo:
        repo.commit(state(0), step=0, blocking=True).wait()


def _child(*args: str, faults: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CKPT_FAULTS": faults, "CKPT_IDLE_REPACK": "0", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, str(CHILD), *args], env=env, stderr=subprocess.PIPE)


def _wait_stopped(proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    """Until ``proc`` has stopped itself at its fault point."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"the child ended ({proc.returncode}) before its fault point: {proc.stderr!r}")
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()
        if fields[0] in ("T", "t"):
            return
        time.sleep(0.01)
    raise AssertionError("the child never reached its fault point")


@contextmanager
def _stopped(*args: str, point: str) -> Iterator[subprocess.Popen[bytes]]:
    """A child stopped at ``point``; resumed when the block ends, and checked to exit cleanly."""
    proc = _child(*args, faults=f"{point}=stop")
    try:
        _wait_stopped(proc)
        yield proc
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err.decode()


def _leases(path: Path) -> list[Path]:
    return sorted((path / ".ckpt" / "store" / "leases").glob("*"))


def _clean(repo: ckptrepo.Repo) -> None:
    report = repo.verify(full=True)
    assert report.ok and not report.warnings, report.to_json()


@pytest.mark.parametrize(("how", "point"), [
    ("blocking", "pack.write"),  # its first staging file is being written
    ("blocking", "pack.after_put"),  # its first pack is durable
    ("blocking", "commit.after_manifest"),  # every pack and its manifest are durable
    ("async", "pack.write"),  # the write-ahead's file
    ("async", "pack.after_put"),
    ("async", "commit.after_manifest"),
    ("file", "commit.after_manifest"),
])
def test_gc_with_grace_0_keeps_a_commit_in_flight(tmp_path: Path, db_url: str, how: str, point: str) -> None:
    path, out = tmp_path / "repo", tmp_path / "id.txt"
    _init(path, db_url)
    with _stopped("commit", str(path), how, "7", str(out), point=point):
        assert len(_leases(path)) == 1  # put before the first staging file
        with ckptrepo.Repo.open(path) as repo:
            report = repo.gc(grace=0)
    with ckptrepo.Repo.open(path) as repo:
        got = repo.checkout(out.read_text())
        assert all(torch.equal(got[k], v) for k, v in state(7).items())
        _clean(repo)
    assert report.live_leases == 1 and report.leased_objects_kept >= 1, report
    assert report.unreferenced_packs_removed == report.temporary_files_removed == 0, report
    assert _leases(path) == []  # released after the transaction


def test_gc_with_grace_0_keeps_the_pack_of_a_repack_batch_in_flight(tmp_path: Path, db_url: str) -> None:
    path = tmp_path / "repo"
    _init(path, db_url)
    with ckptrepo.Repo.open(path) as repo:
        ids = {repo.commit(state(s), step=s).wait().id: s for s in (1, 2)}  # raw, for repack to encode
        assert repo.repack(dry_run=True).deferred_packs > 0
    with _stopped("repack", str(path), point="pack.after_put"), ckptrepo.Repo.open(path) as repo:
        report = repo.gc(grace=0)
    with ckptrepo.Repo.open(path) as repo:
        assert repo.repack(dry_run=True).deferred_packs == 0
        for cid, seed in ids.items():
            got = repo.checkout(cid)
            assert all(torch.equal(got[k], v) for k, v in state(seed).items())
        repo.gc(grace=0)  # the packs the repack retired go too
        _clean(repo)
    assert report.live_leases == 1 and report.leased_objects_kept == 1, report
    assert _leases(path) == []


def test_the_lease_of_a_killed_writer_does_not_hold_gc_back(tmp_path: Path, db_url: str) -> None:
    path = tmp_path / "repo"
    _init(path, db_url)
    proc = _child("commit", str(path), "blocking", "7", str(tmp_path / "id.txt"), faults="commit.after_manifest=kill")
    assert proc.wait(timeout=180) == -signal.SIGKILL
    assert len(_leases(path)) == 1
    with ckptrepo.Repo.open(path) as repo:
        assert repo.verify().unreferenced_packs
        report = repo.gc(grace=0)
        assert report.stale_leases_removed == 1 and report.live_leases == report.leased_objects_kept == 0, report
        assert report.unreferenced_packs_removed == 3, report  # its three packs (and its manifest) go
        _clean(repo)
    assert _leases(path) == []


def test_a_lease_of_another_host_holds_gc_back_until_its_ttl(tmp_path: Path, db_url: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "repo"
    _init(path, db_url)
    with ckptrepo.Repo.open(path) as repo:
        store = repo.repo_dir / "store"
    elsewhere = store / "leases" / "00000000000000000001-00000000000000aa.json"
    elsewhere.parent.mkdir(exist_ok=True)
    elsewhere.write_text('{"host": "another-host", "pid": 1, "purpose": "rank 1", "at": 0}')
    proc = _child("commit", str(path), "blocking", "7", str(tmp_path / "id.txt"), faults="commit.after_manifest=kill")
    assert proc.wait(timeout=180) == -signal.SIGKILL
    with ckptrepo.Repo.open(path) as repo:
        report = repo.gc(grace=0)  # what the killed writer left is younger than the live lease
        assert report.live_leases == 1 and report.stale_leases_removed == 1, report
        assert report.leased_objects_kept == 4 and report.unreferenced_packs_removed == 0, report
        monkeypatch.setenv("CKPT_LEASE_TTL", "0")
        report = repo.gc(grace=0)
        assert report.stale_leases_removed == 1 and report.unreferenced_packs_removed == 3, report
        _clean(repo)
    assert _leases(path) == [] and leases.read(LocalBackend(store)) == leases.Leases()


@pytest.mark.parametrize("how", ["blocking", "async"])
def test_a_commit_sharing_chunks_a_gc_removes_meanwhile_writes_them_again_and_lands(tmp_path: Path, db_url: str,
                                                                                      how: str) -> None:
    # The child commits state(7) again while only a pruned commit holds those bytes; it looks them
    # up (they deduplicate), stops before its transaction, and a gc removes them meanwhile. Its
    # transaction then fails on their foreign keys: it writes them again and lands.
    path, out = tmp_path / "repo", tmp_path / "id.txt"
    with ckptrepo.Repo.init(path, db_url=db_url, chunk_size=CHUNK, pack_target=PACK_TARGET) as repo:
        old = repo.commit(state(7), step=0, blocking=True).wait().id
        repo.commit(state(8), step=1, blocking=True).wait()
        assert repo.prune(keep_last=1).pruned == (old,)
    with _stopped("commit", str(path), how, "7", str(out), point="commit.after_manifest"), \
            ckptrepo.Repo.open(path) as repo:
        assert repo.gc(grace=0).chunks_removed >= 12  # every chunk of state(7)
    with ckptrepo.Repo.open(path) as repo:
        got = repo.checkout(out.read_text())
        assert all(torch.equal(got[k], v) for k, v in state(7).items())
        # The first attempt's write-ahead file is a pack no row names (its chunks deduplicated
        # then): a leftover the next gc reclaims, nothing else.
        assert {p.kind for p in repo.verify().warnings} <= {"unreferenced_pack"}
        repo.gc(grace=0)
        _clean(repo)
