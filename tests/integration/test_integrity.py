"""Integrity and recovery: what an adversarial probe of "the store is the source of truth" found,
each reproduced (issue 44, items 1-5 and the rebuild's name checks of item 9), on SQLite and
PostgreSQL where a database is involved.

1. A rebuild inserted chunk rows level by recorded depth, and crashed (KeyError) when a delta's
   base is stored only at a greater depth than the delta records.
2. A manifest whose tensor records were rewritten (another commit's chunk ids, another dtype or
   shape) rebuilt and verified clean, and checkout returned wrong data; a flipped statistic
   passed.
3. One lost manifest dropped every descendant from a rebuild (exit 0), after which gc would
   delete every pack; ``verify --full`` never read manifests.
4. Lost packs were relabelled "pruned" by a rebuild, ``verify --full`` said ok, and gc listed the
   damaged pack as a leftover to reclaim.
5. Two repositories on one store: the second ``init`` succeeded and its gc deleted the first's
   packs and manifests.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import delete, select
from typer.testing import CliRunner

import ckptrepo
from ckptrepo.cli.app import app
from ckptrepo.db import catalog
from ckptrepo.db.engine import database_url, make_engine, session_factory, write_transaction
from ckptrepo.db.models import Chunk, Commit, Pack, RepoMeta
from ckptrepo.errors import CommitDamaged, DamagedCommits, IntegrityError, StoreInUse
from ckptrepo.ids import tensor_id
from ckptrepo.ledger import fields, manifest
from ckptrepo.locations import ChunkLocation
from ckptrepo.storage import LocalBackend
from ckptrepo.testing import assert_states_equal, parts

CHUNK = 16 * 1024


def _state(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(3 * CHUNK // 4, generator=g), "b": torch.arange(seed, seed + 8)}


def _lose_database(repo_dir: Path, db_url: str | None) -> None:
    url = database_url(db_url, repo_dir)
    if url.startswith("sqlite"):
        for suffix in ("", "-wal", "-shm"):
            Path(f"{repo_dir / 'db.sqlite'}{suffix}").unlink(missing_ok=True)
        return
    from ckptrepo.db import migrate

    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            migrate.drop_schema(conn)
    finally:
        engine.dispose()


def _chain(tmp_path: Path, db_url: str, n: int = 4) -> tuple[Path, str | None, dict[str, dict[str, Any]]]:
    """A repository with ``n`` commits on main; returns its folder, the database URL it keeps, states."""
    kept = None if db_url.startswith("sqlite") else db_url
    states: dict[str, dict[str, Any]] = {}
    with ckptrepo.Repo.init(tmp_path / "r", db_url=kept, chunk_size=CHUNK) as repo:
        for i in range(n):
            s = _state(i)
            states[repo.commit(s, step=i).wait().id] = s
        return repo.repo_dir, kept, states


# -- 1 ----------------------------------------------------------------------------------------


def test_chunk_rows_go_in_bases_first_whatever_depth_their_footers_record(engine: Any) -> None:
    # X was encoded at depth 2 against B; the only copy of B stored now is a depth-7 re-encoding
    # against Z. Inserting by recorded depth put X before B (KeyError on B's key).
    z, b, x = ("a" * 64, "b" * 64, "c" * 64)
    chunks = [ChunkLocation(x, "p" * 64, 10, 5, 8, 3, 2, b), ChunkLocation(b, "p" * 64, 20, 5, 8, 3, 7, z),
              ChunkLocation(z, "p" * 64, 30, 8, 8, 0, 0, None)]
    sessions = session_factory(engine)
    with write_transaction(sessions) as s:
        s.add(Pack(id="p" * 64, size=100, n_chunks=3, deferred=False, created_at=datetime.now(timezone.utc)))
        s.flush()
        keys = catalog.insert_chunks(s, chunks)
    with sessions() as s:
        rows = {r.id: r for r in s.scalars(select(Chunk))}
    assert rows[x].base_key == keys[b] and rows[b].base_key == keys[z] and rows[z].base_key is None
    assert (rows[x].depth, rows[b].depth) == (2, 7)  # as their footers record (verify compares them)


# -- 2 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("forgery", ["other_chunks", "dtype", "shape", "statistic_flip", "random_flip"])
def test_a_rewritten_manifest_is_refused_and_never_returns_other_data(tmp_path: Path, db_url: str,
                                                                      forgery: str) -> None:
    repo_dir, kept, states = _chain(tmp_path, db_url, 3)
    a, b, c = list(states)
    store = LocalBackend(repo_dir / "store")
    key = manifest.key_of(b)
    body = manifest.read(store, b)
    other = manifest.read(store, a)
    tid = body["entries"]["w"]
    record = body["tensors"][tid]
    if forgery == "other_chunks":  # a's chunk ids under b's tensor id: a's weights under b's name
        body["tensors"][tid] = [*record[:6], other["tensors"][other["entries"]["w"]][6]]
    elif forgery == "dtype":
        body["tensors"][tid] = ["int32", *record[1:]]
    elif forgery == "shape":
        body["tensors"][tid] = [record[0], [record[1][0] // 2, 2], *record[2:]]
    elif forgery == "statistic_flip":
        body["tensors"][tid][5]["max"] += 1.0
    if forgery == "random_flip":
        data = bytearray(manifest.encode(body))
        data[len(data) // 3] ^= 0x04
        store.put_bytes(key, bytes(data))
    else:
        if forgery != "statistic_flip":  # a forger recomputes the checksum; a bit flip does not
            body["checksum"] = fields.checksum(body)
        store.put_bytes(key, manifest.encode(body))
    store.close()
    with ckptrepo.Repo.open(repo_dir) as repo:  # the database still knows b: verify --full reads the manifest
        report = repo.verify(full=True)
        assert not report.ok and [p.subject for p in report.damaged_manifests] == [key]
        assert_states_equal(repo.checkout(b), states[b])
        assert repo.write_missing_manifests() == 1  # rewritten from the database
        assert repo.verify(full=True).ok
    store = LocalBackend(repo_dir / "store")
    store.put_bytes(key, manifest.encode(body) if forgery != "random_flip" else bytes(data))
    store.close()
    _lose_database(repo_dir, kept)
    rebuilt = ckptrepo.Repo.rebuild_database(repo_dir)
    assert not rebuilt.ok and rebuilt.damaged == 1 and rebuilt.commits == 3
    with ckptrepo.Repo.open(repo_dir) as repo:
        with pytest.raises(CommitDamaged):
            repo.checkout(b)
        for cid in (a, c):  # the others, c on top of the damaged node, restore exactly
            assert_states_equal(repo.checkout(cid), states[cid])
        assert not repo.verify(full=True).ok


# -- 3 ----------------------------------------------------------------------------------------


def test_a_lost_root_manifest_keeps_every_descendant_and_gc_refuses(tmp_path: Path, db_url: str) -> None:
    repo_dir, kept, states = _chain(tmp_path, db_url, 4)
    root, *rest = list(states)
    (repo_dir / "store" / manifest.key_of(root)).unlink()
    _lose_database(repo_dir, kept)
    result = CliRunner().invoke(app, ["--repo", str(repo_dir), "db", "rebuild", "--json"])
    assert result.exit_code == 5, result.output  # never 0 while something is damaged
    doc = json.loads(result.stdout)
    assert doc["commits"] == 4 and doc["damaged"] == 1 and doc["branches"] == 1 and not doc["ok"]
    with ckptrepo.Repo.open(repo_dir) as repo:
        assert [c.id for c in repo.log("main")] == [*reversed(rest), root]
        assert repo.get_commit(root).damage == "its manifest is missing from the store"
        for cid in rest:
            assert_states_equal(repo.checkout(cid), states[cid])
        with pytest.raises(CommitDamaged):
            repo.checkout(root)
        packs = sorted((repo_dir / "store" / "packs").rglob("*.pack"))
        with pytest.raises(DamagedCommits):
            repo.gc(grace=0)
        assert sorted((repo_dir / "store" / "packs").rglob("*.pack")) == packs
        report = repo.verify()
        assert not report.ok and [p.subject for p in report.marked_damaged] == [root]
        assert report.last_good["main"] == rest[-1]
        # Accepting the loss: the node stays, pruned; gc runs again and keeps every live chunk.
        assert repo.prune(damaged=True).pruned == (root,)
        repo.gc(grace=0)
        for cid in rest:
            assert_states_equal(repo.checkout(cid), states[cid])
        assert repo.verify(full=True).ok


def test_verify_full_reads_every_manifest(tmp_path: Path, db_url: str) -> None:
    repo_dir, _, states = _chain(tmp_path, db_url, 2)
    first = next(iter(states))
    path = repo_dir / "store" / manifest.key_of(first)
    path.write_bytes(path.read_bytes()[:100])
    with ckptrepo.Repo.open(repo_dir) as repo:
        assert repo.verify().ok  # a structural verify reads no manifest
        report = repo.verify(full=True)
        assert not report.ok and report.checked.manifests == 2
        assert [p.subject for p in report.damaged_manifests] == [manifest.key_of(first)]
        assert not report.damaged_commits  # the commit itself still restores
    result = CliRunner().invoke(app, ["--repo", str(repo_dir), "verify", "--full"])
    assert result.exit_code == 5


# -- 4 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss", ["deleted", "truncated"])
def test_lost_pack_data_is_damage_not_pruning(tmp_path: Path, db_url: str, loss: str) -> None:
    repo_dir, kept, states = _chain(tmp_path, db_url, 3)
    last = list(states)[-1]
    with ckptrepo.Repo.open(repo_dir) as repo, parts(repo).reading() as s:  # a pack of the last commit's own chunks
        mine = {c for ids in catalog.chunk_lists_of(s, [last]).values() for c in ids}
        pack = next(pid for pid, ids in _pack_chunks(s).items() if ids <= mine)
    path = repo_dir / "store" / "packs" / pack[:2] / f"{pack}.pack"
    if loss == "deleted":
        path.unlink()
    else:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    _lose_database(repo_dir, kept)
    rebuilt = ckptrepo.Repo.rebuild_database(repo_dir)
    assert rebuilt.damaged == 1 and rebuilt.pruned == 0 and not rebuilt.ok
    with ckptrepo.Repo.open(repo_dir) as repo:
        commit = repo.get_commit(last)
        assert not commit.pruned and commit.damage is not None and "missing from the store" in commit.damage
        with pytest.raises(CommitDamaged):
            repo.checkout(last)
        report = repo.verify(full=True)
        assert not report.ok and last in report.damaged_commits and report.last_good["main"] != last
        if loss == "truncated":  # not a leftover: a damaged pack, which gc keeps
            assert [p.pack_id for p in report.damaged_packs] == [pack] and not report.unreferenced_packs
        with pytest.raises(DamagedCommits):
            repo.gc(grace=0)
        assert path.exists() == (loss == "truncated")
    result = CliRunner().invoke(app, ["--repo", str(repo_dir), "verify", "--full"])
    assert result.exit_code == 5 and "damaged" in result.stdout


def _pack_chunks(s: Any) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for cid, pid in s.execute(select(Chunk.id, Chunk.pack_id)):
        out.setdefault(pid, set()).add(cid)
    return out


# -- 5 ----------------------------------------------------------------------------------------


def test_a_store_holds_one_repository(tmp_path: Path) -> None:
    store = tmp_path / "S"
    with ckptrepo.Repo.init(tmp_path / "ra", store_url=str(store)) as ra:
        kept = ra.commit(_state(0)).wait().id
    runner = CliRunner()
    refused = runner.invoke(app, ["init", str(tmp_path / "rb"), "--store", str(store)])
    assert refused.exit_code == 4 and "belongs to repository" in refused.stderr
    assert not (tmp_path / "rb" / ".ckpt").exists()
    # A repository pointed at that store some other way (its config edited) cannot gc, prune or commit.
    with ckptrepo.Repo.init(tmp_path / "rc") as rc:
        config = rc.config
    from dataclasses import replace

    replace(config, store_url=str(store)).save(tmp_path / "rc" / ".ckpt")
    with ckptrepo.Repo.open(tmp_path / "rc") as rc:
        for attempt in (lambda: rc.gc(grace=0), lambda: rc.prune(keep_last=1),
                        lambda: rc.commit(_state(1)).wait(), lambda: rc.branch("x")):
            with pytest.raises(StoreInUse):
                attempt()
    with ckptrepo.Repo.open(tmp_path / "ra") as ra:
        assert_states_equal(ra.checkout(kept), _state(0))
        assert ra.verify(full=True).ok
    with pytest.raises(StoreInUse):
        ckptrepo.Repo.rebuild_database(tmp_path / "rc", replace=True)


def test_a_store_made_before_identities_is_claimed_and_its_loss_then_reported(tmp_path: Path) -> None:
    with ckptrepo.Repo.init(tmp_path) as repo:
        store = repo.repo_dir / "store"
        (store / "repository.json").unlink()
        with write_transaction(parts(repo).sessions) as w:
            w.execute(delete(RepoMeta).where(RepoMeta.key == "store_identity"))
        assert [p.kind for p in repo.verify().warnings] == ["unclaimed_store"]
        repo.commit(_state(0)).wait()  # claims it
        assert (store / "repository.json").exists() and repo.verify().ok
        (store / "repository.json").unlink()
        assert [p.kind for p in repo.verify().errors] == ["store_identity"]


# -- 9 (the rebuild's part) ---------------------------------------------------------------------


def test_a_manifest_naming_an_invalid_branch_is_not_used(tmp_path: Path) -> None:
    repo_dir, _, states = _chain(tmp_path, "sqlite", 2)
    b = list(states)[1]
    store = LocalBackend(repo_dir / "store")
    body = manifest.read(store, b)
    body["move"]["branch"] = "../../etc\x1b[31m"
    body["checksum"] = fields.checksum(body)
    store.put_bytes(manifest.key_of(b), manifest.encode(body))
    store.close()
    _lose_database(repo_dir, None)
    rebuilt = ckptrepo.Repo.rebuild_database(repo_dir)
    assert rebuilt.damaged == 1 and any("branch name" in why for why in rebuilt.skipped)
    with ckptrepo.Repo.open(repo_dir) as repo:
        assert [r.name for r in repo.branches()] == ["main"]
        with pytest.raises(CommitDamaged):
            repo.checkout(b)


def test_a_tensor_record_must_hash_to_its_id(tmp_path: Path) -> None:
    # The probe's int32 tensor: with the record's dtype changed, its id no longer matches.
    repo_dir, _, states = _chain(tmp_path, "sqlite", 1)
    [a] = list(states)
    store = LocalBackend(repo_dir / "store")
    body = manifest.read(store, a)
    tid = body["entries"]["w"]
    record = body["tensors"][tid]
    assert tensor_id(record[0], record[1], record[3], manifest.chunk_ids(record), record[4]) == tid
    body["tensors"][tid] = ["int32", *record[1:]]
    body["checksum"] = fields.checksum(body)
    with pytest.raises(IntegrityError, match="does not hash to its id"):
        manifest.read_bytes(manifest.encode(body), a)
    store.close()


def test_damaged_commits_are_marked_in_log_and_show(tmp_path: Path) -> None:
    repo_dir, _, states = _chain(tmp_path, "sqlite", 2)
    root = next(iter(states))
    (repo_dir / "store" / manifest.key_of(root)).unlink()
    _lose_database(repo_dir, None)
    ckptrepo.Repo.rebuild_database(repo_dir)
    runner = CliRunner()
    log = runner.invoke(app, ["--repo", str(repo_dir), "log"])
    assert log.exit_code == 0 and "(damaged)" in log.stdout
    shown = runner.invoke(app, ["--repo", str(repo_dir), "show", root[:12], "--json"])
    assert json.loads(shown.stdout)["damage"] == "its manifest is missing from the store"
    assert runner.invoke(app, ["--repo", str(repo_dir), "gc"]).exit_code == 5
    refused = runner.invoke(app, ["--repo", str(repo_dir), "prune", "--damaged", "--keep-last", "1"])
    assert refused.exit_code == 2
    accepted = runner.invoke(app, ["--repo", str(repo_dir), "prune", "--damaged", "--json"])
    assert accepted.exit_code == 0 and json.loads(accepted.stdout)["pruned"] == [root]
    assert runner.invoke(app, ["--repo", str(repo_dir), "gc"]).exit_code == 0
    with ckptrepo.Repo.open(repo_dir) as repo, parts(repo).sessions() as s:
        assert s.scalar(select(Commit.damage).where(Commit.id == root)) is not None
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from ckptrepo.ui import create_app

    with ckptrepo.Repo.open(repo_dir) as repo, TestClient(create_app(repo)) as client:
        nodes = {n["id"]: n for n in client.get("/api/graph").json()["nodes"]}
        assert nodes[root]["damaged"] and not any(n["damaged"] for cid, n in nodes.items() if cid != root)
        page = client.get(f"/commit/{root}").text
        assert 'id="damaged-badge"' in page and "its manifest is missing from the store" in page
