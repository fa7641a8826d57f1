"""``Repo.verify`` / ``ckpt verify`` on real damage, on every database the suite runs against.

Expected findings are computed independently of verify: the commits a damage breaks are
those whose checkout fails afterwards (on a freshly opened repository, so no cached file
descriptor hides the damage).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
import torch
from sqlalchemy import delete, select, text, update
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

import ckptrepo
from ckptrepo import errors
from ckptrepo.chunks.pack import read_index
from ckptrepo.chunks.store import PackSink, pack_key
from ckptrepo.cli.app import app
from ckptrepo.db import pending
from ckptrepo.db.engine import make_engine
from ckptrepo.db.models import Chunk, Entry, Ref, TensorChunk
from ckptrepo.ids import hash_bytes
from ckptrepo.storage import LocalBackend
from ckptrepo.testing import parts

CHUNK = 64 * 1024


def _state(n: int) -> dict[str, torch.Tensor]:
    """Three commits' worth of related state: a shared tensor, a partly changed one, a new one."""
    g = torch.Generator().manual_seed(n)
    shared = torch.Generator().manual_seed(1234)
    embed = torch.randn(4 * CHUNK // 4, generator=shared)
    embed[: CHUNK // 4] += n  # the first chunk changes per commit, the other three dedup
    return {
        "frozen": torch.randn(2 * CHUNK // 4, generator=shared),
        "embed": embed,
        "head": torch.randn(3 * CHUNK // 4, generator=g),
        "step": torch.tensor(n),
    }


@pytest.fixture
def repo_path(tmp_path: Path, db_url: str) -> Iterator[Path]:
    """A repository with three commits on main, its packs no larger than ~2 chunks, their
    layouts indexed (``db.pending``: the tests damage rows); closed."""
    path = tmp_path / "work"
    with ckptrepo.Repo.init(path, db_url=db_url, chunk_size=CHUNK, pack_target=2 * CHUNK) as repo:
        for n in range(3):
            repo.commit(_state(n), step=n, metrics={"counter": n}).wait()
        pending.index_pending(parts(repo).sessions)
    yield path


def _store(path: Path) -> Path:
    return path / ".ckpt" / "store"


def _pack_files(path: Path) -> dict[str, Path]:
    return {p.stem: p for p in sorted((_store(path) / "packs").rglob("*.pack"))}


def _unrestorable(path: Path) -> tuple[str, ...]:
    """Commits whose checkout fails, found by trying every one."""
    failing = []
    with ckptrepo.Repo.open(path) as repo:
        for commit in repo.log():
            try:
                repo.checkout(commit.id)
            except errors.CkptError:
                failing.append(commit.id)
    return tuple(sorted(failing))


def _verify(path: Path, *, full: bool = False) -> ckptrepo.VerifyReport:
    with ckptrepo.Repo.open(path) as repo:
        return repo.verify(full=full)


def test_clean_repository_is_ok(repo_path: Path) -> None:
    for full in (False, True):
        report = _verify(repo_path, full=full)
        assert report.ok and not report.errors and not report.warnings, report.to_json()
        c = report.checked
        assert c.commits == 3 and c.refs == 1 and c.packs == len(_pack_files(repo_path)) > 3
        # packs, manifests, the identity
        assert c.store_objects == c.packs + c.commits + 1 and c.chunks >= 9 and c.tensors >= 8
        assert c.chunks_read == (c.chunks if full else 0)
    assert _unrestorable(repo_path) == ()


def test_missing_pack_is_an_error_naming_it_and_the_commits_it_breaks(repo_path: Path) -> None:
    pid, path = next(iter(_pack_files(repo_path).items()))
    path.unlink()
    report = _verify(repo_path)
    assert not report.ok
    assert [p.pack_id for p in report.missing_packs] == [pid]
    broken = _unrestorable(repo_path)
    assert broken and report.missing_packs[0].commits == broken == report.damaged_commits
    assert report.missing_packs[0].tensors  # the tensor names using it
    assert not report.damaged_packs and not report.bad_chunks and not report.incomplete_commits


@pytest.mark.parametrize("cut", ["payload", "trailer"])
def test_truncated_pack_is_an_error(repo_path: Path, cut: str) -> None:
    pid, path = list(_pack_files(repo_path).items())[-1]
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(size // 2 if cut == "payload" else size - 7)
    report = _verify(repo_path)
    assert not report.ok
    assert [p.pack_id for p in report.damaged_packs] == [pid]
    assert not report.missing_packs and not report.bad_chunks
    if cut == "payload":
        assert report.damaged_packs[0].commits == _unrestorable(repo_path) != ()
    else:
        # Payloads intact, index gone: checkouts still work, but the pack can no longer be
        # trusted or indexed, so it is an error listing every commit that uses it.
        assert report.damaged_packs[0].commits and _unrestorable(repo_path) == ()


def test_flipped_payload_byte_is_found_only_by_full_verify(repo_path: Path) -> None:
    pid, path = next(iter(_pack_files(repo_path).items()))
    with ckptrepo.Repo.open(repo_path) as repo:
        entry = read_index(parts(repo).backend, pack_key(pid))[0]
    with open(path, "r+b") as fh:
        fh.seek(entry.offset + entry.length // 2)
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 0x5A]))
    assert _verify(repo_path).ok
    report = _verify(repo_path, full=True)
    assert not report.ok
    [problem] = report.errors
    assert problem.kind == "corrupt_chunk" and problem.chunk_id == entry.chunk_id and problem.pack_id == pid
    assert problem.commits == _unrestorable(repo_path) != ()
    assert problem.tensors


def test_full_verify_names_each_branchs_last_known_good_commit(repo_path: Path) -> None:
    """A byte flipped in a chunk only the newest commit has: main's last known good is the
    commit before it, a branch at that commit is whole, and the CLI shows both."""
    from ckptrepo.ids import hash_bytes
    from ckptrepo.state import tensor_bytes

    with ckptrepo.Repo.open(repo_path) as repo:
        log = repo.log("main")
        repo.branch("older", log[1].id)
        by_chunk = {e.chunk_id: (pid, e) for pid in _pack_files(repo_path)
                    for e in read_index(parts(repo).backend, pack_key(pid))}
    assert _verify(repo_path, full=True).last_good == {"main": log[0].id, "older": log[1].id}
    # The first chunk of the newest commit's own "head" tensor (random per commit): corrupt it.
    pid, entry = by_chunk[hash_bytes(tensor_bytes(_state(2)["head"])[:CHUNK])]
    with open(_pack_files(repo_path)[pid], "r+b") as fh:
        fh.seek(entry.offset + entry.length // 2)
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 0x5A]))
    report = _verify(repo_path, full=True)
    broken = _unrestorable(repo_path)
    assert log[0].id in broken and log[1].id not in broken
    assert report.last_good == {"main": log[1].id, "older": log[1].id} and report.heads["main"] == log[0].id
    assert report.to_json()["last_good"] == {"main": log[1].id, "older": log[1].id}
    result = CliRunner().invoke(app, ["--repo", str(repo_path), "verify", "--full"])
    assert result.exit_code == 5
    assert "last known good" in result.output and f"{log[1].id[:10]} (its head is broken)" in result.output
    assert f"{log[1].id[:10]} (its head)" in result.output


def test_leftovers_are_warnings_and_keep_ok(repo_path: Path) -> None:
    # A whole pack no row names: what a commit interrupted before its transaction leaves.
    store = LocalBackend(_store(repo_path))
    sink = PackSink(store, 1 << 20)
    payload = b"left over by an interrupted commit"
    sink.add(hash_bytes(payload), 0, payload, len(payload))
    [sealed] = sink.seal()
    fake = sealed.pack_id
    path = _store(repo_path) / pack_key(fake)
    staging = _store(repo_path) / ".staging"
    staging.mkdir(exist_ok=True)
    (staging / "pack-leftover.tmp").write_bytes(b"x" * 100)
    report = _verify(repo_path, full=True)
    assert report.ok and not report.errors
    [unreferenced] = report.unreferenced_packs
    assert unreferenced.subject == pack_key(fake) and unreferenced.pack_id == fake
    assert unreferenced.size == path.stat().st_size and unreferenced.age_s is not None and unreferenced.age_s >= 0
    [temporary] = report.temporary_files
    assert temporary.subject == str(staging / "pack-leftover.tmp") and temporary.size == 100
    assert {p.severity for p in report.warnings} == {"warning"}
    assert report.to_json()["ok"] is True and len(report.to_json()["warnings"]) == 2


def test_a_pack_under_another_name_is_damaged_not_a_leftover(repo_path: Path) -> None:
    path = next(iter(_pack_files(repo_path).values()))
    fake = "ab" * 32
    copy = _store(repo_path) / pack_key(fake)
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, copy)
    for full in (False, True):
        report = _verify(repo_path, full=full)
        assert not report.ok and [p.subject for p in report.damaged_packs] == [fake]
        assert "not to its name" in report.damaged_packs[0].detail and not report.unreferenced_packs


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): ("dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(root.rglob("*"))
        if not p.name.endswith(("-wal", "-shm"))
    }


def test_verify_changes_nothing(repo_path: Path, db_url: str) -> None:
    # Leftovers and a damaged pack too: finding problems must not touch them either. The
    # tree hashed holds the repository and, on SQLite, the test's database file.
    path = list(_pack_files(repo_path).values())[1]
    with open(path, "r+b") as fh:
        fh.truncate(100)
    (_store(repo_path) / ".staging" / "pack-leftover.tmp").write_bytes(b"x")
    root = repo_path.parent
    before = _tree(root)
    assert "db.sqlite" in before or not db_url.startswith("sqlite")
    with ckptrepo.Repo.open(repo_path) as repo:
        assert not repo.verify().ok
        assert not repo.verify(full=True).ok
        assert _tree(root) == before
    assert _tree(root) == before


def test_verify_indexes_pending_layouts_and_nothing_else(tmp_path: Path) -> None:
    # Asynchronous commits on SQLite leave their layouts pending; verify checks them indexed.
    path = tmp_path / "work"
    with ckptrepo.Repo.init(path, chunk_size=CHUNK, pack_target=2 * CHUNK, idle_repack=False) as repo:
        for n in range(3):
            repo.commit(_state(n), step=n).wait()
        with parts(repo).sessions() as s:
            assert pending.count(s) == 3
        report = repo.verify(full=True)
        assert report.ok and report.checked.commits == 3 and report.checked.tensors > 0
        with parts(repo).sessions() as s:
            assert pending.count(s) == 0
        before = _tree(path)
        assert repo.verify(full=True).ok
        assert _tree(path) == before


def test_verify_creates_no_staging_folder(tmp_path: Path, db_url: str) -> None:
    with ckptrepo.Repo.init(tmp_path / "empty", db_url=db_url) as repo:
        shutil.rmtree(repo.repo_dir / "store" / ".staging", ignore_errors=True)  # init wrote the store's identity
        before = _tree(tmp_path / "empty")
        report = repo.verify(full=True)
        assert report.ok and report.checked.commits == 0
        assert _tree(tmp_path / "empty") == before
        assert not (repo.repo_dir / "store" / ".staging").exists()


def test_cli_exit_codes_and_json(repo_path: Path) -> None:
    runner = CliRunner()

    def ckpt(*args: str) -> tuple[int, str, str]:
        result = runner.invoke(app, ["--repo", str(repo_path), "verify", *args], catch_exceptions=False)
        return result.exit_code, result.stdout, result.stderr

    code, out, err = ckpt()
    assert code == 0 and "ok" in out and not err
    code, out, _ = ckpt("--full", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] is True and doc["full"] is True and doc["checked"]["chunks_read"] > 0

    (_store(repo_path) / ".staging" / "pack-leftover.tmp").write_bytes(b"x")
    code, out, _ = ckpt()
    assert code == 0 and "warning" in out and "temporary_file" in out

    pid, path = next(iter(_pack_files(repo_path).items()))
    path.unlink()
    code, out, err = ckpt("--json")
    assert code == errors.IntegrityError.exit_code == 5
    doc = json.loads(out)  # the report still comes out, on stdout, as one document
    assert doc["ok"] is False and [p["pack_id"] for p in doc["errors"]] == [pid]
    assert doc["errors"][0]["kind"] == "missing_pack" and doc["damaged_commits"] == list(_unrestorable(repo_path))
    failure = json.loads(err)  # and the failure, on stderr, as one line of JSON
    assert failure["exit_code"] == 5 and "verify found 1 errors" in failure["error"] and failure["hint"]
    code, out, err = ckpt()
    assert code == 5 and "missing_pack" in out and pid[:10] in out and err.startswith("error: ")


def test_database_damage_is_found(repo_path: Path, db_url: str) -> None:
    """Rows that disagree with the packs or with each other: a moved chunk, a lost chunk link,
    a ref to a commit that is not there (foreign keys switched off to make one)."""
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            latest = conn.scalar(select(Ref.commit_id).where(Ref.name == "main"))
            names = dict(conn.execute(select(Entry.name, Entry.tensor_key).where(Entry.commit_id == latest)).all())
            head_chunk = conn.scalar(select(Chunk.id).join(TensorChunk, TensorChunk.chunk_key == Chunk.key)
                                     .where(TensorChunk.tensor_key == names["head"], TensorChunk.seq == 1))
            conn.execute(update(Chunk).where(Chunk.id == head_chunk).values(offset=Chunk.offset + 1))
            conn.execute(delete(TensorChunk).where(TensorChunk.tensor_key == names["step"]))
        ghost = "INSERT INTO refs (kind, name, commit_id, updated_at) VALUES ('tag', 'ghost', :cid, CURRENT_TIMESTAMP)"
        if engine.dialect.name == "sqlite":
            database = make_url(db_url).database
            assert database is not None
            with closing(sqlite3.connect(database)) as raw:  # a plain connection: foreign keys off
                raw.execute(ghost, {"cid": "0" * 64})
                raw.commit()
        else:
            with engine.begin() as conn:
                conn.exec_driver_sql("SET LOCAL session_replication_role = replica")  # no FK triggers
                conn.execute(text(ghost), {"cid": "0" * 64})
    finally:
        engine.dispose()
    report = _verify(repo_path)
    assert not report.ok
    [bad] = report.bad_chunks
    assert bad.chunk_id == head_chunk and "offset" in bad.detail and latest in bad.commits and "head" in bad.tensors
    [ref] = report.broken_refs
    assert ref.subject == "tag ghost"
    [incomplete] = report.incomplete_commits
    assert incomplete.subject == latest and incomplete.tensors == ("step",) and "step" in incomplete.detail
    assert not report.missing_packs and not report.damaged_packs
