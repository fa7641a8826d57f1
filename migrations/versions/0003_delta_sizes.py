"""Delta encoding: each delta chunk records the size its standalone encoding would have had.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22

``chunks.alone_length`` is NULL for standalone chunks (their ``length`` is that size) and
set for DELTA chunks, so ``stats`` can split the bytes saved by encoding into what
compression alone saved and what delta encoding saved on top.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("chunks") as batch:
        batch.add_column(sa.Column("alone_length", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("chunks") as batch:
        batch.drop_column("alone_length")
