"""A lost, emptied, half-dropped or damaged repository database: opening the repository (``Repo.open``,
``ckpt log``) names the fix, ``ckpt db rebuild`` (the store is the source of truth), never "upgrade
ckptrepo" nor "a bug"; and the rebuild brings every commit back, on SQLite and on PostgreSQL, where
tables dropped by hand leave their key sequences (and perhaps the Alembic stamp) behind.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import inspect, text
from sqlalchemy.engine import make_url
from typer.testing import CliRunner, Result

import ckptrepo
from ckptrepo.cli.app import app
from ckptrepo.db.engine import database_url, make_engine
from ckptrepo.db.models import schema_metadata
from ckptrepo.errors import CkptError, DatabaseDamaged, DatabaseMissing, FormatError, RepositoryExists

CHUNK = 16 * 1024
_CKPT_TABLES = sorted(schema_metadata().tables)


def _state(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(CHUNK // 2, generator=g), "ids": torch.arange(seed, seed + 6), "step": seed}


def _repository(tmp_path: Path, db_url: str | None) -> tuple[Path, dict[str, dict[str, Any]]]:
    """A repository with commits on two branches; its folder and every commit's state by id."""
    states: dict[str, dict[str, Any]] = {}
    with ckptrepo.Repo.init(tmp_path / "work", db_url=db_url, chunk_size=CHUNK) as repo:
        for i in range(3):
            states[repo.commit(_state(i), step=i, metrics={"loss": 1 / (i + 1)}).wait().id] = _state(i)
        repo.branch("exp", at=next(iter(states)))
        states[repo.commit(_state(9), branch="exp").wait().id] = _state(9)
        return repo.repo_dir, states


def _restores_all(repo_dir: Path, states: dict[str, dict[str, Any]]) -> None:
    with ckptrepo.Repo.open(repo_dir) as repo:
        assert {c.id for c in repo.log()} == set(states)
        for cid, state in states.items():
            got = repo.checkout(cid)
            assert torch.equal(got["w"], state["w"]) and torch.equal(got["ids"], state["ids"]), cid
            assert got["step"] == state["step"]
        report = repo.verify(full=True)
        assert report.ok, report.to_json()


def _ckpt(repo_dir: Path, *args: str) -> Result:
    return CliRunner().invoke(app, ["--repo", str(repo_dir), *args], catch_exceptions=False)


def _names_the_rebuild(result: Result, code: int, *, replace: bool = False) -> None:
    """``result`` failed with ``code``, one error line and a hint naming ``ckpt db rebuild``."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("error: The repository database is "), result.stderr
    assert lines[-1].startswith("hint: ") and f"`ckpt db rebuild{' --replace' if replace else ''}`" in lines[-1]
    assert "Upgrade ckptrepo" not in result.stderr and "bug" not in result.stderr and "Traceback" not in result.stderr


def _drop_by_hand(repo_dir: Path, db_url: str | None, tables: Iterable[str] | None) -> None:
    """Drop ``tables`` (None: every table there, ``alembic_version`` too) as a user cleaning up would,
    one ``DROP TABLE`` each; on PostgreSQL with CASCADE, which leaves the key sequences."""
    url = database_url(db_url, repo_dir)
    if url.startswith("sqlite"):
        with closing(sqlite3.connect(str(make_url(url).database))) as conn, conn:
            conn.execute("PRAGMA foreign_keys=OFF")
            names = tables if tables is not None else [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
            for name in names:
                conn.execute(f'DROP TABLE IF EXISTS "{name}"')
        return
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            for name in tables if tables is not None else inspect(conn).get_table_names():
                conn.execute(text(f'DROP TABLE IF EXISTS "{name}" CASCADE'))
            left = set(conn.execute(text("SELECT sequence_name FROM information_schema.sequences "
                                         "WHERE sequence_schema = current_schema()")).scalars())
        assert {"chunks_key_seq", "tensors_key_seq"} <= left  # what the rebuild has to cope with
    finally:
        engine.dispose()


DROPS = {
    "every-table": None,
    "ckpt-tables-not-the-stamp": _CKPT_TABLES,
    "some-tables-and-repo-meta": ["repo_meta", "chunks", "tensor_chunks", "tensors"],
}


@pytest.mark.parametrize("replace", [False, True], ids=["rebuild", "rebuild-replace"])
@pytest.mark.parametrize("tables", DROPS.values(), ids=DROPS.keys())
def test_tables_dropped_by_hand_name_the_rebuild_which_brings_every_commit_back(
        tmp_path: Path, db_url: str, tables: list[str] | None, replace: bool) -> None:
    kept_db_url = None if db_url.startswith("sqlite") else db_url
    repo_dir, states = _repository(tmp_path, kept_db_url)
    _drop_by_hand(repo_dir, kept_db_url, tables)

    with pytest.raises(DatabaseMissing) as lost:
        ckptrepo.Repo.open(repo_dir)
    assert isinstance(lost.value, FormatError) and "`ckpt db rebuild`" in lost.value.hint
    _names_the_rebuild(_ckpt(repo_dir, "log"), 6)

    report = ckptrepo.Repo.rebuild_database(repo_dir, replace=replace)
    assert report.commits == len(states) and not report.skipped and report.damaged == 0
    _restores_all(repo_dir, states)


def test_a_repository_missing_other_tables_is_rebuilt_with_replace(tmp_path: Path, db_url: str) -> None:
    kept_db_url = None if db_url.startswith("sqlite") else db_url
    repo_dir, states = _repository(tmp_path, kept_db_url)
    _drop_by_hand(repo_dir, kept_db_url, ["tensor_chunks", "chunks"])  # repo_meta still names the repository

    with pytest.raises(DatabaseMissing, match="lacks the ckpt tables chunks, tensor_chunks") as lost:
        ckptrepo.Repo.open(repo_dir)
    assert "`ckpt db rebuild --replace`" in lost.value.hint
    _names_the_rebuild(_ckpt(repo_dir, "log"), 6, replace=True)
    with pytest.raises(RepositoryExists):
        ckptrepo.Repo.rebuild_database(repo_dir)

    report = ckptrepo.Repo.rebuild_database(repo_dir, replace=True)
    assert report.commits == len(states) and not report.skipped
    _restores_all(repo_dir, states)


def _delete(db: Path) -> None:
    db.unlink()


def _empty_file(db: Path) -> None:
    db.write_bytes(b"")


def _empty_database(db: Path) -> None:
    db.unlink()
    with closing(sqlite3.connect(db)) as conn, conn:  # a valid database file holding no table
        conn.execute("CREATE TABLE t (x)")
        conn.execute("DROP TABLE t")
    assert db.stat().st_size > 0


def _random_bytes(db: Path) -> None:
    db.write_bytes(os.urandom(db.stat().st_size))


def _truncated(db: Path) -> None:
    with open(db, "r+b") as f:
        f.truncate(db.stat().st_size // 2)


SQLITE_LOSSES = {
    "deleted": (_delete, 6, DatabaseMissing),
    "emptied": (_empty_file, 6, DatabaseMissing),
    "empty-database": (_empty_database, 6, DatabaseMissing),
    "random-bytes": (_random_bytes, 5, DatabaseDamaged),
    "truncated": (_truncated, 5, None),  # seen at open or by the first query that reads past the end
}


@pytest.mark.parametrize(("lose", "code", "error"), SQLITE_LOSSES.values(), ids=SQLITE_LOSSES.keys())
def test_a_lost_or_damaged_sqlite_file_names_the_rebuild_which_brings_every_commit_back(
        tmp_path: Path, lose: Any, code: int, error: type[CkptError] | None) -> None:
    repo_dir, states = _repository(tmp_path, None)
    db = repo_dir / "db.sqlite"
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every commit in the file itself, the log empty
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    lose(db)
    size = db.stat().st_size if db.exists() else None

    if error is not None:
        with pytest.raises(error) as lost:
            ckptrepo.Repo.open(repo_dir)
        assert "`ckpt db rebuild`" in lost.value.hint
        assert (db.stat().st_size if db.exists() else None) == size  # opening wrote nothing there
    _names_the_rebuild(_ckpt(repo_dir, "log"), code)

    rebuilt = _ckpt(repo_dir, "db", "rebuild")
    assert rebuilt.exit_code == 0, rebuilt.stderr
    shown = _ckpt(repo_dir, "log", "--all")
    assert shown.exit_code == 0 and all(cid[:8] in shown.stdout for cid in states), shown.stdout
    _restores_all(repo_dir, states)


@pytest.mark.parametrize("tables", [DROPS["every-table"], DROPS["ckpt-tables-not-the-stamp"]],
                         ids=["every-table", "ckpt-tables-not-the-stamp"])
def test_a_new_repository_takes_a_database_whose_ckpt_schema_was_dropped_by_hand(
        tmp_path: Path, db_url: str, tables: list[str] | None) -> None:
    if tables is None and db_url.startswith("sqlite"):
        pytest.skip("SQLite keeps nothing of a table dropped (its AUTOINCREMENT mark goes with it)")
    old_dir, _ = _repository(tmp_path / "old", db_url)
    _drop_by_hand(old_dir, db_url, tables)
    with ckptrepo.Repo.init(tmp_path / "new", db_url=db_url, chunk_size=CHUNK) as repo:
        commit = repo.commit(_state(5)).wait()
        assert torch.equal(repo.checkout(commit.id)["w"], _state(5)["w"]) and len(repo.log()) == 1


def test_tables_named_as_ckpts_but_not_stamped_are_left_alone(tmp_path: Path, db_url: str) -> None:
    engine = make_engine(database_url(db_url, tmp_path))
    try:
        with engine.begin() as conn:  # another application's table, in the same database
            conn.execute(text("CREATE TABLE metrics (name VARCHAR(20))"))
            conn.execute(text("INSERT INTO metrics VALUES ('theirs')"))
        with pytest.raises(FormatError, match=r"no repository and no ckpt schema stamp.*\(metrics\)") as refused:
            ckptrepo.Repo.init(tmp_path / "new", db_url=db_url)
        assert "DROP TABLE" in refused.value.hint
        with engine.connect() as conn:
            assert conn.execute(text("SELECT name FROM metrics")).scalars().all() == ["theirs"]
    finally:
        engine.dispose()


def test_db_upgrade_of_a_lost_database_names_the_rebuild_and_creates_nothing(tmp_path: Path, db_url: str) -> None:
    # An upgrade used to make an empty schema there, after which `ckpt log` showed no commits.
    kept = None if db_url.startswith("sqlite") else db_url
    repo_dir, states = _repository(tmp_path, kept)
    if kept is None:
        (repo_dir / "db.sqlite").unlink()
    else:
        _drop_by_hand(repo_dir, kept, None)
    _names_the_rebuild(_ckpt(repo_dir, "db", "upgrade"), 6)
    assert kept is not None or not (repo_dir / "db.sqlite").exists()
    assert _ckpt(repo_dir, "db", "rebuild").exit_code == 0
    _restores_all(repo_dir, states)
