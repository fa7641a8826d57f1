"""Retention: ``commits.pruned``.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28

``pruned`` (not null, default false) marks a commit whose data retention dropped
(``maintenance.prune``): the commit stays a node of the lineage (its row, edges, metrics,
entries and tensor statistics), but ``gc`` no longer counts its tensors as live, and reading
its state back is refused (``CommitPruned``) from the moment it is marked. See docs/design.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("commits") as batch:
        batch.add_column(sa.Column("pruned", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    bind = op.get_bind()
    pruned = bind.execute(sa.text("SELECT count(*) FROM commits WHERE pruned")).scalar()
    if pruned:
        raise RuntimeError(f"{pruned} commits are pruned, which schema 0012 cannot describe (it would offer "
                           "their data, which gc may have dropped); delete their branches first")
    with op.batch_alter_table("commits") as batch:
        batch.drop_column("pruned")
