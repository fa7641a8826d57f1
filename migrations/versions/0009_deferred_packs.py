"""Deferred encoding and repack: ``packs.deferred`` and ``packs.retired_at``.

Revision ID: 0009
Revises: 0007
Create Date: 2026-11-25

``deferred`` marks packs written by a commit that stored its new chunks raw and left their
encoding (byte grouping, delta, zstd) to ``repack``. ``retired_at`` is set by the repack
transaction that moved a pack's last chunk row into new packs: readers that looked the old
location up before that transaction may still read it, so ``gc`` deletes a retired pack only
once ``retired_at`` is older than its grace period (not the pack file's age).

(Revises 0007: revision 0008 is reserved for another change; whichever lands second
re-points its ``down_revision`` so that the chain stays linear.)
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("packs") as batch:
        batch.add_column(sa.Column("deferred", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("packs") as batch:
        batch.drop_column("retired_at")
        batch.drop_column("deferred")
