"""Remotes: what each remote holds, as this repository last saw it.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29

A cache of a remote store's contents (``ckptrepo.remote``), refreshed from the remote by
``push`` and ``fetch`` and never the source of truth: a remote is a store, and its packs'
footers, manifests and ref objects say what it holds.

- ``remote_packs (remote, pack_id)``: packs of the remote whose footers have been read.
- ``remote_chunks (remote, chunk_id)``: a copy of the chunk on the remote (pack, byte range,
  encoding and delta base, as its pack's footer gives them):
  ``push`` sends only chunks without such a row.
- ``remote_commits (remote, commit_id)``: commits whose manifest the remote holds (a commit's
  tier state).
- ``remote_bundles (remote, key)``: the remote's bundles this repository has read (or wrote), and
  whether a later bundle covers them (``remote.bundles``).

``packs.remote``: NULL for a pack in this repository's store, else the remote whose pack a row
names (chunks fetched and not read yet: a lazy clone reads them through that remote).

Remote-tracking refs (``origin/main``) are ``refs`` rows of kind ``remote``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.String(64).with_variant(sa.String(64, collation="C"), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("packs") as batch:
        batch.add_column(sa.Column("remote", sa.String(80), nullable=True))
    op.create_table(
        "remote_packs",
        sa.Column("remote", sa.String(80), nullable=False),
        sa.Column("pack_id", _ID, nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("n_chunks", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("remote", "pack_id", name="pk_remote_packs"),
    )
    op.create_table(
        "remote_chunks",
        sa.Column("remote", sa.String(80), nullable=False),
        sa.Column("chunk_id", _ID, nullable=False),
        sa.Column("pack_id", _ID, nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("length", sa.BigInteger(), nullable=False),
        sa.Column("raw_length", sa.BigInteger(), nullable=False),
        sa.Column("encoding", sa.SmallInteger(), nullable=False),
        sa.Column("depth", sa.SmallInteger(), nullable=False),
        sa.Column("base_id", _ID, nullable=True),
        sa.PrimaryKeyConstraint("remote", "chunk_id", name="pk_remote_chunks"),
    )
    op.create_table(
        "remote_bundles",
        sa.Column("remote", sa.String(80), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("covered", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.PrimaryKeyConstraint("remote", "key", name="pk_remote_bundles"),
    )
    op.create_table(
        "remote_commits",
        sa.Column("remote", sa.String(80), nullable=False),
        sa.Column("commit_id", _ID, nullable=False),
        sa.PrimaryKeyConstraint("remote", "commit_id", name="pk_remote_commits"),
    )


def downgrade() -> None:
    op.execute(sa.text("DELETE FROM refs WHERE kind = 'remote'"))
    op.drop_table("remote_commits")
    op.drop_table("remote_bundles")
    op.drop_table("remote_chunks")
    op.drop_table("remote_packs")
    bind = op.get_bind()
    remote = bind.execute(sa.text("SELECT count(*) FROM packs WHERE remote IS NOT NULL")).scalar()
    if remote:
        raise RuntimeError(f"{remote} packs rows name a remote's packs, which schema 0014 cannot describe")
    with op.batch_alter_table("packs") as batch:
        batch.drop_column("remote")
