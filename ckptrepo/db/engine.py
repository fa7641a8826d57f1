"""Engines, sessions and write transactions for SQLite (embedded) and PostgreSQL (shared).

Contracts:

- ``make_engine`` owns the driver setup: callers never set PRAGMAs or isolation levels.
- A ``Session`` from ``session_factory`` belongs to the caller that opened it and to one
  thread; close it (``with sf() as s:``).
- Everything that writes goes through ``write_transaction`` (ORM) or ``write_connection``
  (Core): one database transaction, committed when the block exits normally, rolled back
  on any exception. On SQLite it takes the database write lock at BEGIN, so concurrent
  writers (threads or processes) queue on the busy timeout instead of failing halfway.
- ``insert_ignore`` builds the one INSERT that tolerates rows a concurrent commit inserted;
  ``insert_tuples`` runs such an INSERT (or a plain one) for many rows through the driver.
- ``make_engine(url, read_only=True)`` makes an engine whose connections cannot write the
  database (``_sqlite_read_only`` says how on SQLite); ``Repo`` refuses writing calls before
  they reach one, so a write failing there is a bug, not a user's error.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote
from weakref import WeakKeyDictionary

from sqlalchemy import Column, Connection, Engine, Insert, Table, create_engine, event, insert
from sqlalchemy.engine import URL, Dialect, make_url
from sqlalchemy.exc import ArgumentError, CompileError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.sql import ClauseElement, Executable, SyntaxExtension

from ckptrepo import errors, knobs
from ckptrepo.config import SQLITE_NAME
from ckptrepo.errors import UnreadableLog, UsageError

# Execution option read by the SQLite "begin" hook: which BEGIN flavour to emit.
_SQLITE_BEGIN_OPTION = "ckpt_sqlite_begin"
_WRITE_OPTIONS: dict[str, Any] = {_SQLITE_BEGIN_OPTION: "IMMEDIATE"}

_URL_HINT = (
    "Use sqlite:///ABSOLUTE/PATH or postgresql://USER@HOST:PORT/DBNAME "
    "(PostgreSQL is reached through psycopg 3)."
)


Sessions = Callable[[], AbstractContextManager[Session]]
"""A factory of sessions: a ``sessionmaker``, or ``db.pending.reading`` bound to one."""


def database_url(db_url: str | None, repo_dir: Path) -> str:
    """The SQLAlchemy URL for a repository's database.

    ``None`` means the embedded ``<repo_dir>/db.sqlite`` (absolute path).
    ``postgresql://`` and ``postgres://`` select the psycopg 3 driver; ``sqlite:`` and
    ``postgresql+psycopg:`` URLs pass through unchanged. Anything else is a UsageError.
    """
    if db_url is None:
        path = (repo_dir / SQLITE_NAME).absolute()
        # URL.create quotes the characters that URLs reserve ('?', '#', '%') in the path.
        return URL.create("sqlite", database=str(path)).render_as_string(hide_password=False)
    scheme, sep, rest = db_url.partition("://")
    if not sep:
        raise UsageError(f"database URL {db_url!r} has no scheme", hint=_URL_HINT)
    scheme = scheme.lower()
    if scheme in ("postgresql", "postgres"):
        url = f"postgresql+psycopg://{rest}"
    elif scheme in ("sqlite", "sqlite+pysqlite", "postgresql+psycopg"):
        url = db_url
    else:
        raise UsageError(f"unsupported database URL scheme {scheme!r}", hint=_URL_HINT)
    try:
        make_url(url)
    except ArgumentError as exc:
        raise UsageError(f"malformed database URL {db_url!r} ({exc})", hint=_URL_HINT) from exc
    return url


def make_engine(url: str, *, read_only: bool = False) -> Engine:
    """An Engine for ``url`` (from ``database_url``), configured for durability and concurrency.

    SQLite: WAL journal, ``synchronous=FULL``, foreign keys on, a busy timeout of
    ``CKPT_DB_BUSY_TIMEOUT`` seconds, and SQLAlchemy in charge of BEGIN so
    transactions (DDL and SAVEPOINT included) behave as PEP 249 says. PostgreSQL: psycopg 3
    with ``pool_pre_ping`` so a connection dropped by the server is replaced, not reported,
    and sessions in UTC.

    ``read_only``: no connection writes the database. SQLite: opened as ``_sqlite_read_only``
    says, the journal mode left as it is (UnreadableLog when a log cannot be read there);
    PostgreSQL: every transaction is READ ONLY, so the server refuses a write.
    """
    if make_url(url).get_backend_name() == "sqlite":
        return _sqlite_engine(url, read_only=read_only)
    engine = create_engine(url, pool_pre_ping=True)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Timestamps are stored as timestamptz and read back in the session's time zone. In
        # UTC (by that name: "Etc/UTC" would not do) psycopg gives them ``timezone.utc``
        # itself, so reading thousands of them (history, log) needs no conversion.
        # JIT compilation off: the lineage queries run for milliseconds, and the server's
        # default (compile any plan costed above 100,000) spent 53 ms compiling a 10,000-row
        # history query that then ran for 300.
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SET TIME ZONE 'UTC'")
            cursor.execute("SET jit = off")
            if read_only:
                cursor.execute("SET default_transaction_read_only = on")
        dbapi_connection.commit()

    if read_only:
        @event.listens_for(engine, "checkout")
        def _on_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
            # A connection that ran with SQLAlchemy's ``postgresql_readonly`` option (verify's
            # snapshot) comes back to the pool set READ WRITE, which overrides the session's
            # default above: every checkout makes its transactions READ ONLY again.
            dbapi_connection.read_only = True

    return engine


def _sqlite_engine(url: str, *, read_only: bool) -> Engine:
    # sqlite3's ``timeout`` is SQLite's busy timeout: a writer waits this long for another
    # process's write lock before giving up with "database is locked".
    timeout = float(knobs.get_int("DB_BUSY_TIMEOUT"))
    path = make_url(url).database
    if read_only and path not in (None, "", ":memory:"):
        target = _sqlite_read_only(Path(str(path)))
        engine = create_engine(url, creator=lambda: sqlite3.connect(
            target, timeout=timeout, uri=True, check_same_thread=False))
    else:
        engine = create_engine(url, connect_args={"timeout": timeout})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take BEGIN away from sqlite3's legacy transaction control (it skips BEGIN before
        # SELECT and DDL); the "begin" hook below emits it instead. This is SQLAlchemy's
        # documented recipe for pysqlite on every Python version (``autocommit=False``
        # needs 3.12). With no transaction open, the PRAGMAs below take effect.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            if read_only:
                # Any write through this connection fails in SQLite (a read-write open of
                # ``_sqlite_read_only`` included); the journal mode stays what the file says.
                cursor.execute("PRAGMA query_only=ON")
            else:
                # WAL: readers never block the writer and a commit is one append to the log.
                cursor.execute("PRAGMA journal_mode=WAL")
                # In WAL mode NORMAL only syncs at checkpoints, so a power loss can drop the last
                # committed transactions; FULL fsyncs the log at every commit, which makes a
                # committed commit (whose pack bytes are already durable) survive power loss.
                cursor.execute("PRAGMA synchronous=FULL")
            cursor.execute("PRAGMA foreign_keys=ON")
            # Lineage queries walk indexes over millions of rows: read them through the page
            # cache mapping (no copy per page) and keep more of them per connection.
            cursor.execute("PRAGMA mmap_size=1073741824")  # 1 GiB
            cursor.execute("PRAGMA cache_size=-65536")  # 64 MiB
            # Copy the log back into the file every 4096 pages (16 MiB at 4 KiB pages) instead
            # of SQLite's 1000: a commit rewrites the same tail pages of the indexes that grow at
            # their end (entry runs, keys), which a checkpoint then writes once for eight
            # commits or so instead of one or two; ~1.6 CPU-ms less per commit of the
            # training benchmark's state after 2000 others (``bench_commit_cpu.py --prefill 2000``).
            cursor.execute("PRAGMA wal_autocheckpoint=4096")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        options = conn.get_execution_options()
        if options.get("isolation_level") == "AUTOCOMMIT":
            return
        # DEFERRED for readers; IMMEDIATE (from ``write_transaction``) takes the write lock
        # now, waiting on the busy timeout, instead of failing at the first write when
        # another connection committed since this transaction's snapshot.
        mode = options.get(_SQLITE_BEGIN_OPTION, "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


def _sqlite_read_only(path: Path) -> str:
    """The URI that opens the SQLite database ``path`` so that nothing is written to it.

    A WAL database is read through its log (``-wal``) and the log's index (``-shm``):

    - both there (a writer has it open, or left it without a checkpoint): ``mode=ro``. SQLite
      reads the log through the index (on read-only media, a private copy of it; elsewhere it
      updates the index, its shared memory, as every reader does), and a read-only connection
      never copies the log into the database nor removes it.
    - otherwise, in a folder this process may write: a read-write open that ``query_only``
      keeps from writing. SQLite makes the two files while the database is open and removes
      them when the last connection closes; the database file itself is not written.
    - otherwise a log with content but no index (on read-only media, SQLite cannot rebuild
      it): UnreadableLog, rather than silently reading the database without the log.
    - otherwise ``mode=ro&immutable=1``: no log, so the file holds every committed
      transaction; SQLite takes no locks and makes no files. A process writing it through
      another mount of the same files meanwhile is not seen (and not supported).
    """
    log, index = Path(f"{path}-wal"), Path(f"{path}-shm")
    if log.exists() and index.exists():
        return f"file:{quote(str(path))}?mode=ro"
    if os.access(path.parent, os.W_OK):
        return f"file:{quote(str(path))}"
    if log.exists() and log.stat().st_size > 0:
        raise UnreadableLog(path=str(path), log=log.name, index=index.name)
    return f"file:{quote(str(path))}?mode=ro&immutable=1"


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions bound to ``engine``; objects stay readable after commit (``expire_on_commit=False``).

    Each Session is owned by whoever opened it and must stay on one thread.
    """
    return sessionmaker(bind=engine, expire_on_commit=False)


@contextmanager
def write_transaction(sf: sessionmaker[Session]) -> Iterator[Session]:
    """One write transaction in a new Session: commit on normal exit, roll back on any exception.

    Atomic: either every change made through the yielded Session is committed, or none
    is. The Session is closed on exit; do not keep it. On SQLite the transaction starts
    with ``BEGIN IMMEDIATE``, so writers from other threads or processes serialize on the
    write lock (waiting up to the busy timeout) instead of failing mid-transaction.
    """
    with sf() as session, session.begin():
        # Provision the connection now, with the option the SQLite "begin" hook reads.
        session.connection(execution_options=_WRITE_OPTIONS)
        yield session


@contextmanager
def write_connection(engine: Engine, *, enforce_foreign_keys: bool = True) -> Iterator[Connection]:
    """A Connection in one write transaction: commit on normal exit, roll back on any exception.

    The Core counterpart of ``write_transaction`` (same atomicity and SQLite write lock),
    for schema migrations and bulk maintenance. ``enforce_foreign_keys=False`` lets such
    work rebuild tables on SQLite (where foreign keys can only be switched off outside a
    transaction); every foreign key is then checked before COMMIT and a violation rolls
    the transaction back with IntegrityError. PostgreSQL always enforces them.
    """
    with engine.connect() as conn:
        relax = conn.dialect.name == "sqlite" and not enforce_foreign_keys
        if relax:
            _sqlite_pragma(conn, "PRAGMA foreign_keys=OFF")
        try:
            conn.execution_options(**_WRITE_OPTIONS)
            with conn.begin():
                yield conn
                if relax:
                    bad = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                    if bad:
                        table, rowid, parent, _ = bad[0]
                        detail = f"{len(bad)} foreign key violation(s), e.g. {table} row {rowid} -> {parent}"
                        raise errors.IntegrityError(detail=detail)
        finally:
            if relax:
                try:
                    _sqlite_pragma(conn, "PRAGMA foreign_keys=ON")
                except BaseException:
                    # Never hand a connection without foreign keys back to the pool.
                    conn.invalidate()
                    raise


def _sqlite_pragma(conn: Connection, sql: str) -> None:
    # Straight to the driver: through SQLAlchemy the statement would autobegin a
    # transaction, inside which SQLite ignores ``PRAGMA foreign_keys``.
    cursor = conn.connection.cursor()
    try:
        cursor.execute(sql)
    finally:
        cursor.close()


class OnConflictDoNothing(SyntaxExtension, ClauseElement):
    """``ON CONFLICT DO NOTHING`` without a conflict target, for any ``insert()``.

    The clause reads the same on SQLite (3.24+) and PostgreSQL, so one statement serves
    both; other dialects refuse to compile it. Apply with ``insert(t).ext(OnConflictDoNothing())``.
    """

    __visit_name__ = "ckpt_on_conflict_do_nothing"
    inherit_cache = True
    _traverse_internals = []  # noqa: RUF012 (SQLAlchemy's declaration: no state to compare)

    def apply_to_insert(self, insert_stmt: Insert) -> None:
        insert_stmt.apply_syntax_extension_point(self.append_replacing_same_type, "post_values")


@compiles(OnConflictDoNothing, "sqlite")
@compiles(OnConflictDoNothing, "postgresql")
def _compile_on_conflict_do_nothing(element: OnConflictDoNothing, compiler: Any, **kw: Any) -> str:
    return "ON CONFLICT DO NOTHING"


@compiles(OnConflictDoNothing)
def _refuse_on_conflict_do_nothing(element: OnConflictDoNothing, compiler: Any, **kw: Any) -> str:
    raise CompileError(f"ON CONFLICT DO NOTHING is not supported on {compiler.dialect.name}")


def insert_ignore(table: Table | type[DeclarativeBase]) -> Insert:
    """``INSERT ... ON CONFLICT DO NOTHING`` into ``table``, for SQLite and PostgreSQL alike.

    For content-addressed rows (packs, chunks, tensors) that a concurrent commit may have
    inserted first: a row whose key (or any unique column) already exists is kept as it
    is and the new one is skipped. Other violations (foreign keys, NOT NULL) still raise.
    Use like ``insert``: ``session.execute(insert_ignore(Chunk), rows)``.

    Pass ``rows`` sorted by primary key. On PostgreSQL an insert that meets a key another
    open transaction inserted waits for it; two commits sharing rows in different orders
    would each wait for the other (deadlock, one fails). Sorted, they queue instead.
    A mapped class is inserted through its table: rows are plain column dicts, executed by
    the driver without the ORM's per-row bulk handling (~0.2 s of a 16-commit ingest).
    """
    return insert(_table(table)).ext(OnConflictDoNothing())


def _table(table: Table | type[DeclarativeBase]) -> Table:
    return table if isinstance(table, Table) else cast(Table, table.__table__)


@dataclass(frozen=True)
class _TupleInsert:
    """An INSERT for one dialect, in its driver's parameter style, with the bind processors
    of the columns whose SQLAlchemy type converts values there (by position)."""

    sql: str
    processors: tuple[tuple[int, Callable[[Any], Any]], ...]


# Per dialect (weakly: an engine's dialect goes with it), per (table, columns, ignore).
_TUPLE_INSERTS: WeakKeyDictionary[Dialect, dict[tuple[Table, tuple[str, ...], bool], _TupleInsert]] = (
    WeakKeyDictionary())
_MARKS = {"qmark": "?", "format": "%s", "pyformat": "%s"}
_IN_BATCH = 500


def _mark(dialect: Dialect) -> str:
    """The driver's placeholder for one positional parameter."""
    mark = _MARKS.get(dialect.paramstyle)
    if mark is None:
        raise CompileError(f"driver SQL for the {dialect.paramstyle!r} parameter style is not supported")
    return mark


def _tuple_insert(dialect: Dialect, table: Table, columns: tuple[str, ...], ignore: bool) -> _TupleInsert:
    """The statement of ``insert_tuples``, built on first use."""
    cache = _TUPLE_INSERTS.setdefault(dialect, {})
    key = (table, columns, ignore)
    found = cache.get(key)
    if found is not None:
        return found
    missing = [c.name for c in table.columns if c.default is not None and c.name not in columns]
    if missing:
        raise ValueError(f"insert_tuples into {table.name} must name the columns with defaults: {missing}")
    mark = _mark(dialect)
    quote = dialect.identifier_preparer
    cols = [table.columns[name] for name in columns]
    sql = (f"INSERT INTO {quote.format_table(table)} ({', '.join(quote.format_column(c) for c in cols)}) "
           f"VALUES ({', '.join([mark] * len(cols))})")
    if ignore:
        if dialect.name not in ("sqlite", "postgresql"):
            raise CompileError(f"ON CONFLICT DO NOTHING is not supported on {dialect.name}")
        sql += " ON CONFLICT DO NOTHING"
    processors = []
    for i, c in enumerate(cols):
        process = c.type.dialect_impl(dialect).bind_processor(dialect)
        if process is not None:
            processors.append((i, process))
    found = cache[key] = _TupleInsert(sql, tuple(processors))
    return found


def insert_tuples(conn: Connection, table: Table | type[DeclarativeBase], columns: Sequence[str],
                  rows: Sequence[tuple[Any, ...]], *, ignore: bool = False) -> int:
    """Insert ``rows`` into ``table``, each a tuple of the values of ``columns`` in that order, in
    one driver ``executemany`` (``ignore``: ``ON CONFLICT DO NOTHING``, as ``insert_ignore``; pass
    rows sorted by primary key, see there). The caller owns ``conn`` and its transaction.

    Stores exactly what ``conn.execute(insert(table), dicts)`` stores for the same values: each
    column's SQLAlchemy type converts them for the dialect first (JSON encoded, with Python None
    as JSON ``null``; ``UtcDateTime`` in UTC, as text on SQLite), but the statement is built once
    per dialect and there is no per-row parameter processing beyond those conversions (for the
    thousand-odd rows of a commit that processing cost more than the inserts). Columns left out
    are NULL or their server default, never a Python-side default: leaving out one that has such
    a default raises ValueError. Driver errors are raised as SQLAlchemy's (``IntegrityError``...),
    a type's refusal of a value as it is (``UtcDateTime``'s ValueError for a naive datetime).
    Returns how many rows were inserted (fewer than given when ``ignore`` skipped some).
    """
    if not rows:
        return 0
    prepared = _tuple_insert(conn.dialect, _table(table), tuple(columns), ignore)
    if not prepared.processors:
        params: list[tuple[Any, ...]] = rows if isinstance(rows, list) else list(rows)  # many rows: a list
    else:
        params = []
        for row in rows:
            values = list(row)
            for i, process in prepared.processors:
                values[i] = process(values[i])
            params.append(tuple(values))
    result = conn.exec_driver_sql(prepared.sql, params)
    try:
        return int(result.rowcount)
    finally:
        result.close()


def present_values(conn: Connection, column: Column[Any], values: Sequence[str | int]) -> set[Any]:
    """The subset of ``values`` that ``column`` (of a table) holds, looked up by the driver in
    batches of 500 (``column IN (...)``). For text and integer columns, whose values the driver
    takes and returns as they are: no SQLAlchemy type processing, and none of its per-call
    rendering of an expanding IN (for the chunk lookups of a commit's ingest, that cost more
    than the lookups). The caller owns ``conn``."""
    mark = _mark(conn.dialect)
    quote = conn.dialect.identifier_preparer
    head = f"SELECT {quote.format_column(column)} FROM {quote.format_table(column.table)} " \
           f"WHERE {quote.format_column(column)} IN "
    found: set[Any] = set()
    for start in range(0, len(values), _IN_BATCH):
        batch = tuple(values[start : start + _IN_BATCH])
        result = conn.exec_driver_sql(f"{head}({', '.join([mark] * len(batch))})", batch)
        try:
            found.update(value for (value,) in result.cursor.fetchall())
        finally:
            result.close()
    return found


def serial_plans(conn: Connection) -> None:
    """For the rest of ``conn``'s transaction, no parallel plans (PostgreSQL; nothing elsewhere).

    For queries of a few milliseconds that the planner misjudges as worth parallel workers:
    a ``diff`` of two 500-tensor commits ran 12 ms serial against 27-31 ms with two workers
    (their start-up, and the gathered rows' subplans run by the leader alone). The caller owns
    the transaction; the setting ends with it (``SET LOCAL``)."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET LOCAL max_parallel_workers_per_gather = 0")


def fetch_tuples(conn: Connection, statement: Executable,
                 params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    """All rows of ``statement`` as the driver's plain tuples, fetched at once, with values as the
    driver returns them: no SQLAlchemy type processing (SQLite gives ``DateTime`` columns as
    text, see ``models.utc_datetime``, and JSON as text; PostgreSQL's psycopg gives datetimes
    and parsed JSON). For queries of thousands of rows: SQLAlchemy's ``Row`` objects are tracked
    by the garbage collector, a driver's tuples of plain values are not (after their first
    collection), and every ten thousand tracked objects that outlive a query bring the next
    full collection nearer (~100 ms with torch loaded). ``params``: values of the statement's
    ``bindparam``s (a statement built once and run with new values skips rebuilding the
    expression, milliseconds for one with several aliases). The caller owns ``conn``."""
    result = conn.execute(statement, params)
    try:
        return list(result.cursor.fetchall())
    finally:
        result.close()
