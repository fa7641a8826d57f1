"""Integer keys for chunks and tensors: the rows that refer to them hold the key, not the id.

Revision ID: 0010
Revises: 0008
Create Date: 2026-11-27

``chunks.key`` and ``tensors.key`` (SQLite: the rowid; PostgreSQL: bigint from the sequences
``chunks_key_seq`` and ``tensors_key_seq``) become the primary keys; ``chunks.id`` stays unique,
tensors are unique by ``(lead_key, id)``: ``lead_key`` is the key of the tensor's first chunk
(0 for a tensor without chunks).
``tensor_chunks (tensor_key, seq, chunk_key)``, ``entries.tensor_key``, ``entry_runs.tensor_key``
and ``chunks.base_key`` replace the id columns. Ids are digests, so each row a commit inserted
went to a random place of every index over them: after 2,000 commits of a 212-tensor training
state, one commit dirtied ~3,300 catalog pages (12.9 MiB written with its log) and its
transaction took 44 ms of CPU. Keys grow with each commit, so its rows now go to the end of
those indexes, and so do new tensors, whose first chunk is usually new; only the ``id`` index
of ``chunks`` takes random places.
``tensor_chunks`` and ``entries`` are stored in primary-key order on SQLite (WITHOUT ROWID).

Rebuilds the five tables in this migration's transaction (copies, then the new tables filled
from them by joins on the ids); the downgrade rebuilds them back. Run ``VACUUM`` (SQLite) or
``VACUUM ANALYZE`` (PostgreSQL) afterwards to give the freed pages back.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = ("entry_runs", "entries", "tensor_chunks", "tensors", "chunks")  # referring tables first
_STATS = "numel, mean, std, min, max, l2_norm, abs_max, nan_count, inf_count"
_TENSOR_FIELDS = f"dtype, shape, nbytes, chunk_size, n_chunks, {_STATS}"
_CHUNK_FIELDS = 'pack_id, "offset", length, raw_length, encoding, depth, alone_length'
_SEQUENCES = ("chunks_key_seq", "tensors_key_seq")


def _id(bind: sa.engine.Connection) -> sa.String:
    return sa.String(64, collation="C") if bind.dialect.name == "postgresql" else sa.String(64)


def _key() -> sa.types.TypeEngine[int]:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _json() -> sa.types.TypeEngine[object]:
    from sqlalchemy.dialects.postgresql import JSONB

    return sa.JSON().with_variant(JSONB(), "postgresql")


def _tensor_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("dtype", sa.String(32), nullable=False),
        sa.Column("shape", _json(), nullable=False),
        sa.Column("nbytes", sa.BigInteger(), nullable=False),
        sa.Column("chunk_size", sa.BigInteger(), nullable=False),
        sa.Column("n_chunks", sa.Integer(), nullable=False),
        sa.Column("numel", sa.BigInteger(), nullable=False),
        *[sa.Column(n, sa.Float(), nullable=True) for n in ("mean", "std", "min", "max", "l2_norm", "abs_max")],
        sa.Column("nan_count", sa.BigInteger(), nullable=False),
        sa.Column("inf_count", sa.BigInteger(), nullable=False),
    ]


def _chunk_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("length", sa.BigInteger(), nullable=False),
        sa.Column("raw_length", sa.BigInteger(), nullable=False),
        sa.Column("encoding", sa.SmallInteger(), nullable=False),
    ]


def _runs_table(bind: sa.engine.Connection, tensor: sa.Column[object]) -> None:
    op.create_table(
        "entry_runs",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("line_id", _id(bind), nullable=False),
        sa.Column("fp_depth", sa.Integer(), nullable=False),
        tensor,
        sa.Column("changed_chunks", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["line_id", "fp_depth"], ["commits.line_id", "commits.fp_depth"],
                                name=op.f("fk_entry_runs_line_id_commits"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("name", "line_id", "fp_depth", name=op.f("pk_entry_runs")),
        sqlite_with_rowid=False,
    )
    op.create_index("ix_entry_runs_line", "entry_runs", ["line_id", "fp_depth"])


def _copy_out(bind: sa.engine.Connection, selects: dict[str, str]) -> None:
    """Each table's rows into ``_old_<table>`` (as ``selects`` reads them), then the tables dropped."""
    for table, query in selects.items():
        bind.execute(sa.text(f"CREATE TABLE _old_{table} AS {query}"))
    for table in _TABLES:
        op.drop_table(table)


def _drop_copies(bind: sa.engine.Connection) -> None:
    for table in _TABLES:
        bind.execute(sa.text(f"DROP TABLE _old_{table}"))


def upgrade() -> None:
    bind = op.get_bind()
    _copy_out(bind, {
        "chunks": "SELECT row_number() OVER (ORDER BY pack_id, \"offset\", id) AS key, * FROM chunks",
        "tensors": "SELECT row_number() OVER (ORDER BY id) AS key, * FROM tensors",
        "tensor_chunks": "SELECT * FROM tensor_chunks",
        "entries": "SELECT * FROM entries",
        "entry_runs": "SELECT * FROM entry_runs",
    })
    op.create_table(
        "chunks",
        sa.Column("key", _key(), nullable=False, autoincrement=False),
        sa.Column("id", _id(bind), nullable=False),
        sa.Column("pack_id", _id(bind), nullable=False),
        *_chunk_columns(),
        sa.Column("base_key", _key(), nullable=True),
        sa.Column("depth", sa.SmallInteger(), nullable=False),
        sa.Column("alone_length", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(["base_key"], ["chunks.key"], name=op.f("fk_chunks_base_key_chunks")),
        sa.ForeignKeyConstraint(["pack_id"], ["packs.id"], name=op.f("fk_chunks_pack_id_packs")),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_chunks")),
        sa.UniqueConstraint("id", name=op.f("uq_chunks_id")),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_chunks_base_key", "chunks", ["base_key"])
    op.create_index("ix_chunks_pack_id", "chunks", ["pack_id"])
    op.create_table(
        "tensors",
        sa.Column("key", _key(), nullable=False, autoincrement=False),
        sa.Column("id", _id(bind), nullable=False),
        *_tensor_columns(),
        sa.Column("lead_key", _key(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_tensors")),
        sa.UniqueConstraint("lead_key", "id", name=op.f("uq_tensors_lead_key")),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "tensor_chunks",
        sa.Column("tensor_key", _key(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("chunk_key", _key(), nullable=False),
        sa.ForeignKeyConstraint(["chunk_key"], ["chunks.key"], name=op.f("fk_tensor_chunks_chunk_key_chunks")),
        sa.ForeignKeyConstraint(["tensor_key"], ["tensors.key"], name=op.f("fk_tensor_chunks_tensor_key_tensors")),
        sa.PrimaryKeyConstraint("tensor_key", "seq", name=op.f("pk_tensor_chunks")),
        sqlite_with_rowid=False,
    )
    op.create_index("ix_tensor_chunks_chunk_key", "tensor_chunks", ["chunk_key"])
    op.create_table(
        "entries",
        sa.Column("commit_id", _id(bind), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("tensor_key", _key(), nullable=False),
        sa.ForeignKeyConstraint(["commit_id"], ["commits.id"], name=op.f("fk_entries_commit_id_commits")),
        sa.ForeignKeyConstraint(["tensor_key"], ["tensors.key"], name=op.f("fk_entries_tensor_key_tensors")),
        sa.PrimaryKeyConstraint("commit_id", "name", name=op.f("pk_entries")),
        sqlite_with_rowid=False,
    )
    op.create_index("ix_entries_tensor_key", "entries", ["tensor_key"])
    if bind.dialect.name == "postgresql":
        op.create_index("ix_entries_name_commit", "entries", ["name", "commit_id"],
                        postgresql_include=["tensor_key"])
    _runs_table(bind, sa.Column("tensor_key", _key(), nullable=True))
    bind.execute(sa.text(
        f"INSERT INTO chunks (key, id, base_key, {_CHUNK_FIELDS}) "
        f"SELECT c.key, c.id, b.key, {', '.join('c.' + f.strip() for f in _CHUNK_FIELDS.split(','))} "
        "FROM _old_chunks c LEFT JOIN _old_chunks b ON b.id = c.base_id"))
    bind.execute(sa.text(
        f"INSERT INTO tensors (key, id, lead_key, {_TENSOR_FIELDS}) "
        f"SELECT t.key, t.id, coalesce(c.key, 0), {', '.join('t.' + f.strip() for f in _TENSOR_FIELDS.split(','))} "
        "FROM _old_tensors t LEFT JOIN _old_tensor_chunks tc ON tc.tensor_id = t.id AND tc.seq = 0 "
        "LEFT JOIN _old_chunks c ON c.id = tc.chunk_id"))
    bind.execute(sa.text(
        "INSERT INTO tensor_chunks (tensor_key, seq, chunk_key) SELECT t.key, tc.seq, c.key "
        "FROM _old_tensor_chunks tc JOIN _old_tensors t ON t.id = tc.tensor_id "
        "JOIN _old_chunks c ON c.id = tc.chunk_id"))
    bind.execute(sa.text(
        "INSERT INTO entries (commit_id, name, tensor_key) SELECT e.commit_id, e.name, t.key "
        "FROM _old_entries e JOIN _old_tensors t ON t.id = e.tensor_id"))
    bind.execute(sa.text(
        "INSERT INTO entry_runs (name, line_id, fp_depth, tensor_key, changed_chunks) "
        "SELECT r.name, r.line_id, r.fp_depth, t.key, r.changed_chunks "
        "FROM _old_entry_runs r LEFT JOIN _old_tensors t ON t.id = r.tensor_id"))
    _drop_copies(bind)
    if bind.dialect.name == "postgresql":
        for seq, table in zip(_SEQUENCES, ("chunks", "tensors"), strict=True):
            op.execute(sa.schema.CreateSequence(sa.Sequence(seq)))
            bind.execute(sa.text(f"SELECT setval('{seq}', coalesce((SELECT max(key) FROM {table}), 0) + 1, false)"))


def downgrade() -> None:
    bind = op.get_bind()
    _copy_out(bind, {
        "chunks": f"SELECT c.id, {', '.join('c.' + f.strip() for f in _CHUNK_FIELDS.split(','))}, b.id AS base_id "
                  "FROM chunks c LEFT JOIN chunks b ON b.key = c.base_key",
        "tensors": f"SELECT id, {_TENSOR_FIELDS} FROM tensors",
        "tensor_chunks": "SELECT t.id AS tensor_id, tc.seq, c.id AS chunk_id FROM tensor_chunks tc "
                         "JOIN tensors t ON t.key = tc.tensor_key JOIN chunks c ON c.key = tc.chunk_key",
        "entries": "SELECT e.commit_id, e.name, t.id AS tensor_id FROM entries e "
                   "JOIN tensors t ON t.key = e.tensor_key",
        "entry_runs": "SELECT r.name, r.line_id, r.fp_depth, t.id AS tensor_id, r.changed_chunks "
                      "FROM entry_runs r LEFT JOIN tensors t ON t.key = r.tensor_key",
    })
    if bind.dialect.name == "postgresql":
        for seq in _SEQUENCES:
            op.execute(sa.schema.DropSequence(sa.Sequence(seq)))
    op.create_table(
        "chunks",
        sa.Column("id", _id(bind), nullable=False),
        sa.Column("pack_id", _id(bind), nullable=False),
        *_chunk_columns(),
        sa.Column("base_id", _id(bind), nullable=True),
        sa.Column("depth", sa.SmallInteger(), nullable=False),
        sa.Column("alone_length", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(["base_id"], ["chunks.id"], name=op.f("fk_chunks_base_id_chunks")),
        sa.ForeignKeyConstraint(["pack_id"], ["packs.id"], name=op.f("fk_chunks_pack_id_packs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_chunks")),
    )
    op.create_index("ix_chunks_base_id", "chunks", ["base_id"])
    op.create_index("ix_chunks_pack_id", "chunks", ["pack_id"])
    op.create_table("tensors", sa.Column("id", _id(bind), nullable=False), *_tensor_columns(),
                    sa.PrimaryKeyConstraint("id", name=op.f("pk_tensors")))
    op.create_table(
        "tensor_chunks",
        sa.Column("tensor_id", _id(bind), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("chunk_id", _id(bind), nullable=False),
        sa.ForeignKeyConstraint(["chunk_id"], ["chunks.id"], name=op.f("fk_tensor_chunks_chunk_id_chunks")),
        sa.ForeignKeyConstraint(["tensor_id"], ["tensors.id"], name=op.f("fk_tensor_chunks_tensor_id_tensors")),
        sa.PrimaryKeyConstraint("tensor_id", "seq", name=op.f("pk_tensor_chunks")),
    )
    op.create_index("ix_tensor_chunks_chunk_id", "tensor_chunks", ["chunk_id"])
    op.create_table(
        "entries",
        sa.Column("commit_id", _id(bind), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("tensor_id", _id(bind), nullable=False),
        sa.ForeignKeyConstraint(["commit_id"], ["commits.id"], name=op.f("fk_entries_commit_id_commits")),
        sa.ForeignKeyConstraint(["tensor_id"], ["tensors.id"], name=op.f("fk_entries_tensor_id_tensors")),
        sa.PrimaryKeyConstraint("commit_id", "name", name=op.f("pk_entries")),
    )
    op.create_index("ix_entries_tensor_id", "entries", ["tensor_id"])
    if bind.dialect.name == "postgresql":
        op.create_index("ix_entries_name_commit", "entries", ["name", "commit_id"], postgresql_include=["tensor_id"])
    _runs_table(bind, sa.Column("tensor_id", _id(bind), nullable=True))
    bind.execute(sa.text(f"INSERT INTO chunks (id, {_CHUNK_FIELDS}, base_id) SELECT * FROM _old_chunks"))
    bind.execute(sa.text(f"INSERT INTO tensors (id, {_TENSOR_FIELDS}) SELECT * FROM _old_tensors"))
    for table, columns in (("tensor_chunks", "tensor_id, seq, chunk_id"), ("entries", "commit_id, name, tensor_id"),
                           ("entry_runs", "name, line_id, fp_depth, tensor_id, changed_chunks")):
        bind.execute(sa.text(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM _old_{table}"))
    _drop_copies(bind)
