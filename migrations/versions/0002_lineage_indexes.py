"""Lineage indexes: covering indexes for graph walks along edges, from either end.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

A recursive walk (ancestors, descendants, merge bases, paths, first-parent chains) looks
up the edges of one commit per step, by child or by parent, filtered by kind. Both
indexes hold every column such a step reads, so walks of 10,000 steps stay index-only.
``ix_edges_parent_walk`` leads with ``parent_id`` and replaces ``ix_edges_parent_id``
(the foreign key stays indexed).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_edges_child_walk", "edges", ["child_id", "kind", "position", "parent_id"])
    op.create_index("ix_edges_parent_walk", "edges", ["parent_id", "kind", "child_id"])
    op.drop_index("ix_edges_parent_id", table_name="edges")


def downgrade() -> None:
    op.create_index("ix_edges_parent_id", "edges", ["parent_id"])
    op.drop_index("ix_edges_parent_walk", table_name="edges")
    op.drop_index("ix_edges_child_walk", table_name="edges")
