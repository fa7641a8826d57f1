"""PostgreSQL: ``entries`` by name, covering (``ix_entries_name_commit``).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24

``history`` walks a first-parent chain and looks one tensor name up in ``entries`` at
each commit. Through the primary key (commit_id, name) each lookup lands on its own leaf
page of an index of every entry (276 MB for 2M entries), then on the table: with a default
server's 128 MB shared_buffers a 10,000-commit history read ~14,000 pages from outside
them per call. An index on (name, commit_id) that includes ``tensor_id`` keeps one name's
entries together and answers from the index alone (history of one tensor along 10,000
commits on the benchmark lineage: no page read from outside shared_buffers, ~300 -> ~230 ms).
SQLite gets no such index: it reads its file through the page cache mapping, and was slower
with one. Built in this migration's transaction (CREATE INDEX, not CONCURRENTLY: writers
wait for it, a few seconds per million entries).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.create_index("ix_entries_name_commit", "entries", ["name", "commit_id"], postgresql_include=["tensor_id"])


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_entries_name_commit", table_name="entries")
