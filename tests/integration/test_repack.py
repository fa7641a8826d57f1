"""Deferred encoding and ``repack``: commits store raw, repack encodes; nothing a user can
read changes, storage shrinks, verify stays clean, and gc keeps retired packs for its grace.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import select
from typer.testing import CliRunner

import ckptrepo
from ckptrepo import errors, faults
from ckptrepo.chunks.codecs import Encoding
from ckptrepo.cli.app import app
from ckptrepo.db import catalog
from ckptrepo.db.models import Chunk, Pack
from ckptrepo.ingest import spare
from ckptrepo.maintenance import repack as packer
from ckptrepo.testing import assert_states_equal, parts

CHUNK = 64 * 1024


def _state(n: int) -> dict[str, Any]:
    """A slowly drifting model (deltas pay) plus a fresh tensor each time, and a bf16 one."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(24 * CHUNK // 4, generator=g) + n * 1e-3 * torch.randn(24 * CHUNK // 4, generator=g)
    head = torch.randn(4 * CHUNK // 4, generator=torch.Generator().manual_seed(100 + n))
    return {"w": w, "head": head, "h16": w[: 8 * CHUNK // 2].to(torch.bfloat16), "n": n}


@pytest.fixture
def repo(tmp_path: Path, db_url: str) -> Iterator[ckptrepo.Repo]:
    with ckptrepo.Repo.init(tmp_path / "work", db_url=db_url, chunk_size=CHUNK, pack_target=8 * CHUNK,
                            idle_repack=False) as r:
        yield r


def _deferred(repo: ckptrepo.Repo) -> list[str]:
    with parts(repo).sessions() as s:
        return list(s.scalars(select(Pack.id).where(Pack.deferred.is_(True), Pack.retired_at.is_(None))))


def _encodings(repo: ckptrepo.Repo) -> dict[int, int]:
    with parts(repo).reading() as s:  # indexes the commits' pending layouts first
        out: dict[int, int] = {}
        for enc in s.scalars(select(Chunk.encoding)):
            out[enc] = out.get(enc, 0) + 1
        return out


def _commit_all(repo: ckptrepo.Repo, n: int) -> list[str]:
    return [repo.commit(_state(i), step=i).wait().id for i in range(n)]


def test_async_commits_store_raw_and_repack_encodes_them(repo: ckptrepo.Repo) -> None:
    ids = _commit_all(repo, 4)
    assert _deferred(repo) and set(_encodings(repo)) == {Encoding.RAW}
    stored_before = repo.stats().stored_bytes
    report = repo.repack()
    assert report.chunks_encoded > 0 and report.delta_chunks > 0 and not report.stopped
    assert report.bytes_after < report.bytes_before and report.packs_retired == report.deferred_packs
    assert not _deferred(repo) and Encoding.DELTA in _encodings(repo)
    assert repo.stats().stored_bytes < stored_before
    for i, cid in enumerate(ids):
        assert_states_equal(repo.checkout(cid), _state(i))
    verified = repo.verify(full=True)
    assert verified.ok and not verified.unreferenced_packs, verified.to_json()
    again = repo.repack()
    assert again.chunks_encoded == 0 and again.packs_written == 0  # nothing left to do


def test_repack_respects_delta_depth_and_root_policy(tmp_path: Path, db_url: str) -> None:
    with ckptrepo.Repo.init(tmp_path / "d", db_url=db_url, chunk_size=CHUNK, max_delta_depth=2,
                            idle_repack=False) as repo:
        _commit_all(repo, 5)
        repo.repack()
        with parts(repo).sessions() as s:
            rows = {c.key: c for c in s.scalars(select(Chunk))}
        for c in rows.values():
            assert c.depth <= 2
            if c.base_key is not None:  # root policy: every base is a standalone keyframe
                assert rows[c.base_key].base_key is None and rows[c.base_key].depth == 0
        for i in range(5):
            assert_states_equal(repo.checkout(f"main@step={i}"), _state(i))


def test_blocking_commits_encode_inline_and_modes(tmp_path: Path, db_url: str) -> None:
    with ckptrepo.Repo.init(tmp_path / "b", db_url=db_url, chunk_size=CHUNK, idle_repack=False) as repo:
        repo.commit(_state(0), blocking=True)
        assert not _deferred(repo) and set(_encodings(repo)) != {Encoding.RAW}
    # Each further repository in its own SQLite file (the fixture's database holds one).
    with ckptrepo.Repo.init(tmp_path / "i", chunk_size=CHUNK, encode="inline") as repo:
        repo.commit(_state(0)).wait()
        assert not _deferred(repo)
    with ckptrepo.Repo.init(tmp_path / "f", chunk_size=CHUNK, encode="deferred") as repo:
        repo.commit(_state(0), blocking=True)
        assert _deferred(repo)
    with ckptrepo.Repo.init(tmp_path / "r", chunk_size=CHUNK, compression=False) as repo:
        repo.commit(_state(0)).wait()
        assert not _deferred(repo) and repo.repack().chunks_encoded == 0
    with pytest.raises(errors.UsageError):
        ckptrepo.Repo.init(tmp_path / "x", encode="later")
    assert not (tmp_path / "x" / ".ckpt").exists()


def test_idle_repack_runs_between_commits(tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Whatever else keeps this machine's cores busy: the spare-CPU gate (tests/unit/test_spare.py) opens.
    monkeypatch.setenv("CKPT_IDLE_REPACK_SPARE", "0")
    with ckptrepo.Repo.init(tmp_path / "w", db_url=db_url, chunk_size=CHUNK, pack_target=8 * CHUNK,
                            idle_repack=True) as repo:
        for i in range(3):
            repo.commit(_state(i), step=i).wait()
        # Left alone, the background repack encodes everything the commits stored raw.
        deadline = time.monotonic() + 120
        while _deferred(repo) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _deferred(repo) and Encoding.DELTA in _encodings(repo)
        # A commit makes a running one give way; what it recorded is complete, the rest waits.
        for i in range(3, 6):
            repo.commit(_state(i), step=i)
        parts(repo).writer._committer.drain()
        for i in range(6):
            assert_states_equal(repo.checkout(f"main@step={i}"), _state(i))
        report = repo.verify(full=True)
        assert report.ok and not report.temporary_files, report.to_json()
        repo.repack()
        assert not _deferred(repo)


def test_dry_run_changes_nothing(repo: ckptrepo.Repo) -> None:
    _commit_all(repo, 2)
    before = (repo.stats(), _deferred(repo))
    report = repo.repack(dry_run=True)
    assert report.dry_run and report.deferred_packs == len(before[1]) and report.packs_written == 0
    assert (repo.stats(), _deferred(repo)) == before


@pytest.mark.parametrize("point", ["repack.chunk", "pack.before_put", "pack.after_put", "repack.before_commit"])
def test_a_failed_repack_changes_nothing(repo: ckptrepo.Repo, point: str) -> None:
    ids = _commit_all(repo, 2)
    before = (repo.stats(), sorted(_deferred(repo)), _encodings(repo))
    with faults.inject(point, "raise"), pytest.raises(faults.InjectedFault):
        repo.repack()
    assert (repo.stats(), sorted(_deferred(repo)), _encodings(repo)) == before
    report = repo.verify(full=True)
    assert report.ok and not report.temporary_files, report.to_json()
    for i, cid in enumerate(ids):
        assert_states_equal(repo.checkout(cid), _state(i))
    assert repo.repack().chunks_encoded > 0  # the next run does the work
    assert repo.verify(full=True).ok


def test_a_failure_after_a_batch_keeps_that_batch(repo: ckptrepo.Repo) -> None:
    ids = _commit_all(repo, 3)
    with faults.inject("repack.after_commit", "raise"), pytest.raises(faults.InjectedFault):
        repo.repack()
    assert repo.verify(full=True).ok
    for i, cid in enumerate(ids):
        assert_states_equal(repo.checkout(cid), _state(i))
    repo.repack()
    assert not _deferred(repo) and repo.verify(full=True).ok


def test_gc_keeps_retired_packs_for_the_grace_period(repo: ckptrepo.Repo) -> None:
    ids = _commit_all(repo, 2)
    old = set(_deferred(repo))
    with parts(repo).reading() as s:  # a reader that looked a location up before the repack
        stale = {c.id: (c.pack_id, c.offset, c.length) for c in s.scalars(select(Chunk).where(Chunk.pack_id.in_(old)))}
    repo.repack()
    kept = repo.gc(grace=3600)
    assert kept.packs_removed == 0 and kept.young_objects_kept >= len(old)
    for pid, offset, length in stale.values():  # old locations still read
        assert len(parts(repo).backend.get_range(f"packs/{pid[:2]}/{pid}.pack", offset, length)) == length
    gone = repo.gc(grace=0)
    assert gone.packs_removed == len(old)
    for i, cid in enumerate(ids):
        assert_states_equal(repo.checkout(cid), _state(i))
    report = repo.verify(full=True)
    assert report.ok and not report.unreferenced_packs


def test_compaction_moves_live_chunks_of_sparse_packs(repo: ckptrepo.Repo) -> None:
    repo.commit(_state(0), step=0).wait()
    repo.branch("side")
    repo.commit(_state(1), step=1, branch="side").wait()
    repo.commit({"only": torch.randn(6 * CHUNK // 4)}, branch="tmp").wait()
    repo.repack()
    repo.delete_branch("tmp", force=True)
    report = repo.gc(grace=0)
    assert report.commits_removed == 1
    assert report.partial_packs > 0
    packed = repo.repack(compact_below=0.9)  # a pack's header and index are the other ~0.1%
    assert packed.sparse_packs == report.partial_packs and packed.chunks_copied > 0
    assert repo.gc(grace=0).partial_packs == 0
    assert_states_equal(repo.checkout("main"), _state(0))
    assert_states_equal(repo.checkout("side"), _state(1))
    assert repo.verify(full=True).ok
    with pytest.raises(errors.UsageError):
        repo.repack(compact_below=2.0)


def test_cli_init_encode_and_repack(tmp_path: Path) -> None:
    runner = CliRunner()

    def ckpt(*args: str) -> Any:
        result = runner.invoke(app, ["--repo", str(tmp_path / "c"), *args], catch_exceptions=False)
        assert result.exit_code == 0, result.stderr
        return result

    assert json.loads(ckpt("init", "--chunk-size", "64KiB", "--encode", "deferred", "--json").stdout)["encode"] == (
        "deferred")
    with ckptrepo.Repo.open(tmp_path / "c") as repo:
        repo.commit(_state(0)).wait()
        repo.commit(_state(1)).wait()
    stats = json.loads(ckpt("stats", "--json").stdout)
    assert stats["awaiting_repack_packs"] > 0 and stats["awaiting_repack_bytes"] > 0
    assert "awaiting repack" in ckpt("stats").stdout
    dry = json.loads(ckpt("repack", "--dry-run", "--json").stdout)
    assert dry["dry_run"] and dry["deferred_packs"] > 0
    done = json.loads(ckpt("repack", "--json").stdout)
    assert done["chunks_encoded"] > 0 and done["bytes_after"] < done["bytes_before"]
    assert "packs retired" in ckpt("repack").stdout
    assert json.loads(ckpt("stats", "--json").stdout)["awaiting_repack_bytes"] == 0
    bad = runner.invoke(app, ["--repo", str(tmp_path / "c"), "repack", "--compact-below", "3"])
    assert bad.exit_code == 2
    with ckptrepo.Repo.open(tmp_path / "c") as repo:
        assert_states_equal(repo.checkout("main"), _state(1))


def test_a_bounded_run_takes_the_oldest_deferred_packs(repo: ckptrepo.Repo) -> None:
    ids = _commit_all(repo, 3)
    with parts(repo).sessions() as s:
        ages = dict(s.execute(select(Pack.id, Pack.created_at).where(Pack.deferred.is_(True))).all())
    p = parts(repo)
    report = packer.repack(p.sessions, p.backend, p.reader, p.pool, repo.config, max_packs=1)
    left = _deferred(repo)
    assert report.deferred_packs == 1 and not report.stopped and len(left) == len(ages) - 1
    taken = (set(ages) - set(left)).pop()
    assert all(ages[taken] <= ages[p] for p in left)
    for i, cid in enumerate(ids):
        assert_states_equal(repo.checkout(cid), _state(i))
    assert repo.verify(full=True).ok


def test_a_run_stopped_before_it_starts_changes_nothing(repo: ckptrepo.Repo) -> None:
    _commit_all(repo, 2)
    before = (repo.stats(), sorted(_deferred(repo)), _encodings(repo))
    p = parts(repo)
    report = packer.repack(p.sessions, p.backend, p.reader, p.pool, repo.config, stop=lambda: True)
    assert report.stopped and report.packs_written == 0
    assert (repo.stats(), sorted(_deferred(repo)), _encodings(repo)) == before


def test_the_background_repack_gives_way_to_a_busy_machine_and_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The gate opened (threshold 0), but then the rest of the machine wants the CPU
    # (spare.BusyWatch, forced here): the repack stops before its first chunk, waits for the
    # next window with spare CPU, tries again, and finishes once the machine is quiet.
    monkeypatch.setenv("CKPT_IDLE_REPACK_SPARE", "0")
    busy, asked = threading.Event(), []
    busy.set()

    def watched(self: spare.BusyWatch) -> bool:
        asked.append(busy.is_set())
        return busy.is_set()

    monkeypatch.setattr(spare.BusyWatch, "busy", watched)
    with ckptrepo.Repo.init(tmp_path / "w", chunk_size=CHUNK, pack_target=8 * CHUNK, idle_repack=True) as repo:
        for i in range(3):
            repo.commit(_state(i), step=i).wait()
        deferred = sorted(_deferred(repo))
        deadline = time.monotonic() + 60
        while asked.count(True) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert asked.count(True) >= 3  # gave way, waited for spare CPU, tried again
        assert sorted(_deferred(repo)) == deferred and Encoding.RAW in _encodings(repo)
        busy.clear()
        deadline = time.monotonic() + 120
        while _deferred(repo) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _deferred(repo) and repo.verify().ok


def test_a_commit_does_not_wait_for_a_background_repack_to_give_way(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A background repack on idle-priority threads that a busy machine starves: it notices
    # ``stop`` late (here: only once the test lets it go). Commits go on meanwhile; gc, repack
    # and verify wait for it to end.
    monkeypatch.setenv("CKPT_IDLE_REPACK_SPARE", "0")
    started, release, ended = threading.Event(), threading.Event(), threading.Event()

    def starved(*args: Any, stop: Any = None, **kw: Any) -> packer.RepackReport:
        started.set()
        release.wait(60)
        ended.set()
        return packer.RepackReport(dry_run=False, deferred_packs=0, sparse_packs=0, packs_read=0, stopped=True)

    monkeypatch.setattr(packer, "repack", starved)
    with ckptrepo.Repo.init(tmp_path / "w", chunk_size=CHUNK, pack_target=8 * CHUNK, idle_repack=True) as repo:
        repo.commit(_state(0), step=0).wait()
        assert started.wait(60)
        second = repo.commit(_state(1), step=1).wait(timeout=30)  # durable while the repack still runs
        assert not ended.is_set() and repo.resolve("main") == second.id
        threading.Timer(0.2, release.set).start()
        assert repo.verify().ok and ended.is_set()


def test_close_waits_for_a_background_repack_before_shutting_its_pools(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The repack winds down after close() asked it to stop, still handing chunks to its
    # encoding threads; close() must not shut those threads (or the backend) down under it.
    monkeypatch.setenv("CKPT_IDLE_REPACK_SPARE", "0")
    started, release = threading.Event(), threading.Event()
    outcome: list[object] = []

    def starved(sessions: Any, backend: Any, reader: Any, pool: Any, *args: Any, **kw: Any) -> packer.RepackReport:
        started.set()
        release.wait(60)
        try:
            outcome.append(pool.submit(lambda: "encoded").result())
        except RuntimeError as exc:  # "cannot schedule new futures after shutdown"
            outcome.append(exc)
        return packer.RepackReport(dry_run=False, deferred_packs=0, sparse_packs=0, packs_read=0, stopped=True)

    monkeypatch.setattr(packer, "repack", starved)
    repo = ckptrepo.Repo.init(tmp_path / "c", chunk_size=CHUNK, pack_target=8 * CHUNK, idle_repack=True,
                              background_priority="idle")
    repo.commit(_state(0), step=0).wait()
    assert started.wait(60)
    stop_committer = parts(repo).writer._committer.close

    def close_committer() -> None:  # the repack goes on only once close() is past this point
        stop_committer()
        threading.Timer(0.2, release.set).start()

    monkeypatch.setattr(parts(repo).writer._committer, "close", close_committer)
    repo.close()
    assert outcome == ["encoded"]


def test_a_delta_base_gone_meanwhile_fails_its_batch(repo: ckptrepo.Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch whose delta bases are no longer in the chunk index when it records its moves (a
    gc elsewhere removed them) fails as a concurrent change; what is stored stays readable and
    a later run does the work."""
    ids = _commit_all(repo, 3)
    found = catalog.chunk_keys_of
    monkeypatch.setattr(catalog, "chunk_keys_of", lambda s, wanted: {})
    with pytest.raises(errors.ConcurrentChange):
        repo.repack()
    monkeypatch.setattr(catalog, "chunk_keys_of", found)
    assert repo.verify(full=True).ok
    for i, cid in enumerate(ids):
        assert_states_equal(repo.checkout(cid), _state(i))
    repo.repack()
    assert not _deferred(repo) and repo.verify(full=True).ok
