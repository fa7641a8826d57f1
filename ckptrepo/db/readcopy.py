"""Pending layouts of a database that may not be written: read from a private, indexed copy.

The tensor-level tables hold a commit's rows only once its pending layout is indexed
(``db.pending``), and indexing writes the database, which a read-only engine cannot
(``engine.make_engine(read_only=True)``: a repository on read-only media, or opened read-only).
``IndexedCopy.reading`` stands in for ``pending.reading`` there: a snapshot that holds no pending
layout is read as it is; one that holds some is copied whole, from that very snapshot (SQLite's
online backup), into a private temporary folder, its layouts are indexed in the copy
(``pending.index_pending``, as the repository itself would), and the session reads the copy. A
reader thus sees every commit with its tensors, exactly as after indexing, and the database is
never written.

A copy costs one read of the database and its size on the temporary filesystem. It is kept
while the database is unchanged (``PRAGMA data_version`` of a connection kept for that), so a
repository on read-only media is copied at most once per ``IndexedCopy``, and one a writer
changes meanwhile is copied again by the next read that finds pending layouts. A copy that was
replaced is deleted once no session reads it; ``close`` deletes the last. Thread-safe: copies
are made one at a time.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import PoolProxiedConnection

from ckptrepo.config import SQLITE_NAME
from ckptrepo.db import pending
from ckptrepo.db.engine import database_url, make_engine, session_factory
from ckptrepo.errors import UsageError


@dataclass
class _Copy:
    """One indexed copy: the data version it was made at (or after), where it lives, its engine,
    and how many sessions read it now."""

    version: int
    folder: Path
    engine: Engine
    sessions: sessionmaker[Session]
    users: int = 0
    replaced: bool = False

    def discard(self) -> None:
        self.engine.dispose()
        shutil.rmtree(self.folder, ignore_errors=True)


class IndexedCopy:
    """``reading`` for the read-only SQLite database behind ``engine`` (see the module docstring).
    Owned by one ``Repo``, which calls ``close`` once no read is in progress."""

    def __init__(self, engine: Engine, sessions: sessionmaker[Session]) -> None:
        self._engine, self._sessions = engine, sessions
        self._lock = threading.Lock()
        self._watch: PoolProxiedConnection | None = None
        self._copy: _Copy | None = None
        self._closed = False

    @contextmanager
    def reading(self) -> Iterator[Session]:
        """A session whose snapshot shows no pending layout: the database's own, or a copy's."""
        # Read before the snapshot starts, so a copy made from it is at least as new as this
        # version says: a copy is reused only while the version has not moved since.
        version = self._version()
        with self._sessions() as s:
            if not pending.exists(s):  # the snapshot starts here (BEGIN DEFERRED)
                yield s
                return
            copy = self._acquire(s, version)
        try:
            with copy.sessions() as c:
                yield c
        finally:
            self._release(copy)

    def close(self) -> None:
        """Delete the copy and release the watching connection; further reads fail."""
        with self._lock:
            self._closed = True
            watch, self._watch = self._watch, None
            copy, self._copy = self._copy, None
        if watch is not None:
            watch.close()
        if copy is not None:
            copy.discard()

    def _version(self) -> int:
        """``PRAGMA data_version`` of the kept connection: it changes whenever another connection
        (of any process) commits a change to the database."""
        with self._lock:
            if self._closed:
                raise UsageError("this repository is closed", hint="Open it again with Repo.open(path).")
            if self._watch is None:
                self._watch = self._engine.raw_connection()
            cursor = self._watch.cursor()
            try:
                # Outside any transaction (the engine's connections leave BEGIN to SQLAlchemy),
                # so this sees the latest commit.
                cursor.execute("PRAGMA data_version")
                row = cursor.fetchone()
                assert row is not None  # this PRAGMA always returns one row
                return int(row[0])
            finally:
                cursor.close()

    def _acquire(self, s: Session, version: int) -> _Copy:
        """The copy for ``version``, made from the snapshot of ``s`` unless kept from before."""
        with self._lock:
            current = self._copy
            if current is None or current.version != version:
                fresh = _indexed_copy(s, version)
                if current is not None:
                    current.replaced = True
                    if current.users == 0:
                        current.discard()
                self._copy = current = fresh
            current.users += 1
            return current

    def _release(self, copy: _Copy) -> None:
        with self._lock:
            copy.users -= 1
            gone = copy.replaced and copy.users == 0
        if gone:
            copy.discard()


def _indexed_copy(s: Session, version: int) -> _Copy:
    """A copy of the database as the snapshot of ``s`` sees it, with its pending layouts indexed."""
    folder = Path(tempfile.mkdtemp(prefix="ckpt-read-"))
    try:
        url = database_url(None, folder)
        # The session's own connection, inside its read transaction: the backup copies that
        # snapshot, whatever other connections commit meanwhile.
        source = s.connection().connection.dbapi_connection
        assert isinstance(source, sqlite3.Connection)
        target = sqlite3.connect(folder / SQLITE_NAME)
        try:
            source.backup(target)
        finally:
            target.close()
        engine = make_engine(url)
        sessions = session_factory(engine)
        try:
            pending.index_pending(sessions)
        except BaseException:
            engine.dispose()
            raise
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return _Copy(version, folder, engine, sessions)
