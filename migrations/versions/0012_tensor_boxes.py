"""Tensor boxes: the stored byte order of a tensor committed from shards that are not contiguous.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28

``tensors.boxes`` (JSON, nullable): NULL for a tensor whose chunks, in order, hold its global
row-major bytes (every tensor before this revision, and every tensor whose shards are each one
range of those bytes); otherwise the list of ``[offsets, sizes]`` boxes, in the order the
chunks hold them, each box's own row-major bytes (a column shard, say). See docs/design.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _json() -> sa.types.TypeEngine[object]:
    from sqlalchemy.dialects.postgresql import JSONB

    return sa.JSON().with_variant(JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("tensors") as batch:
        batch.add_column(sa.Column("boxes", _json(), nullable=True))


def downgrade() -> None:
    bind = op.get_bind()
    boxed = bind.execute(sa.text("SELECT count(*) FROM tensors WHERE boxes IS NOT NULL")).scalar()
    if boxed:
        raise RuntimeError(f"{boxed} tensors are stored as boxes, which schema 0011 cannot describe; "
                           "export them (ckpt checkout REV -o FILE) and delete their commits first")
    with op.batch_alter_table("tensors") as batch:
        batch.drop_column("boxes")
