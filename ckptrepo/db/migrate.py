"""Schema migrations, run in-process with Alembic from the scripts shipped in the package.

There is no alembic.ini: the Alembic Config is built here and points at the installed
``ckptrepo.migrations`` package, so this works from a wheel as well as a checkout.
Every function that changes the schema does so in one transaction of its own (committed
at the end, rolled back on any error; SQLite DDL is transactional with ``make_engine``),
so a failed upgrade leaves the database as it was. ``scripts`` (keyword) selects another
script directory; it exists for tests and tools, callers normally leave it out.

Alembic (with Mako: ~11 MiB of memory) loads only to change a schema or to explain a
mismatch: opening a repository at ``HEAD`` reads ``alembic_version`` with plain SQL.
"""

from __future__ import annotations

import importlib.util
import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, insert, inspect, select, text
from sqlalchemy.exc import DBAPIError

from ckptrepo.db.engine import write_connection
from ckptrepo.db.models import Base, RepoMeta, schema_metadata
from ckptrepo.errors import (
    DatabaseMissing,
    FormatError,
    RepositoryExists,
    SchemaOutdated,
    SchemaTooNew,
    UsageError,
    database_damage,
)

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

# The head of the packaged migrations (a test checks it against the scripts): a database
# stamped with it needs no Alembic to open.
HEAD = "0016"

# Key of the PostgreSQL advisory lock that serializes concurrent migrations ("ckpt").
_PG_MIGRATION_LOCK = 0x636B7074


def script_location() -> Path:
    """The directory of the installed ``ckptrepo.migrations`` package (env.py, versions/): found,
    not imported, since it holds scripts that Alembic loads, not live code."""
    spec = importlib.util.find_spec("ckptrepo.migrations")
    if spec is None or spec.origin is None:
        raise FormatError(detail="the ckptrepo.migrations package is not installed; reinstall ckptrepo")
    return Path(spec.origin).resolve().parent


def _config(scripts: Path | None, connection: Connection | None = None) -> Config:
    from alembic.config import Config

    cfg = Config(output_buffer=io.StringIO())
    # Config values go through configparser interpolation: escape '%'.
    location = str(scripts or script_location())
    cfg.set_main_option("script_location", location.replace("%", "%%"))
    cfg.set_main_option("file_template", "%%(rev)s_%%(slug)s")
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def _script_directory(scripts: Path | None) -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config(scripts))


def head_revision(*, scripts: Path | None = None) -> str:
    """The newest schema revision this code knows (the single head of its migrations)."""
    head = _script_directory(scripts).get_current_head()
    if head is None:
        raise FormatError(detail="the packaged migrations have no revisions")
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is stamped with, or None when it has none (empty database)."""
    return _stamp_and_tables(engine)[0]


def _stamp_and_tables(engine: Engine) -> tuple[str | None, set[str]]:
    """``current_revision`` and the names of the database's tables, in one connection."""
    with engine.connect() as conn:
        tables = set(inspect(conn).get_table_names())
        if "alembic_version" not in tables:
            return None, tables
        rows = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    if len(rows) > 1:
        raise FormatError(detail=f"the database is stamped with several schema heads: {sorted(rows)}")
    return (str(rows[0]) if rows else None), tables


@contextmanager
def _migration_transaction(engine: Engine) -> Iterator[Connection]:
    # Foreign keys off on SQLite so batch migrations can rebuild referenced tables;
    # write_connection re-checks all of them before COMMIT.
    with write_connection(engine, enforce_foreign_keys=False) as conn:
        if conn.dialect.name == "postgresql":
            # Two processes upgrading one shared database would both try to create the
            # tables; the second waits here and then finds the schema already at head.
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
        yield conn


def upgrade(engine: Engine, revision: str = "head", *, scripts: Path | None = None) -> None:
    """Upgrade the schema to ``revision`` (default: head), atomically; a no-op when already there."""
    from alembic import command

    with _migration_transaction(engine) as conn:
        command.upgrade(_config(scripts, conn), revision)


def downgrade(engine: Engine, revision: str, *, scripts: Path | None = None) -> None:
    """Downgrade the schema to ``revision`` atomically; ``"base"`` drops every ckpt table and its data."""
    from alembic import command

    with _migration_transaction(engine) as conn:
        command.downgrade(_config(scripts, conn), revision)


def check_schema(engine: Engine, *, scripts: Path | None = None) -> None:
    """Refuse a database this code cannot use as it is; changes nothing.

    Raises DatabaseMissing (a FormatError) when it holds no ckpt schema (a SQLite file deleted,
    emptied or replaced by an empty database; PostgreSQL tables dropped) or lacks tables of its
    schema (some dropped by hand), DatabaseDamaged when SQLite finds the file is no database or
    a corrupt one (``ckpt db rebuild`` fixes these: the store holds the repository),
    SchemaOutdated when it is at an older revision (``ckpt db upgrade`` fixes that) and
    SchemaTooNew when its revision is unknown to this code (written by a newer ckptrepo).
    """
    path = _sqlite_file(engine)
    # Connecting would create an empty file where the repository's database should be, or turn an
    # empty file into a database.
    if path is not None and not path.exists():
        raise DatabaseMissing(detail=f"no ckpt tables: the file {path} is gone")
    if path is not None and path.stat().st_size == 0:
        raise DatabaseMissing(detail=f"no ckpt tables: the file {path} is empty")
    try:
        current, tables = _stamp_and_tables(engine)
    except DBAPIError as e:
        damage = database_damage(e, _where(engine))
        if damage is None:
            raise
        raise damage from e
    if current is None:
        raise DatabaseMissing(detail=f"{_where(engine)} holds no ckpt tables (no schema revision stamped)")
    if scripts is None and current == HEAD:
        _require_tables(engine, tables)
        return
    head = head_revision(scripts=scripts)
    if current == head:
        _require_tables(engine, tables)
        return
    from alembic.util.exc import CommandError

    try:
        known = _script_directory(scripts).get_revision(current) is not None
    except CommandError:
        known = False
    if known:
        raise SchemaOutdated(current=current, head=head)
    raise SchemaTooNew(current=current, head=head)


def _require_tables(engine: Engine, tables: set[str]) -> None:
    """DatabaseMissing when a table of the schema at head is not among ``tables`` (dropped by hand)."""
    missing = sorted(set(Base.metadata.tables) - tables)  # not schema_metadata(): it loads the PostgreSQL dialect
    if missing:
        replace = "" if RepoMeta.__tablename__ in missing else " --replace"  # without repo_meta: no repository
        raise DatabaseMissing(
            detail=f"{_where(engine)} lacks the ckpt tables {', '.join(missing)}",
            hint=f"The store still holds the repository: run `ckpt db rebuild{replace}` to recreate the database "
                 "from it (`ckpt verify` afterwards).")


def initialize(engine: Engine, meta: dict[str, str], *, scripts: Path | None = None) -> None:
    """Create the schema at head and store ``meta`` (``repo_id``, ``format_version``) in repo_meta.

    Atomic: schema and metadata are committed together or not at all. If the database
    already holds a repository (a ``repo_id`` in repo_meta), raises RepositoryExists and
    changes nothing, whatever revision that repository is at. What a ckpt schema dropped by
    hand left behind is dropped first (``_clear_leftovers``).
    """
    if "repo_id" not in meta:
        raise UsageError("repository metadata needs a repo_id")

    with _migration_transaction(engine) as conn:
        if inspect(conn).has_table(RepoMeta.__tablename__):
            existing = conn.execute(select(RepoMeta.value).where(RepoMeta.key == "repo_id")).scalar()
            if existing is not None:
                raise RepositoryExists(path=_where(engine))
        else:
            _clear_leftovers(conn, engine, scripts)
        _create_at_head(conn, scripts)
        conn.execute(insert(RepoMeta), [{"key": key, "value": value} for key, value in meta.items()])


def _create_at_head(conn: Connection, scripts: Path | None) -> None:
    """Create the schema at head in an empty database, in the caller's transaction. On SQLite
    with the packaged migrations, by replaying ``db.head_sqlite`` (what the migrations make,
    statement for statement: a test pins the two equal), which spares a new repository the
    migrations' run and Alembic's import (~1 s of ``ckpt init``); else by running them."""
    from ckptrepo.db import head_sqlite

    if conn.dialect.name == "sqlite" and scripts is None and head_sqlite.REVISION == HEAD:
        for statement in head_sqlite.STATEMENTS:
            conn.exec_driver_sql(statement)
        return
    from alembic import command

    command.upgrade(_config(scripts, conn), "head")


def sqlite_dump(conn: Connection) -> list[str]:
    """Every statement that recreates what an SQLite database holds (its tables, indexes and
    rows, ``sqlite_sequence``'s included), in one order for one schema: what ``db.head_sqlite``
    holds of a database the migrations brought to head (``scripts/gen-sqlite-head`` writes it)."""
    master = conn.exec_driver_sql("SELECT type, name, sql FROM sqlite_master ORDER BY rowid").all()
    made = [(kind, name, sql) for kind, name, sql in master if sql is not None and not name.startswith("sqlite_")]
    # Tables in the order they were made, then indexes by name (Alembic's batch mode makes a
    # table's indexes in no fixed order), then the rest.
    statements = [sql for kind, _, sql in made if kind == "table"]
    statements += [sql for _, sql in sorted((name, sql) for kind, name, sql in made if kind == "index")]
    statements += [sql for kind, _, sql in made if kind not in ("table", "index")]
    for name in (name for kind, name, _ in master if kind == "table"):  # sqlite_sequence's rows too
        for row in sorted(conn.exec_driver_sql(f'SELECT * FROM "{name}"').all(), key=repr):
            statements.append(f'INSERT INTO "{name}" VALUES ({", ".join(_sql_literal(v) for v in row)})')
    return statements


def _sql_literal(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"a migration left a {type(value).__name__} in a new database; extend sqlite_dump for it")
    return str(value) if isinstance(value, int) else "'" + value.replace("'", "''") + "'"


def drop_schema(conn: Connection) -> None:
    """Drop every ckptrepo table, sequence and the Alembic stamp, with their data, in the
    caller's transaction (what a rebuild with ``replace`` and tests of a lost database do; a
    downgrade refuses to drop what an older schema cannot describe, this does not ask). A schema
    dropped part-way is dropped the rest of the way: ``drop_all`` drops each table and sequence
    that exists, a key sequence whose table is gone too."""
    schema_metadata().drop_all(conn, checkfirst=True)
    conn.execute(text("DROP TABLE IF EXISTS alembic_version"))


def _clear_leftovers(conn: Connection, engine: Engine, scripts: Path | None) -> None:
    """Make way for a new schema in a database without ``repo_meta`` (no repository), in the
    caller's transaction: drop what a ckpt schema dropped part-way by hand leaves behind, which
    creating the schema would collide with. PostgreSQL keeps a table's key sequence when the
    table is dropped (``DROP TABLE ... CASCADE`` too); indexes and constraints go with their table.

    - ``alembic_version`` stamped with revisions of these migrations (or empty): the rest of a ckpt
      schema, so every ckpt table, sequence and the stamp are dropped (``drop_schema``);
    - else tables named as ckpt's: they may be another application's, so FormatError, naming them;
    - else the ckpt key sequences that exist (their tables are gone) are dropped.
    """
    tables = set(inspect(conn).get_table_names())
    if "alembic_version" in tables and _stamped_by_these_migrations(conn, scripts):
        drop_schema(conn)
        return
    ours = sorted(tables & set(schema_metadata().tables))
    if ours:
        raise FormatError(
            detail=f"{_where(engine)} holds no repository and no ckpt schema stamp, but tables named as ckpt's "
                   f"({', '.join(ours)})",
            hint="If they are what is left of a ckpt database, drop them (DROP TABLE ... CASCADE) and run the "
                 "command again; else point db_url at another database or schema.")
    schema_metadata().drop_all(conn, checkfirst=True)  # no ckpt table exists: their sequences


def _stamped_by_these_migrations(conn: Connection, scripts: Path | None) -> bool:
    stamps = set(conn.execute(text("SELECT version_num FROM alembic_version")).scalars())
    known = {script.revision for script in _script_directory(scripts).walk_revisions()}
    return stamps <= known


@contextmanager
def building(engine: Engine, meta: dict[str, str], *, replace: bool = False,
             scripts: Path | None = None) -> Iterator[Connection]:
    """A connection inside one transaction that creates the schema at head and stores ``meta``,
    for the caller to fill (``maintenance.rebuild``); all of it commits when the block ends, or
    none of it. A database that holds a repository already is refused (RepositoryExists), unless
    ``replace``: then its tables are dropped first, in the same transaction (a failure or a crash
    before the end leaves it as it was). So is what a ckpt schema dropped by hand left behind
    (``_clear_leftovers``: PostgreSQL's key sequences, the Alembic stamp, the rest of its tables)."""
    if "repo_id" not in meta:
        raise UsageError("repository metadata needs a repo_id")

    with _migration_transaction(engine) as conn:
        if inspect(conn).has_table(RepoMeta.__tablename__):
            existing = conn.execute(select(RepoMeta.value).where(RepoMeta.key == "repo_id")).scalar()
            if existing is not None and not replace:
                raise RepositoryExists(path=_where(engine), hint="Pass replace=True (`ckpt db rebuild --replace`) "
                                       "to rebuild over it, or point the repository at an empty database.")
            drop_schema(conn)
        else:
            _clear_leftovers(conn, engine, scripts)
        _create_at_head(conn, scripts)
        conn.execute(insert(RepoMeta), [{"key": key, "value": value} for key, value in meta.items()])
        yield conn


def _sqlite_file(engine: Engine) -> Path | None:
    url = engine.url
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        return Path(str(url.database))
    return None


def _where(engine: Engine) -> str:
    path = _sqlite_file(engine)
    return str(path) if path is not None else engine.url.render_as_string(hide_password=True)
