"""The store as the source of truth: ``Repo.rebuild_database`` / ``ckpt db rebuild`` recreate the
database from packs, commit manifests and the journal, on SQLite and PostgreSQL, with a local
store and with an S3 store.

Every test loses the database (the SQLite file deleted, or every table of the PostgreSQL
schema dropped), rebuilds it, and checks that what a user sees is what it was: the log with
parents, edge kinds, refs and metrics; branches and tags; tensor histories; every commit
restoring bit-exactly; ``verify --full`` clean.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

import ckptrepo
from ckptrepo.cli.app import app
from ckptrepo.db import migrate
from ckptrepo.db.engine import database_url, make_engine
from ckptrepo.errors import CommitDamaged, RepositoryExists
from ckptrepo.ledger import fields, journal, manifest
from ckptrepo.testing import parts

CHUNK = 16 * 1024


def _state(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(3 * CHUNK // 4, generator=g), "b": torch.arange(8, dtype=torch.int64)},
            "step": seed}


def _lineage(repo: ckptrepo.Repo) -> dict[str, dict[str, Any]]:
    """Commits on main, a branch from its middle, a merge, a transfer onto another branch, a
    tag, a deleted branch and a forced branch move; returns every commit's state by id."""
    states: dict[str, dict[str, Any]] = {}
    ids = []
    for i in range(4):
        s = _state(i)
        ids.append(repo.commit(s, step=i * 10, metrics={"loss": 1.0 / (i + 1)}, message=f"main {i}").wait().id)
        states[ids[-1]] = s
    repo.branch("exp", at=ids[1])
    repo.tag("v1", at=ids[2])
    s = _state(10)
    x = repo.commit(s, branch="exp", step=15, metrics={"loss": 0.3}).wait()
    states[x.id] = s
    s = _state(11)
    merge = repo.commit(s, branch="main", parents=[ids[-1], x.id], message="merge exp").wait()
    states[merge.id] = s
    s = {"head": torch.ones(5)}
    t = repo.commit(s, branch="ft", transfer_from=(ids[0], {"head": "model/b"}), step=0).wait()
    states[t.id] = s
    repo.branch("gone", at=ids[0])
    repo.delete_branch("gone")
    repo.branch("moved", at=ids[0])
    repo.branch("moved", at=ids[3], force=True)
    return states


def _view(repo: ckptrepo.Repo) -> dict[str, Any]:
    commits = repo.log()
    return {
        "log": [(c.id, c.message, c.step, c.branch, c.created_at, [(p.id, p.kind, p.mapping) for p in c.parents],
                 sorted(c.refs), c.metrics, c.logical_bytes, c.stored_bytes) for c in commits],
        "branches": [(b.name, b.commit_id) for b in repo.branches()],
        "tags": [(b.name, b.commit_id) for b in repo.tags()],
        "history": [(h.commit_id, h.chunks_changed, h.tensor) for h in repo.history("model/w", along="main")],
        "tensors": {c.id: repo.tensors(c.id) for c in commits},
    }


def _restores(repo: ckptrepo.Repo, states: dict[str, dict[str, Any]]) -> None:
    for cid, state in states.items():
        got = repo.checkout(cid)
        flat_got, flat_want = _flat(got), _flat(state)
        assert flat_got.keys() == flat_want.keys(), cid
        for k, v in flat_want.items():
            if isinstance(v, torch.Tensor):
                assert flat_got[k].dtype == v.dtype and torch.equal(flat_got[k], v), (cid, k)
            else:
                assert flat_got[k] == v
    report = repo.verify(full=True)
    assert report.ok and not report.warnings, report.to_json()


def _flat(state: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in state.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}/"))
        else:
            out[prefix + k] = v
    return out


def _lose_database(repo_dir: Path, db_url: str | None) -> None:
    """The database is gone: the SQLite file deleted, or the PostgreSQL schema's tables dropped."""
    url = database_url(db_url, repo_dir)
    if url.startswith("sqlite"):
        for suffix in ("", "-wal", "-shm"):
            Path(f"{repo_dir / 'db.sqlite'}{suffix}").unlink(missing_ok=True)
        return
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            migrate.drop_schema(conn)
    finally:
        engine.dispose()


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_lost_database_comes_back_from_the_store(tmp_path: Path, db_url: str, where: str,
                                                   request: pytest.FixtureRequest) -> None:
    store_url = request.getfixturevalue("s3_url") if where == "s3" else None
    kept_db_url = None if db_url.startswith("sqlite") else db_url
    with ckptrepo.Repo.init(tmp_path / "work", db_url=kept_db_url, store_url=store_url, chunk_size=CHUNK) as repo:
        states = _lineage(repo)
        before = _view(repo)
        repo_dir = repo.repo_dir
    _lose_database(repo_dir, kept_db_url)
    with pytest.raises(ckptrepo.errors.CkptError):
        ckptrepo.Repo.open(repo_dir).log()

    report = ckptrepo.Repo.rebuild_database(repo_dir)
    assert report.commits == len(before["log"]) and not report.skipped
    assert report.branches == len(before["branches"]) and report.tags == 1 and report.moved_aside is None
    with ckptrepo.Repo.open(repo_dir) as repo:
        assert _view(repo) == before
        _restores(repo, states)
        # The rebuilt repository works on: a commit lands on top of main's head.
        head = repo.get_commit("main").id
        assert repo.commit(_state(99), step=99).wait().parent_ids == [head]


def test_a_rebuild_refuses_a_database_holding_a_repository_unless_told(tmp_path: Path, db_url: str) -> None:
    kept_db_url = None if db_url.startswith("sqlite") else db_url
    with ckptrepo.Repo.init(tmp_path / "work", db_url=kept_db_url, chunk_size=CHUNK) as repo:
        states = _lineage(repo)
        before = _view(repo)
        repo_dir = repo.repo_dir
    with pytest.raises(RepositoryExists) as refused:
        ckptrepo.Repo.rebuild_database(repo_dir)
    assert "replace" in refused.value.hint
    report = ckptrepo.Repo.rebuild_database(repo_dir, replace=True)
    if kept_db_url is None:  # the old file is kept beside the new one, and still opens
        assert report.moved_aside is not None and Path(report.moved_aside).is_file()
        old = make_engine(database_url(f"sqlite:///{report.moved_aside}", repo_dir))
        with old.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM commits").scalar() == len(before["log"])
        old.dispose()
    with ckptrepo.Repo.open(repo_dir) as repo:
        assert _view(repo) == before
        _restores(repo, states)


def test_what_gc_removed_stays_removed_and_repacked_chunks_are_found(tmp_path: Path, db_url: str) -> None:
    kept_db_url = None if db_url.startswith("sqlite") else db_url
    with ckptrepo.Repo.init(tmp_path / "work", db_url=kept_db_url, chunk_size=CHUNK, encode="deferred") as repo:
        states = {}
        for i in range(3):
            s = _state(i)
            states[repo.commit(s, step=i).wait().id] = s
        repo.branch("scrap", at="main")
        gone = repo.commit(_state(50), branch="scrap").wait().id
        repo.delete_branch("scrap", force=True)
        repo.repack()  # the deferred chunks move to new, encoded packs; the old ones are retired
        report = repo.gc(grace=0)
        assert report.commits_removed == 1
        assert not repo.repo_dir.joinpath("store", manifest.key_of(gone)).exists()
        before = _view(repo)
        repo_dir = repo.repo_dir
    _lose_database(repo_dir, kept_db_url)
    report = ckptrepo.Repo.rebuild_database(repo_dir)
    assert report.commits == 3 and not report.skipped
    with ckptrepo.Repo.open(repo_dir) as repo:
        assert _view(repo) == before
        _restores(repo, states)


def test_an_interrupted_commit_leaves_a_manifest_that_gc_reclaims(tmp_path: Path) -> None:
    from ckptrepo import faults

    with ckptrepo.Repo.init(tmp_path / "work", chunk_size=CHUNK) as repo:
        first = repo.commit(_state(0)).wait().id
        with faults.inject("db.before_commit", "raise"), pytest.raises(faults.InjectedFault):
            repo.commit(_state(1)).wait()
        # A failed transaction takes its manifest back.
        assert list(manifest.stored_ids(parts(repo).backend)) == [first]
    # A process killed between its manifest and its transaction leaves the manifest: a rebuild
    # would show that commit (its data is durable); gc reclaims it once past its grace period.
    with ckptrepo.Repo.open(tmp_path / "work") as repo:
        body = manifest.read(parts(repo).backend, first)
        orphan = dict(body, id="")
        orphan["commit"] = dict(body["commit"], message="never recorded")
        c = orphan["commit"]
        orphan["id"] = manifest.commit_id(entries=orphan["entries"], skeleton=c["skeleton"], edges=orphan["edges"],
                                          message=c["message"], step=c["step"], epoch=c["epoch"],
                                          metrics=orphan["metrics"], config=c["config"],
                                          created_at=c["created_at"], author=c["author"], host=c["host"])
        manifest.write(parts(repo).backend, orphan)
        assert repo.gc().commits_removed == 0  # young: kept
        assert manifest.key_of(orphan["id"]) in set(parts(repo).backend.list("manifests/"))
        repo.gc(grace=0)
        assert list(manifest.stored_ids(parts(repo).backend)) == [first]


def test_a_manifest_that_does_not_match_its_commit_is_skipped_reported_and_kept_as_a_damaged_node(
        tmp_path: Path) -> None:
    with ckptrepo.Repo.init(tmp_path / "work", chunk_size=CHUNK) as repo:
        a = repo.commit(_state(0), step=1).wait().id
        b = repo.commit(_state(1), step=2).wait().id
        key = manifest.key_of(b)
        body = manifest.read(parts(repo).backend, b)
        body["commit"]["step"] = 3  # tampered, checksum made to match: no longer hashes to b
        body["checksum"] = fields.checksum(body)
        parts(repo).backend.put_bytes(key, manifest.encode(body))
        repo_dir = repo.repo_dir
    _lose_database(repo_dir, None)
    report = ckptrepo.Repo.rebuild_database(repo_dir)
    assert not report.ok and report.damaged == 1 and any("does not hash" in why for why in report.skipped)
    with ckptrepo.Repo.open(repo_dir) as repo:
        # main's move to b is lost with b's manifest: main is where the last valid move left it.
        assert [c.id for c in repo.log("main")] == [a] and repo.get_commit("main").id == a
        assert "damaged" in (repo.get_commit(b).damage or "")
        with pytest.raises(CommitDamaged):
            repo.checkout(b)
        assert not repo.verify().ok


def test_ckpt_db_rebuild(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with ckptrepo.Repo.init(tmp_path, chunk_size=CHUNK) as repo:
        states = _lineage(repo)
        before = _view(repo)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    refused = runner.invoke(app, ["db", "rebuild"])
    assert refused.exit_code == 4 and "--replace" in refused.output, refused.output
    os.remove(tmp_path / ".ckpt" / "db.sqlite")
    result = runner.invoke(app, ["db", "rebuild", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["commits"] == len(before["log"]) and data["skipped"] == []
    assert data["manifest_bytes"] > 0 and data["conflicts"] == 0
    shown = runner.invoke(app, ["db", "rebuild", "--replace"])
    assert shown.exit_code == 0 and "kept as" in shown.output, shown.output
    with ckptrepo.Repo.open(tmp_path) as repo:
        assert _view(repo) == before
        _restores(repo, states)


def test_ref_changes_are_journalled_before_their_transaction(tmp_path: Path) -> None:
    with ckptrepo.Repo.init(tmp_path / "work", chunk_size=CHUNK) as repo:
        a = repo.commit(_state(0)).wait().id
        repo.branch("x", at=a)
        repo.tag("t", at=a)
        with pytest.raises(ckptrepo.errors.RefExists):
            repo.tag("t", at=a)  # refused in its transaction: its entry is taken back
        repo.delete_branch("x")
        got = [(e["op"], e["kind"], e["name"], e["to"]) for _, e in journal.entries(parts(repo).backend)]
    assert got == [("ref", "branch", "x", a), ("ref", "tag", "t", a), ("ref", "branch", "x", None)]


@pytest.mark.parametrize("collected", [False, True], ids=["marked", "collected"])
def test_pruned_commits_come_back_pruned(tmp_path: Path, db_url: str, collected: bool) -> None:
    """Pruned commits stay lineage nodes through a rebuild: marked by the journal's prune entry
    (before gc, when their data is still stored) or by their chunks being gone (after gc)."""
    kept_db_url = None if db_url.startswith("sqlite") else db_url
    with ckptrepo.Repo.init(tmp_path / "work", db_url=kept_db_url, chunk_size=CHUNK) as repo:
        states = {}
        for i in range(6):
            s = _state(i)
            states[repo.commit(s, step=i * 10, metrics={"loss": 1.0 / (i + 1)}).wait().id] = s
        report = repo.prune(keep_last=2)
        assert len(report.pruned) == 4
        if collected:
            assert repo.gc(grace=0).bytes_freed > 0
        before = _view(repo)
        flags = {c.id: c.pruned for c in repo.log()}
        repo_dir = repo.repo_dir
    _lose_database(repo_dir, kept_db_url)
    rebuilt = ckptrepo.Repo.rebuild_database(repo_dir)
    assert rebuilt.pruned == 4 and not rebuilt.skipped
    with ckptrepo.Repo.open(repo_dir) as repo:
        assert _view(repo) == before
        assert {c.id: c.pruned for c in repo.log()} == flags
        for cid in report.pruned:
            with pytest.raises(ckptrepo.errors.CommitPruned):
                repo.checkout(cid)
        _restores(repo, {cid: s for cid, s in states.items() if not flags[cid]})
        # gc after the rebuild frees what it would have freed (and nothing of what is kept).
        repo.gc(grace=0)
        _restores(repo, {cid: s for cid, s in states.items() if not flags[cid]})


def test_commits_without_manifests_are_listed_and_backfilled(tmp_path: Path, db_url: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A repository whose commits predate manifests: verify lists them, `ckpt db manifests`
    writes them (and pins today's refs in the journal), after which a rebuild recreates it."""
    kept_db_url = None if db_url.startswith("sqlite") else db_url
    with ckptrepo.Repo.init(tmp_path, db_url=kept_db_url, chunk_size=CHUNK) as repo:
        states = _lineage(repo)
        repo.prune(keep_last=1, branches=["main"])
        pruned = {c.id for c in repo.log() if c.pruned}
        for key in list(parts(repo).backend.list("")):  # as if made before commits wrote manifests
            if key.startswith(("manifests/", "journal/")):
                parts(repo).backend.delete(key)
        report = repo.verify()
        assert not report.ok and {p.subject for p in report.missing_manifests} == set(states)
        assert report.missing_journal_entries and not report.damaged_commits  # every commit still restores
        before = _view(repo)
        repo_dir = repo.repo_dir
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["db", "manifests", "--json"])
    assert result.exit_code == 0 and json.loads(result.output) == {"manifests_written": len(before["log"])}
    with ckptrepo.Repo.open(repo_dir) as repo:
        report = repo.verify(full=True)
        assert report.ok and not report.warnings, report.to_json()
        assert repo.write_missing_manifests() == 0
    _lose_database(repo_dir, kept_db_url)
    rebuilt = ckptrepo.Repo.rebuild_database(repo_dir)
    assert not rebuilt.skipped and rebuilt.conflicts == 0
    with ckptrepo.Repo.open(repo_dir) as repo:
        assert _view(repo) == before
        assert {c.id for c in repo.log() if c.pruned} == pruned
        _restores(repo, {cid: s for cid, s in states.items() if cid not in pruned})


def test_a_store_that_refuses_manifests_and_journal_entries_changes_nothing(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Write-ordering step 2 failing: a full store refuses the manifest or journal entry, so the
    commit, ref change or prune fails with StoreFull before its transaction and nothing changes."""
    import errno

    with ckptrepo.Repo.init(tmp_path / "work", chunk_size=CHUNK) as repo:
        ids = [repo.commit(_state(i), step=i).wait().id for i in range(3)]
        first = ids[0]
        before = _view(repo)
        put = parts(repo).backend.put_bytes

        def full(key: str, data: Any) -> None:
            if key.startswith((manifest.PREFIX, journal.PREFIX)):
                raise OSError(errno.ENOSPC, "No space left on device", key)
            put(key, data)

        monkeypatch.setattr(parts(repo).backend, "put_bytes", full)
        with pytest.raises(ckptrepo.errors.StoreFull):
            repo.commit(_state(9), step=9).wait()
        with pytest.raises(ckptrepo.errors.StoreFull):
            repo.branch("x", at=first)
        with pytest.raises(ckptrepo.errors.StoreFull):
            repo.prune(keep_last=1)
        assert _view(repo) == before and not any(c.pruned for c in repo.log())
        monkeypatch.undo()
        assert repo.commit(_state(9), step=9).wait().parent_ids == [before["log"][0][0]]
        assert repo.verify().ok
