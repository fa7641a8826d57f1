"""Schema, migrations and transaction behaviour of ckptrepo.db, on SQLite and PostgreSQL."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import cast

import pytest
import sqlalchemy.exc
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Engine, String, Table, func, inspect, select

from ckptrepo.db import migrate
from ckptrepo.db.engine import (
    database_url,
    insert_ignore,
    insert_tuples,
    make_engine,
    present_values,
    session_factory,
    write_connection,
    write_transaction,
)
from ckptrepo.db.models import Base, Chunk, Commit, Edge, Pack, RepoMeta, Tensor, include_object, schema_metadata
from ckptrepo.errors import FormatError, RepositoryExists, SchemaOutdated, SchemaTooNew, UsageError

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
HEAD = "0016"  # the newest migration this code ships

# A later schema as a future ckptrepo would ship it. Rebuilding ``packs`` (recreate on
# SQLite), which ``chunks`` references, exercises the foreign-key handling of migrations.
REVISION_NEXT = """
import sqlalchemy as sa
from alembic import op

revision = "9999"
down_revision = "{HEAD}"
branch_labels = None
depends_on = None


def _recreate():
    return "always" if op.get_bind().dialect.name == "sqlite" else "auto"


def upgrade():
    with op.batch_alter_table("packs", recreate=_recreate()) as batch:
        batch.add_column(sa.Column("note", sa.Text(), nullable=True))


def downgrade():
    with op.batch_alter_table("packs", recreate=_recreate()) as batch:
        batch.drop_column("note")
"""


@pytest.fixture
def newer_scripts(tmp_path: Path) -> Path:
    """A copy of the packaged migrations plus a test-only revision 9999 on top of the head."""
    scripts = tmp_path / "migrations"
    shutil.copytree(migrate.script_location(), scripts, ignore=shutil.ignore_patterns("__pycache__"))
    (scripts / "versions" / "9999_test_only.py").write_text(REVISION_NEXT.replace("{HEAD}", HEAD), encoding="utf-8")
    return scripts


def _pack(pack_id: str, size: int = 1) -> dict[str, object]:
    return {"id": pack_id, "size": size, "n_chunks": 0, "created_at": NOW}


def _count(engine: Engine, model: type[Base]) -> int:
    with session_factory(engine)() as s:
        return s.scalar(select(func.count()).select_from(model)) or 0


def test_database_url() -> None:
    assert database_url(None, Path("/r/.ckpt")) == "sqlite:////r/.ckpt/db.sqlite"
    assert database_url(None, Path("rel")).startswith(f"sqlite:///{Path.cwd()}/rel/")
    assert database_url("postgres://u@h/db", Path()) == "postgresql+psycopg://u@h/db"
    assert database_url("postgresql://u:p@h:5/db?x=1", Path()) == "postgresql+psycopg://u:p@h:5/db?x=1"
    for same in ("sqlite:////a/b.sqlite", "postgresql+psycopg://h/db"):
        assert database_url(same, Path()) == same
    for bad in ("mysql://h/db", "postgresql+psycopg2://h/db", "/just/a/path"):
        with pytest.raises(UsageError) as info:
            database_url(bad, Path())
        assert "postgresql://" in info.value.hint


def test_migrations_match_models(engine: Engine) -> None:
    assert migrate.current_revision(engine) == migrate.head_revision() == HEAD == migrate.HEAD
    with engine.connect() as conn:
        opts = {"compare_type": True, "include_object": include_object(conn.dialect.name)}
        diff = compare_metadata(MigrationContext.configure(conn, opts=opts), schema_metadata())
    assert diff == []
    migrate.check_schema(engine)


def test_packaged_sqlite_schema_is_what_the_migrations_make(tmp_path: Path) -> None:
    # A new SQLite repository replays db.head_sqlite instead of running the migrations: the two
    # must be the same statements (tables, indexes, the stamp, sqlite_sequence's rows).
    from ckptrepo.db import head_sqlite

    eng = make_engine(f"sqlite:///{tmp_path}/migrated.sqlite")
    migrate.upgrade(eng)
    with eng.connect() as conn:
        made = migrate.sqlite_dump(conn)
    eng.dispose()
    assert (head_sqlite.REVISION, list(head_sqlite.STATEMENTS)) == (migrate.HEAD, made), \
        "the migrations changed: run scripts/gen-sqlite-head"
    assert any(s.startswith('INSERT INTO "alembic_version"') for s in made)

    replayed = make_engine(f"sqlite:///{tmp_path}/new.sqlite")
    migrate.initialize(replayed, {"repo_id": "r1", "format_version": "1"})
    with replayed.connect() as conn:
        held = migrate.sqlite_dump(conn)
        opts = {"compare_type": True, "include_object": include_object("sqlite")}
        assert compare_metadata(MigrationContext.configure(conn, opts=opts), schema_metadata()) == []
    migrate.check_schema(replayed)
    replayed.dispose()
    meta_rows = [s for s in held if s.startswith('INSERT INTO "repo_meta"')]
    assert sorted(meta_rows) == ["INSERT INTO \"repo_meta\" VALUES ('format_version', '1')",
                                 "INSERT INTO \"repo_meta\" VALUES ('repo_id', 'r1')"]
    assert [s for s in held if s not in meta_rows] == made


def test_a_new_repository_on_sqlite_loads_no_alembic(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import sys, ckptrepo
        ckptrepo.Repo.init({str(tmp_path / "r")!r}).close()
        ckptrepo.Repo.open({str(tmp_path / "r")!r}).close()
        assert "alembic" not in sys.modules, "Repo.init ran the migrations"
    """)
    subprocess.run([sys.executable, "-c", code], check=True)


def test_dialect_only_indexes(engine: Engine) -> None:
    # ``ix_entries_name_commit`` (history's lookups by name) exists on PostgreSQL only, and
    # covers tensor_id there; a downgrade past 0005 drops it.
    def entry_indexes() -> dict[str, list[str | None]]:
        return {ix["name"] or "": list(ix["column_names"]) for ix in inspect(engine).get_indexes("entries")}

    on_pg = engine.dialect.name == "postgresql"
    assert ("ix_entries_name_commit" in entry_indexes()) == on_pg
    if on_pg:
        with engine.connect() as conn:
            definition = conn.exec_driver_sql(
                "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_entries_name_commit'"
                " AND schemaname = current_schema()").scalar_one()
        assert definition.endswith("(name, commit_id) INCLUDE (tensor_key)")
    migrate.downgrade(engine, "0004")
    assert "ix_entries_name_commit" not in entry_indexes()
    migrate.upgrade(engine)
    assert ("ix_entries_name_commit" in entry_indexes()) == on_pg


def test_ids_compare_bytewise_on_postgresql(engine: Engine) -> None:
    # Every id column (the model's ``Id`` type, and the foreign keys that take its type) is
    # byte-ordered on PostgreSQL from 0006 on, and back to the default collation below it.
    id_columns = {(t.name, c.name) for t in schema_metadata().sorted_tables for c in t.columns
                  if isinstance(c.type, String) and c.type.length == 64 and t.name != "repo_meta"}
    assert len(id_columns) == 21

    def collations() -> dict[tuple[str, str], str | None]:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT table_name, column_name, collation_name FROM information_schema.columns"
                " WHERE table_schema = current_schema()").all()
        return {(t, c): coll for t, c, coll in rows if (t, c) in id_columns}

    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite compares text bytewise already")
    assert set(collations()) == id_columns
    assert set(collations().values()) == {"C"}
    migrate.downgrade(engine, "0005")
    assert set(collations().values()) == {None}
    migrate.upgrade(engine)
    assert set(collations().values()) == {"C"}


def test_opening_at_head_does_not_load_alembic(tmp_path: Path) -> None:
    # Opening a repository reads the schema stamp with plain SQL; Alembic (and the S3
    # client) stay out of a training process's memory.
    code = textwrap.dedent(f"""
        import sys, ckptrepo
        ckptrepo.Repo.init({str(tmp_path)!r}).close()
        for name in [m for m in sys.modules if m.split(".")[0] in ("alembic", "mako")]:
            del sys.modules[name]
        ckptrepo.Repo.open({str(tmp_path)!r}).close()
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("alembic", "mako", "boto3", "botocore"))
        assert not loaded, loaded
    """)
    subprocess.run([sys.executable, "-c", code], check=True)


def test_downgrade_to_base_and_upgrade_again(engine: Engine) -> None:
    migrate.downgrade(engine, "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    assert migrate.current_revision(engine) is None
    with pytest.raises(FormatError, match="no ckpt tables"):
        migrate.check_schema(engine)
    migrate.upgrade(engine)
    migrate.check_schema(engine)
    assert set(inspect(engine).get_table_names()) >= set(schema_metadata().tables)


def test_check_schema_refuses_empty_database(db_url: str) -> None:
    eng = make_engine(db_url)
    try:
        with pytest.raises(FormatError, match="no ckpt tables"):
            migrate.check_schema(eng)  # SQLite: the file does not exist, and is not created
        with eng.connect():
            pass
        with pytest.raises(FormatError, match="no ckpt tables"):
            migrate.check_schema(eng)
    finally:
        eng.dispose()


def test_older_and_newer_schemas(engine: Engine, newer_scripts: Path) -> None:
    with write_transaction(session_factory(engine)) as s:
        s.add(Pack(**_pack("p" * 64)))
        s.flush()
        s.add(Chunk(id="c" * 64, pack_id="p" * 64, offset=0, length=1, raw_length=1, encoding=0))
    # This database is at HEAD; code that ships 9999 must ask for an upgrade.
    with pytest.raises(SchemaOutdated) as outdated:
        migrate.check_schema(engine, scripts=newer_scripts)
    assert outdated.value.fields == {"current": HEAD, "head": "9999"}
    assert "ckpt db upgrade" in outdated.value.hint

    migrate.upgrade(engine, scripts=newer_scripts)
    migrate.check_schema(engine, scripts=newer_scripts)
    assert "note" in {c["name"] for c in inspect(engine).get_columns("packs")}
    assert _count(engine, Chunk) == 1  # the rebuilt table kept its rows and references
    # ... and the code that only knows HEAD must refuse it.
    with pytest.raises(SchemaTooNew) as too_new:
        migrate.check_schema(engine)
    assert too_new.value.fields == {"current": "9999", "head": HEAD}

    migrate.downgrade(engine, HEAD, scripts=newer_scripts)
    migrate.check_schema(engine)
    _assert_foreign_keys_enforced(engine)


def test_failed_migration_changes_nothing(engine: Engine, newer_scripts: Path) -> None:
    broken = (newer_scripts / "versions" / "9999_test_only.py").read_text(encoding="utf-8")
    broken = broken.replace("nullable=True))", 'nullable=True))\n    raise RuntimeError("boom")', 1)
    (newer_scripts / "versions" / "9999_test_only.py").write_text(broken, encoding="utf-8")
    with pytest.raises(RuntimeError, match="boom"):
        migrate.upgrade(engine, scripts=newer_scripts)
    assert migrate.current_revision(engine) == HEAD
    assert "note" not in {c["name"] for c in inspect(engine).get_columns("packs")}
    migrate.check_schema(engine)


def test_initialize_once(db_url: str, newer_scripts: Path) -> None:
    eng = make_engine(db_url)
    try:
        migrate.initialize(eng, {"repo_id": "r1", "format_version": "1"})
        migrate.check_schema(eng)
        with pytest.raises(RepositoryExists):
            migrate.initialize(eng, {"repo_id": "r2", "format_version": "1"}, scripts=newer_scripts)
        assert migrate.current_revision(eng) == HEAD  # a second init upgraded nothing
        with session_factory(eng)() as s:
            assert dict(s.execute(select(RepoMeta.key, RepoMeta.value)).all()) == {
                "repo_id": "r1",
                "format_version": "1",
            }
    finally:
        eng.dispose()


def _assert_foreign_keys_enforced(engine: Engine) -> None:
    with pytest.raises(sqlalchemy.exc.IntegrityError), write_transaction(session_factory(engine)) as s:
        s.add(Chunk(id="d" * 64, pack_id="0" * 64, offset=0, length=1, raw_length=1, encoding=0))


def test_foreign_keys_enforced(engine: Engine) -> None:
    _assert_foreign_keys_enforced(engine)
    with pytest.raises(sqlalchemy.exc.IntegrityError), write_transaction(session_factory(engine)) as s:
        row = {"id": "d" * 64, "pack_id": "0" * 64, "offset": 0, "length": 1, "raw_length": 1}
        s.execute(insert_ignore(Chunk), [{**row, "encoding": 0, "depth": 0, "base_id": None}])
    assert _count(engine, Chunk) == 0


def test_sqlite_pragmas(tmp_path: Path) -> None:
    eng = make_engine(database_url(None, tmp_path))
    try:
        with eng.connect() as conn:
            pragmas = {
                p: conn.exec_driver_sql(f"PRAGMA {p}").scalar()
                for p in ("journal_mode", "synchronous", "wal_autocheckpoint")
            }
            # 2 = FULL; checkpoints every 4096 log pages, not SQLite's 1000
            assert pragmas == {"journal_mode": "wal", "synchronous": 2, "wal_autocheckpoint": 4096}
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        eng.dispose()


def test_insert_ignore_keeps_existing_rows(engine: Engine) -> None:
    sf = session_factory(engine)
    with write_transaction(sf) as s:
        s.execute(insert_ignore(Pack), [_pack("a" * 64, 1), _pack("b" * 64, 1)])
    with write_transaction(sf) as s:
        s.execute(insert_ignore(Pack), [_pack("b" * 64, 2), _pack("c" * 64, 2)])
        s.execute(insert_ignore(Pack.__table__).values(_pack("a" * 64, 3)))  # Core, single row
    with sf() as s:
        sizes = dict(s.execute(select(Pack.id, Pack.size)).all())
        assert sizes == {"a" * 64: 1, "b" * 64: 1, "c" * 64: 2}
        assert s.get_one(Pack, "a" * 64).created_at == NOW  # read back aware, in UTC


def test_write_transaction_rolls_back_on_error(engine: Engine) -> None:
    with pytest.raises(KeyError), write_transaction(session_factory(engine)) as s:
        s.add(Pack(**_pack("e" * 64)))
        s.flush()
        raise KeyError("abort")
    assert _count(engine, Pack) == 0


def test_concurrent_writers_insert_same_rows(engine: Engine) -> None:
    """Two writers racing to insert overlapping content-addressed rows (in key order) both succeed."""
    sf = session_factory(engine)
    rows = [_pack(f"{i:064x}") for i in range(50)]
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def writer(order: list[dict[str, object]]) -> None:
        try:
            barrier.wait()
            with write_transaction(sf) as s:
                for row in order:
                    s.execute(insert_ignore(Pack), [row])
        except BaseException as exc:
            errors.append(exc)

    # Overlapping sets, each in key order (the insert_ignore contract; see its docstring).
    threads = [threading.Thread(target=writer, args=(o,)) for o in (rows[:40], rows[10:])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert _count(engine, Pack) == 50


WRITER = textwrap.dedent(
    """
    import sys, time
    from ckptrepo.db.engine import make_engine, session_factory, write_transaction
    from ckptrepo.db.models import RepoMeta

    sf = session_factory(make_engine(sys.argv[1]))
    for _ in range(int(sys.argv[2])):
        with write_transaction(sf) as s:
            row = s.get_one(RepoMeta, "counter")
            time.sleep(0.002)  # widen the read-modify-write window
            row.value = str(int(row.value) + 1)
    """
)


def test_sqlite_write_transactions_serialize_across_processes(tmp_path: Path) -> None:
    url = database_url(None, tmp_path)
    eng = make_engine(url)
    try:
        migrate.upgrade(eng)
        with write_transaction(session_factory(eng)) as s:
            s.add(RepoMeta(key="counter", value="0"))
        procs = [
            subprocess.Popen([sys.executable, "-c", WRITER, url, "25"], stderr=subprocess.PIPE, text=True)
            for _ in range(3)
        ]
        outcomes = [(p.communicate(timeout=120)[1], p.returncode) for p in procs]
        assert [err for err, code in outcomes if code != 0] == []
        with session_factory(eng)() as s:
            assert s.get_one(RepoMeta, "counter").value == "75"  # no lost update, no "locked"
    finally:
        eng.dispose()


def test_datetimes_are_stored_in_utc(engine: Engine) -> None:
    sf = session_factory(engine)
    with write_transaction(sf) as s:
        s.add(Pack(**{**_pack("f" * 64), "created_at": NOW.astimezone(timezone(timedelta(hours=2)))}))
    with sf() as s:
        got = s.get_one(Pack, "f" * 64).created_at
        assert got == NOW and got.utcoffset() == timedelta(0)
        assert s.scalar(select(func.count()).where(Pack.created_at < NOW + timedelta(seconds=1))) == 1
    with pytest.raises(sqlalchemy.exc.StatementError, match="naive datetime"), write_transaction(sf) as s:
        s.add(Pack(**{**_pack("0" * 64), "created_at": datetime(2026, 1, 1)}))


def test_first_parent_migration_fills_existing_commits(db_url: str) -> None:
    """0004 copies each commit's first parent (its ``parent`` edge at position 0) from ``edges``;
    roots, and parents only through merge or transfer edges, leave it NULL."""
    eng = make_engine(db_url)
    try:
        migrate.upgrade(eng, "0003")
        commits = sqlalchemy.table("commits", *[sqlalchemy.column(c) for c in (
            "id", "message", "created_at", "author", "host", "generation", "skeleton", "n_tensors", "logical_bytes",
            "new_bytes", "stored_bytes", "stall_s", "wait_s", "persist_s", "nonfinite")])
        edges = sqlalchemy.table("edges", *map(sqlalchemy.column, ("child_id", "parent_id", "kind", "position")))
        ids = [c * 64 for c in "abcde"]
        zero = dict.fromkeys(("n_tensors", "logical_bytes", "new_bytes", "stored_bytes", "nonfinite"), 0)
        rows = [{"id": cid, "message": "", "created_at": NOW, "author": "", "host": "", "generation": g,
                 "skeleton": "{}", **zero, "stall_s": 0.0, "wait_s": 0.0, "persist_s": 0.0}
                for cid, g in zip(ids, (1, 2, 2, 3, 3), strict=True)]
        a, b, c, d, e = ids
        with write_connection(eng) as conn:
            conn.execute(sqlalchemy.insert(commits), rows)
            conn.execute(sqlalchemy.insert(edges), [
                {"child_id": b, "parent_id": a, "kind": "parent", "position": 0},
                {"child_id": c, "parent_id": a, "kind": "transfer", "position": 0},
                {"child_id": d, "parent_id": b, "kind": "parent", "position": 0},
                {"child_id": d, "parent_id": c, "kind": "merge", "position": 1},
                {"child_id": e, "parent_id": c, "kind": "parent", "position": 0},
                {"child_id": e, "parent_id": a, "kind": "transfer", "position": 1},
            ])
        migrate.upgrade(eng)
        with session_factory(eng)() as s:
            got = dict(s.execute(select(Commit.id, Commit.first_parent_id)).all())
        assert got == {a: None, b: a, c: None, d: b, e: c}
        columns = [col["name"] for col in inspect(eng).get_columns("commits")]
        if eng.dialect.name == "sqlite":
            assert columns.index("first_parent_id") == columns.index("generation") + 1
        migrate.downgrade(eng, "0003")
        assert "first_parent_id" not in [col["name"] for col in inspect(eng).get_columns("commits")]
    finally:
        eng.dispose()


def _stored(conn: Connection, table: Table, keys: dict[str, object]) -> tuple[object, ...]:
    """The row of ``table`` at ``keys`` as the database holds it, but for those key columns: on
    SQLite each value with its storage class, on PostgreSQL each column's text (so that JSON
    ``null`` and SQL NULL differ)."""
    quote = conn.dialect.identifier_preparer
    columns = [c for c in table.columns if c.name not in keys]
    if conn.dialect.name == "sqlite":
        exprs = [f"typeof({quote.format_column(c)}), {quote.format_column(c)}" for c in columns]
    else:
        exprs = [f"CAST({quote.format_column(c)} AS TEXT)" for c in columns]
    where = " AND ".join(f"{quote.format_column(table.columns[k])} = {':' + k}" for k in keys)
    row = conn.execute(sqlalchemy.text(f"SELECT {', '.join(exprs)} FROM {quote.format_table(table)} WHERE {where}"),
                       keys).one()
    return tuple(row)


def test_insert_tuples_stores_what_insert_stores(engine: Engine) -> None:
    """Rows written through the driver (``insert_tuples``) are the rows SQLAlchemy's ``insert``
    writes for the same values: JSON (None as JSON null), UtcDateTime from another zone, booleans,
    floats with NaN and None, integers."""
    later = NOW.astimezone(timezone(timedelta(hours=-5)))
    a, b, c, d = (ch * 64 for ch in "abcd")
    commit = {"message": "m", "created_at": later, "author": "x", "host": "h", "branch": None, "step": 3,
              "epoch": None, "generation": 2, "first_parent_id": None, "fp_depth": 0, "linear": True,
              "code_version": None, "skeleton": {"d": ["w", {"t": "w"}, "n", None]}, "n_tensors": 1,
              "logical_bytes": 1 << 40, "new_bytes": 0, "stored_bytes": 7, "stall_s": 0.25, "wait_s": 0.0,
              "persist_s": 1e-9, "nonfinite": 0}
    tensor = {"dtype": "float32", "shape": [3, 0, 2], "nbytes": 0, "chunk_size": 4096, "n_chunks": 1, "numel": 0,
              "mean": float("nan"), "std": None, "min": -0.0, "max": 1.5, "l2_norm": None, "abs_max": 2.0,
              "nan_count": 0, "inf_count": 1}
    pairs = [  # (table, key columns, row through insert(), the same row's other key through insert_tuples)
        (Pack, {"id": a}, {"size": 5, "n_chunks": 2, "created_at": later, "deferred": True}, {"id": b}),
        (Commit, {"id": a, "line_id": a}, {**commit, "config": None}, {"id": b, "line_id": b}),
        (Commit, {"id": c, "line_id": c}, {**commit, "config": {"lr": 0.1, "x": [None]}}, {"id": d, "line_id": d}),
        (Edge, {"child_id": a, "parent_id": c}, {"kind": "parent", "position": 0, "mapping": None,
                                                 "fork_line_id": None, "fork_depth": None},
         {"child_id": b, "parent_id": d}),
        (Edge, {"child_id": c, "parent_id": a}, {"kind": "transfer", "position": 1, "mapping": {"w": "v"},
                                                 "fork_line_id": a, "fork_depth": 0},
         {"child_id": d, "parent_id": b}),
        (Tensor, {"key": 1, "id": a}, {**tensor, "lead_key": 0}, {"key": 2, "id": b}),
    ]
    with write_connection(engine) as conn:
        for model, key, values, other in pairs:
            table = cast(Table, model.__table__)
            conn.execute(sqlalchemy.insert(table), [{**key, **values}])
            insert_tuples(conn, model, (*other, *values), [(*other.values(), *values.values())])
    with engine.connect() as conn:
        for model, key, _, other in pairs:
            table = cast(Table, model.__table__)
            keys = list(key)
            assert _stored(conn, table, key) == _stored(conn, table, dict(zip(keys, other.values(), strict=True)))


def test_insert_tuples_ignores_existing_rows_only_when_asked(engine: Engine) -> None:
    columns = ("id", "size", "n_chunks", "created_at", "deferred")
    with write_connection(engine) as conn:
        insert_tuples(conn, Pack, columns, [("a" * 64, 1, 0, NOW, False)])
    with write_connection(engine) as conn:  # insert-or-ignore: the existing row is kept as it is
        insert_tuples(conn, Pack, columns, [("a" * 64, 2, 0, NOW, True), ("b" * 64, 2, 0, NOW, False)], ignore=True)
    with pytest.raises(sqlalchemy.exc.IntegrityError), write_connection(engine) as conn:
        insert_tuples(conn, Pack, columns, [("c" * 64, 3, 0, NOW, False), ("a" * 64, 3, 0, NOW, False)])
    with engine.connect() as conn:
        assert dict(conn.execute(select(Pack.id, Pack.size)).all()) == {"a" * 64: 1, "b" * 64: 2}
    with pytest.raises(ValueError, match="deferred"), write_connection(engine) as conn:
        insert_tuples(conn, Pack, ("id", "size", "n_chunks", "created_at"), [("d" * 64, 1, 0, NOW)])


def test_present_values(engine: Engine) -> None:
    ids = [f"{i:064x}" for i in range(1200)]
    with write_connection(engine) as conn:
        insert_tuples(conn, Pack, ("id", "size", "n_chunks", "created_at", "deferred"),
                      [(i, 1, 0, NOW, False) for i in ids[::3]])
    with engine.connect() as conn:
        asked = [*ids[1:], "f" * 64]  # more than one batch
        assert present_values(conn, cast(Table, Pack.__table__).c.id, asked) == set(ids[3::3])
        assert present_values(conn, cast(Table, Pack.__table__).c.id, []) == set()
