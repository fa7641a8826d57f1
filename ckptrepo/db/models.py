"""SQLAlchemy 2.0 models: the lineage graph and the chunk index.

Ids are 64-character lowercase hex BLAKE3 digests (see ``ckptrepo.ids``). Rows are
only ever inserted by one transaction per commit (``repository``), so a row that is
visible always refers to durable pack bytes (the write ordering in docs/design.md).

Chunks and tensors also have an integer ``key`` (schema 0010), which the rows that refer to
them (``tensor_chunks``, ``entries``, ``entry_runs``, a delta chunk's base) hold instead of
the id. Keys are handed out in increasing order as rows are inserted (``catalog.allocate_keys``),
so a commit's rows land at the end of the indexes over those keys instead of one random place
per row (a digest's place in an index is random): a commit then dirties a few pages of those
indexes where it dirtied one page per row, and the rows and indexes are smaller. Tensors are
indexed by their first chunk's key before their id (``Tensor.lead_key``); only the ``id``
index of ``chunks`` (the dedup lookups) takes a commit's rows at random places.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Sequence,
    SmallInteger,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.expression import false

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# Ids: 64 lowercase hex characters, compared for equality only; byte order ("C") on PostgreSQL,
# whose locale collations make every index lookup of the lineage walks dearer (migration 0006).
# Queries that seed a recursive walk with an id value cast it to ``Id`` (the seed's collation
# must be the column's).
Id = String(64).with_variant(String(64, collation="C"), "postgresql")
# Surrogate keys of chunks and tensors: SQLite's INTEGER PRIMARY KEY AUTOINCREMENT (the rowid
# itself, so the table is stored in key order), PostgreSQL's bigint drawn from a sequence. Keys
# are never given again after their row is deleted: a key someone still holds cannot come to
# name another chunk or tensor.
Key = BigInteger().with_variant(Integer(), "sqlite")
CHUNK_KEYS = Sequence("chunks_key_seq")
TENSOR_KEYS = Sequence("tensors_key_seq")


class JsonType(TypeDecorator[Any]):
    """JSON, stored as JSONB on PostgreSQL. The PostgreSQL type is looked up when a PostgreSQL
    dialect asks for it, so a process on SQLite never imports that dialect (~40 ms at start)."""

    impl = JSON
    cache_ok = True

    def __init__(self, *, none_as_null: bool = False) -> None:
        super().__init__(none_as_null=none_as_null)
        self.none_as_null = none_as_null

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import JSONB

            return dialect.type_descriptor(JSONB(none_as_null=self.none_as_null))
        return dialect.type_descriptor(JSON(none_as_null=self.none_as_null))


class UtcDateTime(TypeDecorator[datetime]):
    """A point in time, stored as UTC and read back timezone-aware (UTC) on every database.

    SQLite has no time zone type: a plain ``DateTime(timezone=True)`` stores an aware
    value's wall-clock digits (whatever its zone) and reads back naive datetimes, which
    neither order correctly nor compare with aware ones. Naive values are refused.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware datetime")
        return value.astimezone(timezone.utc)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


def utc_datetime(value: str | datetime) -> datetime:
    """A ``UtcDateTime`` column's value as the driver returns it (SQLite's stored text, or
    psycopg's datetime; ``engine.fetch_tuples``), converted to what ``UtcDateTime`` reads
    back: timezone-aware, in UTC. For queries of thousands of rows, where SQLAlchemy's
    per-row processing costs more."""
    if isinstance(value, str):
        try:
            # SQLite's text has no offset (stored in UTC); parsing it with one is ~6x faster
            # than ``replace(tzinfo=...)`` after parsing.
            return datetime.fromisoformat(value + "+00:00")
        except ValueError:
            value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value if value.tzinfo is timezone.utc else value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class RepoMeta(Base):
    """Key/value facts about the repository (its id, format version)."""

    __tablename__ = "repo_meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class JournalKey(Base):
    """The store key of a journal entry (``ledger.journal``) whose change this database holds
    (schema 0014), inserted in that change's transaction: ``verify`` reports a key whose entry is
    gone from the store. Complete from ``repo_meta.journal_keys_from`` (ns since the epoch) on."""

    __tablename__ = "journal_keys"
    key: Mapped[str] = mapped_column(String(255), primary_key=True)


class Pack(Base):
    """A durable, immutable pack object in the store, named by the BLAKE3 of its bytes."""

    __tablename__ = "packs"
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    n_chunks: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    # Written by a commit that left its chunks' encoding to ``repack`` (migration 0009).
    deferred: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # When ``repack`` moved its last chunk row away; gc's grace period counts from here.
    retired_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), default=None)
    # NULL: in this repository's store; else the remote whose pack this is (fetched chunks not
    # read yet, read through that remote: ``remote.tiered``; schema 0015).
    remote: Mapped[str | None] = mapped_column(String(80), default=None)


class Chunk(Base):
    """Where a chunk's encoded bytes live. ``id`` is BLAKE3 of the *decoded* bytes.

    ``encoding`` is ``ckptrepo.chunks.codecs.Encoding``; ``base_key`` is the key of the chunk a
    delta is taken against and ``depth`` the length of that delta chain (0 = standalone);
    ``alone_length`` is what a delta chunk's standalone encoding would have taken (NULL
    for standalone chunks, whose ``length`` is that).
    """

    __tablename__ = "chunks"
    key: Mapped[int] = mapped_column(Key, CHUNK_KEYS, primary_key=True, autoincrement=False)
    id: Mapped[str] = mapped_column(Id, unique=True)
    pack_id: Mapped[str] = mapped_column(ForeignKey("packs.id"), index=True)
    offset: Mapped[int] = mapped_column(BigInteger)
    length: Mapped[int] = mapped_column(BigInteger)
    raw_length: Mapped[int] = mapped_column(BigInteger)
    encoding: Mapped[int] = mapped_column(SmallInteger)
    base_key: Mapped[int | None] = mapped_column(Key, ForeignKey("chunks.key"), index=True, default=None)
    depth: Mapped[int] = mapped_column(SmallInteger, default=0)
    alone_length: Mapped[int | None] = mapped_column(BigInteger, default=None)
    # AUTOINCREMENT: SQLite never gives a deleted row's key again (``catalog.allocate_keys``).
    __table_args__ = ({"sqlite_autoincrement": True},)


class Tensor(Base):
    """One distinct tensor value: dtype, shape, ordered chunks and ingest statistics.

    ``id`` hashes dtype, shape, chunk size, chunk ids (and ``boxes`` when set), so identical
    tensors are one row (unique with ``lead_key``, which the id determines).
    Statistics are over the tensor's elements as float64 (None where not meaningful,
    e.g. bool or complex tensors' min/max). A tensor only pruned commits name loses its chunk
    list to ``gc`` and keeps its row (the statistics) with ``lead_key`` = ``-key``: no lookup
    by first chunk finds it again, so a commit of the same value inserts a new row.
    """

    __tablename__ = "tensors"
    key: Mapped[int] = mapped_column(Key, TENSOR_KEYS, primary_key=True, autoincrement=False)
    id: Mapped[str] = mapped_column(Id)
    # The key of the tensor's first chunk (0 for a tensor without chunks; ``-key`` once gc dropped
    # the chunk list of a tensor only pruned commits name). Tensors are unique and
    # looked up by (lead_key, id): a new tensor's first chunk is usually new too, so its row goes
    # to the end of that index, where an index of ids alone takes it at a random place.
    lead_key: Mapped[int] = mapped_column(Key)
    dtype: Mapped[str] = mapped_column(String(32))
    shape: Mapped[list[int]] = mapped_column(JsonType())
    nbytes: Mapped[int] = mapped_column(BigInteger)
    chunk_size: Mapped[int] = mapped_column(BigInteger)
    n_chunks: Mapped[int] = mapped_column(Integer)
    # NULL: the chunks, in order, hold the global row-major bytes (chunk i at i * chunk_size,
    # but for shorter pieces at the edges of the shards a distributed commit wrote). Otherwise
    # ``[[offsets, sizes], ...]``: the chunks hold these boxes' own row-major bytes, in this
    # order (shards not contiguous in the global byte order; schema 0012).
    boxes: Mapped[Any | None] = mapped_column(JsonType(none_as_null=True), default=None)
    numel: Mapped[int] = mapped_column(BigInteger)
    mean: Mapped[float | None] = mapped_column(Float, default=None)
    std: Mapped[float | None] = mapped_column(Float, default=None)
    min: Mapped[float | None] = mapped_column(Float, default=None)
    max: Mapped[float | None] = mapped_column(Float, default=None)
    l2_norm: Mapped[float | None] = mapped_column(Float, default=None)
    abs_max: Mapped[float | None] = mapped_column(Float, default=None)
    nan_count: Mapped[int] = mapped_column(BigInteger, default=0)
    inf_count: Mapped[int] = mapped_column(BigInteger, default=0)
    __table_args__ = (UniqueConstraint("lead_key", "id"), {"sqlite_autoincrement": True})


class TensorChunk(Base):
    """The ``seq``-th chunk of a tensor (byte offset ``seq * tensor.chunk_size``), by keys."""

    __tablename__ = "tensor_chunks"
    tensor_key: Mapped[int] = mapped_column(Key, ForeignKey("tensors.key"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    chunk_key: Mapped[int] = mapped_column(Key, ForeignKey("chunks.key"), index=True)
    # Stored in key order on SQLite (no separate rowid table): a tensor's chunks are one range.
    __table_args__ = ({"sqlite_with_rowid": False},)


class Commit(Base):
    """A node of the lineage graph: one saved state plus what is known about it.

    ``skeleton`` is the state's structure with non-tensor values inline and tensors
    as references to ``entries`` names (see ``ckptrepo.state``). Ingest figures are
    bytes and seconds measured while committing. ``generation`` (1 + the highest
    generation of the parents) and ``first_parent_id`` (the parent of the commit's
    ``parent`` edge at position 0; NULL for a root) are derived from ``edges`` and
    written once, with the commit, so that first-parent chains walk ``commits`` alone.
    ``line_id`` and ``fp_depth`` (first-parent hops to a root) place the commit on a line of
    first parents (``ckptrepo.db.lines``), so that a chain is read as a few index ranges;
    ``linear``: every ancestor is on that chain (no merge or transfer on the way).
    ``pruned`` (schema 0013): retention dropped the commit's data (``maintenance.prune``); it
    stays a lineage node with its edges, metrics, entries and tensor statistics, but ``gc``
    does not count its tensors as live and reading its state is refused.
    ``damage`` (schema 0014): why the commit is damaged (its data or its manifest was missing or
    damaged in the store when a rebuild recreated the database), else NULL. Reading its state is
    refused (``CommitDamaged``) and ``verify`` fails on it until it is pruned.
    """

    __tablename__ = "commits"
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    message: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), index=True)
    author: Mapped[str] = mapped_column(String(255), default="")
    host: Mapped[str] = mapped_column(String(255), default="")
    branch: Mapped[str | None] = mapped_column(String(255), index=True, default=None)
    step: Mapped[int | None] = mapped_column(BigInteger, index=True, default=None)
    epoch: Mapped[int | None] = mapped_column(Integer, default=None)
    generation: Mapped[int] = mapped_column(Integer, default=1)
    first_parent_id: Mapped[str | None] = mapped_column(Id, default=None)
    line_id: Mapped[str] = mapped_column(Id)
    fp_depth: Mapped[int] = mapped_column(Integer, default=0)
    linear: Mapped[bool] = mapped_column(Boolean, default=False)
    config: Mapped[Any | None] = mapped_column(JsonType(), default=None)
    code_version: Mapped[str | None] = mapped_column(String(255), default=None)
    skeleton: Mapped[Any] = mapped_column(JsonType())
    n_tensors: Mapped[int] = mapped_column(Integer, default=0)
    logical_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    new_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    stored_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    stall_s: Mapped[float] = mapped_column(Float, default=0.0)
    wait_s: Mapped[float] = mapped_column(Float, default=0.0)
    persist_s: Mapped[float] = mapped_column(Float, default=0.0)
    nonfinite: Mapped[int] = mapped_column(BigInteger, default=0)
    # The server's default only: rows inserted through the driver (``engine.insert_tuples``)
    # need not name it.
    pruned: Mapped[bool] = mapped_column(Boolean, server_default=false())
    damage: Mapped[str | None] = mapped_column(Text, default=None)


class Entry(Base):
    """A named tensor of a commit. ``name`` is the '/'-joined key path (``state.join_path``);
    ``tensor_key``: the tensor's ``key``."""

    __tablename__ = "entries"
    commit_id: Mapped[str] = mapped_column(ForeignKey("commits.id"), primary_key=True)
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    tensor_key: Mapped[int] = mapped_column(Key, ForeignKey("tensors.key"), index=True)


class Edge(Base):
    """child -> parent with ``kind`` in parent | merge | transfer; ``position`` orders parents.

    The first parent has kind ``parent``; further parents of a merge have kind ``merge``;
    a ``transfer`` edge may carry ``mapping`` {dst tensor name: src tensor name}.
    """

    __tablename__ = "edges"
    child_id: Mapped[str] = mapped_column(ForeignKey("commits.id"), primary_key=True)
    parent_id: Mapped[str] = mapped_column(ForeignKey("commits.id"), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    position: Mapped[int] = mapped_column(Integer, default=0)
    mapping: Mapped[Any | None] = mapped_column(JsonType(), default=None)
    # Where the edge leaves a first-parent line (``ckptrepo.db.lines``): the parent's ``line_id``
    # and ``fp_depth`` on every edge but the one along which the child continues its first
    # parent's line (NULL there). Written once, with the edge (schema 0008).
    fork_line_id: Mapped[str | None] = mapped_column(Id, default=None)
    fork_depth: Mapped[int | None] = mapped_column(Integer, default=None)


class EntryRun(Base):
    """Where tensor ``name`` changes along a first-parent line (``ckptrepo.db.lines``).

    A row for every commit at ``(line_id, fp_depth)`` whose entry ``name`` differs from its
    first parent's (another tensor, added, or removed: ``tensor_key`` NULL) when it continues
    that parent's line, and one for each entry of the commit that starts a line. The tensor
    of ``name`` at depth ``d`` of a line is the row of the highest ``fp_depth <= d`` (none:
    absent). ``changed_chunks``: when the commit's first parent has another tensor of that
    name, how many chunk positions common to both hold different chunk ids (else 0), so a
    history reads no chunk lists. Derived from ``entries`` and ``tensor_chunks`` and written
    with the commit (``catalog.record_commit``); deleted with its commit (ON DELETE CASCADE,
    by the commit's place on its line).
    """

    __tablename__ = "entry_runs"
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    line_id: Mapped[str] = mapped_column(Id, primary_key=True)
    fp_depth: Mapped[int] = mapped_column(Integer, primary_key=True)
    tensor_key: Mapped[int | None] = mapped_column(Key, default=None)
    changed_chunks: Mapped[int] = mapped_column(Integer, default=0)
    __table_args__ = (
        ForeignKeyConstraint(["line_id", "fp_depth"], ["commits.line_id", "commits.fp_depth"], ondelete="CASCADE"),
        # Stored in its key's order on SQLite (no separate rowid table).
        {"sqlite_with_rowid": False},
    )


class PendingLayout(Base):
    """A commit's tensor-level rows not yet in the catalog (schema 0011; ``db.pending``): its
    chunks, tensors and entries, encoded in one value. An asynchronous commit from a training
    loop on SQLite inserts its commit row and this one row in its transaction; ``index_pending``
    expands it into ``chunks``, ``tensors``, ``tensor_chunks``, ``entries`` and ``entry_runs``
    later, in ``seq`` order (a parent before its children), before anything reads them."""

    __tablename__ = "pending_layouts"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    commit_id: Mapped[str] = mapped_column(Id, ForeignKey("commits.id"), unique=True)
    payload: Mapped[bytes] = mapped_column(LargeBinary)


class Ref(Base):
    """A branch (moves by compare-and-swap) or a tag (never moves)."""

    __tablename__ = "refs"
    kind: Mapped[str] = mapped_column(String(8), primary_key=True)
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    commit_id: Mapped[str] = mapped_column(ForeignKey("commits.id"), index=True)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime())


class Metric(Base):
    """A scalar metric of a commit (``val_loss`` = 2.03): recorded with it (part of its id), or,
    ``annotated`` (schema 0016), the current value of a result attached later (``annotations``),
    so that every query over metrics (``where``, ``best``, ``history``) sees both alike."""

    __tablename__ = "metrics"
    commit_id: Mapped[str] = mapped_column(ForeignKey("commits.id"), primary_key=True)
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    value: Mapped[float] = mapped_column(Float)
    annotated: Mapped[bool] = mapped_column(Boolean, server_default=false())


class Annotation(Base):
    """A result attached to a commit after it was made (schema 0016; ``db.notes``): a metric's
    value (``name``, ``value``) or a note (``name`` NULL), its ``source`` and time, and the key of the
    journal entry that holds it (``ledger.journal``, op ``annotate``; the same key on every store the
    entry was copied to, so a fetch adds it once). Every value is kept; the newest per (commit,
    name) is the current one, mirrored in ``metrics`` (``annotated``)."""

    __tablename__ = "annotations"
    key: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    commit_id: Mapped[str] = mapped_column(ForeignKey("commits.id"), index=True)
    name: Mapped[str | None] = mapped_column(String(255), default=None)
    value: Mapped[float | None] = mapped_column(Float, default=None)
    note: Mapped[str | None] = mapped_column(Text, default=None)
    source: Mapped[str | None] = mapped_column(Text, default=None)
    at: Mapped[datetime] = mapped_column(UtcDateTime())
    journal_key: Mapped[str | None] = mapped_column(String(255), index=True, default=None)


class RemotePack(Base):
    """A pack of remote ``remote`` whose footer this repository has read (schema 0015: a cache of
    the remote store, ``ckptrepo.remote``)."""

    __tablename__ = "remote_packs"
    remote: Mapped[str] = mapped_column(String(80), primary_key=True)
    pack_id: Mapped[str] = mapped_column(Id, primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    n_chunks: Mapped[int] = mapped_column(Integer)


class RemoteChunk(Base):
    """A copy of chunk ``chunk_id`` on remote ``remote``: its pack there, byte range and encoding,
    as that pack's footer gives them."""

    __tablename__ = "remote_chunks"
    remote: Mapped[str] = mapped_column(String(80), primary_key=True)
    chunk_id: Mapped[str] = mapped_column(Id, primary_key=True)
    pack_id: Mapped[str] = mapped_column(Id)
    offset: Mapped[int] = mapped_column(BigInteger)
    length: Mapped[int] = mapped_column(BigInteger)
    raw_length: Mapped[int] = mapped_column(BigInteger)
    encoding: Mapped[int] = mapped_column(SmallInteger)
    depth: Mapped[int] = mapped_column(SmallInteger)
    base_id: Mapped[str | None] = mapped_column(Id, default=None)


class RemoteBundle(Base):
    """A bundle of remote ``remote`` this repository has read or written (``remote.bundles``);
    ``covered``: a later bundle repeats its items."""

    __tablename__ = "remote_bundles"
    remote: Mapped[str] = mapped_column(String(80), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    covered: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class RemoteCommit(Base):
    """Remote ``remote`` holds commit ``commit_id``'s manifest (and so its data, which a push
    uploads first): the commit's tier state."""

    __tablename__ = "remote_commits"
    remote: Mapped[str] = mapped_column(String(80), primary_key=True)
    commit_id: Mapped[str] = mapped_column(Id, primary_key=True)


Index("ix_metrics_name_value", Metric.name, Metric.value)
# One commit per depth of each first-parent line; a first-parent chain reads one range per line.
# PostgreSQL reads the range from the index alone (a chain of 10,000: 4 ms against 59 through
# the table); SQLite's chains are cheap without (13 ms).
# ``ux_commits_line`` (in ``schema_metadata``).
# Lineage walks (``lineage.graph``) step along edges from either end, filtered by kind; these
# cover every column a step reads, so a walk never visits the table (first-parent chains filter
# on position). The parent-side one also indexes the ``parent_id`` foreign key.
Index("ix_edges_child_walk", Edge.child_id, Edge.kind, Edge.position, Edge.parent_id)
Index("ix_edges_parent_walk", Edge.parent_id, Edge.kind, Edge.child_id)
# The edges that leave a first-parent line, by where they leave it: a walk up to descendants
# steps per line (a line's range of commits, then the edges forking off that range) instead of
# per commit. Partial: the edges along lines, nearly all of them, are left out.
# ``ix_edges_forks`` (in ``schema_metadata``).
# ``entry_runs`` by commit place, for the cascade when gc deletes a commit.
Index("ix_entry_runs_line", EntryRun.line_id, EntryRun.fp_depth)
# PostgreSQL only: ``history`` looks one tensor name up in ``entries`` at each commit of a
# chain. Through the primary key (commit_id, name) those lookups land on leaf pages spread
# over the whole index (millions of rows, larger than a default server's shared_buffers)
# and then on the table; this index keeps one name's entries together and answers from the
# index alone, so a history walk reads a few thousand pages that stay in shared_buffers.
# SQLite reads its file through the page cache mapping and was slower with such an index.
# ``ix_entries_name_commit`` (in ``schema_metadata``).

# Indexes that exist on one database only (``ddl_if``), by name: what a schema comparison
# (Alembic autogenerate) must leave out on the others (``include_object``).
DIALECT_INDEXES = {"ix_entries_name_commit": "postgresql"}


def schema_metadata() -> MetaData:
    """The whole schema: the models' tables with every index, including those declared with
    options of one database (``postgresql_include``, partial ``*_where``). Those are added here,
    once, for what compares or creates a schema (the migrations' environment, schema tests):
    declaring them loads SQLAlchemy's PostgreSQL dialect, which a process working on SQLite
    would otherwise pay for at every start (~25 ms). Queries never need them declared."""
    if "ux_commits_line" not in {ix.name for ix in Base.metadata.tables["commits"].indexes}:
        Index("ux_commits_line", Commit.line_id, Commit.fp_depth, unique=True,
              postgresql_include=["id", "step", "created_at"])
        Index("ix_edges_forks", Edge.fork_line_id, Edge.fork_depth, Edge.kind, Edge.child_id, Edge.parent_id,
              sqlite_where=Edge.fork_line_id.is_not(None), postgresql_where=Edge.fork_line_id.is_not(None))
        Index("ix_entries_name_commit", Entry.name, Entry.commit_id, postgresql_include=["tensor_key"]).ddl_if(
            dialect="postgresql")
    return Base.metadata


def include_object(dialect: str) -> Callable[[Any, str | None, str, bool, Any], bool]:
    """An Alembic ``include_object`` hook for a database of ``dialect``: every schema object
    but the indexes that ``DIALECT_INDEXES`` gives to another database."""

    def include(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        return not (type_ == "index" and DIALECT_INDEXES.get(name or "", dialect) != dialect)

    return include
