"""Deleting refs and garbage collection, on SQLite and PostgreSQL.

Every test checks the two sides of gc: what no ref reaches goes (rows, packs, files), and
every commit a ref still reaches restores bit-exactly afterwards, with verify clean.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import select
from sqlalchemy.orm import aliased
from typer.testing import CliRunner

import ckptrepo
from ckptrepo import faults
from ckptrepo.cli.app import app
from ckptrepo.db.models import Chunk, TensorChunk
from ckptrepo.errors import UnknownRef, UnreachableCommits, UsageError
from ckptrepo.ingest import writer
from ckptrepo.testing import parts

CHUNK = 64 * 1024


@pytest.fixture
def repo(tmp_path: Path, db_url: str) -> Iterator[ckptrepo.Repo]:
    with ckptrepo.Repo.init(tmp_path / "work", db_url=db_url, chunk_size=CHUNK) as r:
        yield r


def _state(seed: int, n: int = 3 * CHUNK // 4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(n, generator=g) * 0.02, "b": torch.arange(16, dtype=torch.float32)}


def _packs(repo: ckptrepo.Repo) -> set[Path]:
    return set((repo.repo_dir / "store" / "packs").rglob("*.pack"))


def _restores(repo: ckptrepo.Repo, expected: dict[str, dict[str, torch.Tensor]]) -> None:
    for rev, state in expected.items():
        got = repo.checkout(rev)
        assert set(got) == set(state)
        for k, v in state.items():
            assert got[k].dtype == v.dtype and torch.equal(got[k], v), (rev, k)
    report = repo.verify(full=True)
    assert report.ok and not report.warnings, report.to_json()


def _abandoned_branch(repo: ckptrepo.Repo, s0: dict[str, torch.Tensor], s1: dict[str, torch.Tensor]) -> str:
    """Commit ``s0`` on main and ``s1`` on a branch ``exp`` from it, then delete ``exp``:
    its commit is garbage. Returns main's commit id."""
    a = repo.commit(s0, step=1, blocking=True).wait()
    repo.branch("exp", at=a.id)
    repo.commit(s1, branch="exp", step=2, blocking=True).wait()
    repo.delete_branch("exp", force=True)
    return a.id


def test_deleting_a_branch_with_unique_commits_needs_force(repo: ckptrepo.Repo) -> None:
    a = repo.commit(_state(0), step=1, blocking=True).wait()
    repo.branch("exp", at=a.id)
    repo.commit(_state(1), branch="exp", step=2, blocking=True).wait()
    before = repo.stats()
    with pytest.raises(UnreachableCommits, match="1 commit"):
        repo.delete_branch("exp")
    assert [b.name for b in repo.branches()] == ["exp", "main"]
    with pytest.raises(UnknownRef):
        repo.delete_branch("nope")
    # A branch whose commits another ref reaches goes without force.
    repo.branch("same", at=a.id)
    assert repo.delete_branch("same").commit_id == a.id
    assert repo.stats() == before


def test_gc_removes_only_what_no_ref_reaches(repo: ckptrepo.Repo) -> None:
    s0, s1, s2 = _state(0), _state(1), _state(2)
    a = repo.commit(s0, step=1, blocking=True).wait()
    repo.branch("exp", at=a.id)
    repo.commit(s1, branch="exp", step=2, blocking=True).wait()
    e2 = repo.commit(s2, branch="exp", step=3, blocking=True).wait()
    repo.tag("keep", at=e2.id)
    main2 = repo.commit(s1 | {"extra": torch.ones(5)}, step=2, blocking=True).wait()  # shares s1's chunks
    packs_before = _packs(repo)
    sizes = {p: p.stat().st_size for p in packs_before}

    assert repo.gc(grace=0).commits_removed == 0  # everything reachable: nothing goes
    assert _packs(repo) == packs_before

    repo.delete_branch("exp", force=True)
    dry = repo.gc(grace=0, dry_run=True)
    assert dry.commits_removed == 0 and _packs(repo) == packs_before  # the tag keeps exp's commits

    repo.delete_tag("keep", force=True)
    stats = repo.stats()
    dry = repo.gc(grace=0, dry_run=True)
    assert (dry.commits_removed, dry.dry_run) == (2, True)
    assert repo.stats() == stats and _packs(repo) == packs_before

    report = repo.gc(grace=0)
    assert report.commits_removed == 2
    assert report.tensors_removed == 1  # s2's "w"; s1's is main2's too, "b" is everyone's
    assert report.chunks_removed == dry.chunks_removed > 0
    assert report.bytes_freed == sum(sizes[p] for p in packs_before - _packs(repo)) > 0
    after = repo.stats()
    assert after.commits == 2 and after.pack_bytes < stats.pack_bytes
    _restores(repo, {a.id: s0, main2.id: s1 | {"extra": torch.ones(5)}})
    assert repo.gc(grace=0).commits_removed == 0


def test_gc_keeps_the_delta_base_of_a_chunk_a_live_commit_shares(tmp_path: Path, db_url: str) -> None:
    """exp: P then X, X's chunks stored as deltas against P's. main then commits X's exact
    state (deduplicated to X's delta chunks). Deleting exp makes P garbage, but P's chunks
    are still the bases of chunks main needs."""
    with ckptrepo.Repo.init(tmp_path / "d", db_url=db_url, chunk_size=CHUNK, delta_base="parent") as repo:
        base = repo.commit({"seed": torch.zeros(4)}, step=0, blocking=True).wait()
        repo.branch("exp", at=base.id)
        p_state = _state(5, n=4 * CHUNK // 4)
        x_state = {"w": p_state["w"] + 1e-6 * torch.randn(p_state["w"].shape), "b": p_state["b"]}
        repo.commit(p_state, branch="exp", step=1, blocking=True).wait()
        repo.commit(x_state, branch="exp", step=2, blocking=True).wait()
        y = repo.commit(x_state, step=3, blocking=True).wait()
        with parts(repo).sessions() as s:
            base_chunk = aliased(Chunk)
            deltas = s.scalars(select(base_chunk.id).join(Chunk, Chunk.base_key == base_chunk.key)
                               .join(TensorChunk, TensorChunk.chunk_key == Chunk.key)).all()
        assert deltas, "expected X's chunks to be stored as deltas against P's"
        repo.delete_branch("exp", force=True)
        report = repo.gc(grace=0)
        assert report.commits_removed == 2 and report.tensors_removed == 1  # P's "w" row goes ...
        with parts(repo).sessions() as s:
            kept = set(s.scalars(select(Chunk.id).where(Chunk.id.in_(deltas))))
        assert kept == set(deltas)  # ... but not its chunks: they are the bases of Y's
        _restores(repo, {y.id: x_state, base.id: {"seed": torch.zeros(4)}})


def test_unreferenced_packs_and_temporary_files_go_after_the_grace_period(repo: ckptrepo.Repo) -> None:
    s0 = _state(0)
    a = repo.commit(s0, step=1, blocking=True).wait()
    store = repo.repo_dir / "store"
    old_pack = store / "packs" / "ab" / ("ab" + "1" * 62 + ".pack")
    young_pack = store / "packs" / "cd" / ("cd" + "2" * 62 + ".pack")
    stranger = store / "packs" / "notes.txt"  # not a pack name: gc leaves what it does not know
    staging = store / ".staging"
    staging.mkdir(exist_ok=True)
    old_tmp, young_tmp = staging / "pack-old.tmp", staging / "pack-young.tmp"
    for path in (old_pack, young_pack, stranger, old_tmp, young_tmp):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 1000)
    hour_ago = time.time() - 3600
    for path in (old_pack, stranger, old_tmp):
        os.utime(path, (hour_ago, hour_ago))

    dry = repo.gc(grace=600, dry_run=True)
    assert (dry.unreferenced_packs_removed, dry.temporary_files_removed) == (1, 1)
    assert old_pack.exists() and old_tmp.exists()

    report = repo.gc(grace=600)
    assert (report.unreferenced_packs_removed, report.temporary_files_removed) == (1, 1)
    assert report.young_objects_kept == 1 and report.bytes_freed == 2000
    assert not old_pack.exists() and not old_tmp.exists()
    assert young_pack.exists() and young_tmp.exists() and stranger.exists()
    young_pack.unlink()
    young_tmp.unlink()
    stranger.unlink()
    _restores(repo, {a.id: s0})


def test_a_young_pack_whose_commit_went_stays_until_a_later_gc(repo: ckptrepo.Repo) -> None:
    a = _abandoned_branch(repo, _state(0), _state(1))
    packs = _packs(repo)
    first = repo.gc(grace=3600)
    assert first.commits_removed == 1 and first.packs_removed == 0 and first.young_objects_kept == 1
    assert _packs(repo) == packs  # rows gone, the young pack kept
    assert [w.kind for w in repo.verify().warnings] == ["unreferenced_pack"]  # reported meanwhile
    second = repo.gc(grace=0)
    assert second.unreferenced_packs_removed == 1 and len(_packs(repo)) == len(packs) - 1
    _restores(repo, {a: _state(0)})


def test_a_gc_interrupted_after_its_transaction_leaves_only_unreferenced_packs(repo: ckptrepo.Repo) -> None:
    a = _abandoned_branch(repo, _state(0), _state(1))
    packs = _packs(repo)
    with faults.inject("gc.after_commit"), pytest.raises(faults.InjectedFault):
        repo.gc(grace=0)
    assert _packs(repo) == packs and repo.stats().commits == 1
    report = repo.verify()
    # And the removed commit's manifest (ledger.manifest), which the next gc deletes too.
    assert report.ok and [w.kind for w in report.warnings] == ["unreferenced_pack", "unreferenced_manifest"]
    assert repo.gc(grace=0).unreferenced_packs_removed == 1
    assert not repo.verify().warnings
    _restores(repo, {a: _state(0)})


def test_a_commit_that_deduplicated_against_collected_chunks_writes_them_again(
        tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with ckptrepo.Repo.init(tmp_path / "c", db_url=db_url, chunk_size=CHUNK) as repo, \
            ckptrepo.Repo.open(tmp_path / "c") as other:
        s0, s1 = _state(0), _state(1)
        a = _abandoned_branch(repo, s0, s1)
        original = writer.commit_row
        gcs: list[int] = []

        # Another process's gc runs after this commit looked up s1's chunks and before it records
        # them: its transaction fails, and the commit writes the chunks gc removed again and lands.
        def gc_once(*args: Any, **kwargs: Any) -> Any:
            if not gcs:
                gcs.append(other.gc(grace=0).chunks_removed)
            return original(*args, **kwargs)

        with monkeypatch.context() as patched:
            patched.setattr(writer, "commit_row", gc_once)
            again = repo.commit(s1, step=2, blocking=True).wait()
        assert gcs[0] > 0
        _restores(repo, {a: s0, again.id: s1})


def test_cli_branch_and_tag_delete_and_gc(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    runner = CliRunner()
    root = tmp_path / "cli"
    root.mkdir()
    for i in range(2):
        save_file(_state(i), str(root / f"s{i}.safetensors"))

    def ckpt(*args: str) -> Any:
        return runner.invoke(app, ["--repo", str(root), *args])

    assert ckpt("init", str(root)).exit_code == 0
    assert ckpt("commit", str(root / "s0.safetensors"), "--step", "1").exit_code == 0
    assert ckpt("checkout", "-b", "exp").exit_code == 0
    assert ckpt("commit", str(root / "s1.safetensors"), "--step", "2").exit_code == 0
    current = ckpt("branch", "-d", "exp")
    assert current.exit_code == UsageError.exit_code and "current branch" in current.output
    assert ckpt("checkout", "main").exit_code == 0
    refused = ckpt("branch", "-d", "exp")
    assert refused.exit_code == UnreachableCommits.exit_code and "--force" in refused.output
    assert ckpt("branch", "-d", "exp", "--force").exit_code == 0
    assert ckpt("tag", "v1").exit_code == 0
    assert ckpt("tag", "--force", "v1").exit_code == UsageError.exit_code
    assert ckpt("tag", "-d", "v1").exit_code == 0
    assert ckpt("tag", "-d", "v1").exit_code == UnknownRef.exit_code
    dry = ckpt("gc", "--dry-run", "--grace", "0")
    assert dry.exit_code == 0 and "would remove" in dry.output
    done = ckpt("gc", "--grace", "0", "--json")
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["commits_removed"] == 1 and report["bytes_freed"] > 0 and report["dry_run"] is False
    assert ckpt("verify").exit_code == 0
    assert ckpt("gc", "--grace", "-1").exit_code == 2
