"""Annotations: results attached to commits after they were made.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-29

- ``annotations``: every value attached to a commit after the fact (``Repo.annotate``, ``ckpt
  eval``): a metric's value or a note, its source and time, and the key of the journal entry
  (op ``annotate``) that holds it in the store. Nothing is removed when a newer value arrives.
- ``metrics.annotated`` (not null, default false): a ``metrics`` row that mirrors the current
  value of an annotation, so that every query over metrics reads both alike; rows recorded with
  commits keep false.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.String(64).with_variant(sa.String(64, collation="C"), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("metrics") as batch:
        batch.add_column(sa.Column("annotated", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.create_table(
        "annotations",
        sa.Column("key", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("commit_id", _ID, nullable=False),
        sa.Column("name", sa.String(255), nullable=True),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("source", sa.Text(), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("journal_key", sa.String(255), nullable=True),
        sa.ForeignKeyConstraint(["commit_id"], ["commits.id"], name=op.f("fk_annotations_commit_id_commits")),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_annotations")),
    )
    op.create_index(op.f("ix_annotations_commit_id"), "annotations", ["commit_id"])
    op.create_index(op.f("ix_annotations_journal_key"), "annotations", ["journal_key"])


def downgrade() -> None:
    bind = op.get_bind()
    bind.execute(sa.text("DELETE FROM metrics WHERE annotated"))
    op.drop_table("annotations")
    with op.batch_alter_table("metrics") as batch:
        batch.drop_column("annotated")
