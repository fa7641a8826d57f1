"""Integrity: ``commits.damage`` and ``journal_keys``.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28

``commits.damage`` (null, or why): a commit whose data or manifest a database rebuild found
missing or damaged in the store (``maintenance.rebuild``). It stays a lineage node, reading its
state is refused (``CommitDamaged``), ``verify`` fails on it and ``gc`` refuses to run while one
is not pruned (``ckpt prune --damaged`` accepts the loss).

``journal_keys (key)``: the store keys of the journal entries (``ledger.journal``) whose change
this database holds, inserted in the change's own transaction, so that ``verify`` finds an entry
that went missing from the store. Entries written before this revision were never recorded:
``repo_meta.journal_keys_from`` (nanoseconds since the epoch, the time of this upgrade) says from
when the table is complete (no such row: from the start, as in a repository created at 0014).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("commits") as batch:
        batch.add_column(sa.Column("damage", sa.Text(), nullable=True))
    op.create_table(
        "journal_keys",
        sa.Column("key", sa.String(255), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_journal_keys"),
    )
    # A database with commits may have journal entries in its store that no row records; an empty
    # one (a new repository) records every entry from the first.
    if op.get_bind().execute(sa.text("SELECT count(*) FROM commits")).scalar():
        repo_meta = sa.table("repo_meta", sa.column("key", sa.String), sa.column("value", sa.Text))
        op.execute(repo_meta.delete().where(repo_meta.c.key == "journal_keys_from"))
        op.execute(repo_meta.insert().values(key="journal_keys_from", value=str(time.time_ns())))


def downgrade() -> None:
    bind = op.get_bind()
    damaged = bind.execute(sa.text("SELECT count(*) FROM commits WHERE damage IS NOT NULL")).scalar()
    if damaged:
        raise RuntimeError(f"{damaged} commits are marked damaged, which schema 0013 cannot describe")
    op.execute(sa.text("DELETE FROM repo_meta WHERE key = 'journal_keys_from'"))
    op.drop_table("journal_keys")
    with op.batch_alter_table("commits") as batch:
        batch.drop_column("damage")
