"""Pending layouts: a commit's tensor-level rows recorded as one value, expanded later.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27

``pending_layouts (seq, commit_id, payload)``: an asynchronous commit of a training loop on
SQLite inserts its commit row and one row here (its chunks, tensors and entries, encoded by
``ckptrepo.db.pending``) instead of the ~1,100 rows of ``chunks``, ``tensors``,
``tensor_chunks``, ``entries`` and ``entry_runs`` a 212-tensor state takes; ``index_pending``
inserts those rows later, before anything reads them, and deletes the pending row in the same
transaction. ``seq`` orders them (a parent before its children).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    bind = op.get_bind()
    ident = sa.String(64, collation="C") if bind.dialect.name == "postgresql" else sa.String(64)
    op.create_table(
        "pending_layouts",
        sa.Column("seq", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("commit_id", ident, nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["commit_id"], ["commits.id"], name="fk_pending_layouts_commit_id_commits"),
        sa.PrimaryKeyConstraint("seq", name="pk_pending_layouts"),
        sa.UniqueConstraint("commit_id", name="uq_pending_layouts_commit_id"),
    )


def downgrade() -> None:
    op.drop_table("pending_layouts")
