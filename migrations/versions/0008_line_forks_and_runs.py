"""Kept by first-parent line: the edges that leave a line, and where each tensor name changes.

Revision ID: 0008
Revises: 0009
Create Date: 2026-11-25

(0008 was reserved for this change while 0009 landed first; it follows 0009 so that the
chain stays linear: 0007 -> 0009 -> 0008.)

Descendants walked ``edges`` one recursive step per commit (8,640 steps for the descendants of
``main~1000`` on the 100,000-commit bench lineage), and ``history`` looked its tensor up in
``entries`` once per commit of the chain (10,000 index probes along a 10,000-commit run).
Both now read by first-parent line (``ckptrepo.db.lines``):

- ``edges.fork_line_id`` / ``edges.fork_depth``: the parent's line and depth on every edge but
  the one along which the child continues its first parent's line, with the partial index
  ``ix_edges_forks``. The descendants of a commit are then a few line ranges and the edges
  forking off them: one recursive step per line.
- ``entry_runs (name, line_id, fp_depth, tensor_id, changed_chunks)``: a row where a tensor
  name changes along a line (and every entry of a line's first commit), with the chunk
  positions that differ from the first parent's tensor; a tensor's history reads one key
  range per line of the chain and no chunk lists. Rows go with their commit (foreign key to its place on the line, ON
  DELETE CASCADE, through ``ix_entry_runs_line``).

Both are filled here from ``edges``, ``commits`` and ``entries``, and written with each new
commit (``catalog.record_commit``). Run ``VACUUM ANALYZE`` (PostgreSQL) or ``ANALYZE``
(SQLite) afterwards, or let autovacuum do it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _id_type(bind: sa.engine.Connection) -> sa.String:
    return sa.String(64, collation="C") if bind.dialect.name == "postgresql" else sa.String(64)


_FORKS = """
UPDATE edges SET
    fork_line_id = (SELECT p.line_id FROM commits p WHERE p.id = edges.parent_id),
    fork_depth = (SELECT p.fp_depth FROM commits p WHERE p.id = edges.parent_id)
WHERE NOT (kind = 'parent' AND position = 0
           AND (SELECT c.line_id FROM commits c WHERE c.id = edges.child_id)
             = (SELECT p.line_id FROM commits p WHERE p.id = edges.parent_id))
"""

# Every entry of a commit that starts its line; else the entries whose tensor differs from
# the first parent's (or that the parent lacks); with the chunk positions that differ from
# the first parent's tensor of the same name ...
_RUNS = """
INSERT INTO entry_runs (name, line_id, fp_depth, tensor_id, changed_chunks)
SELECT e.name, c.line_id, c.fp_depth, e.tensor_id,
       CASE WHEN pe.tensor_id IS NULL OR pe.tensor_id = e.tensor_id THEN 0 ELSE (
           SELECT count(*) FROM tensor_chunks a JOIN tensor_chunks b ON b.tensor_id = pe.tensor_id AND b.seq = a.seq
           WHERE a.tensor_id = e.tensor_id AND a.chunk_id <> b.chunk_id) END
FROM commits c JOIN entries e ON e.commit_id = c.id
LEFT JOIN entries pe ON pe.commit_id = c.first_parent_id AND pe.name = e.name
WHERE c.line_id = c.id OR pe.tensor_id IS NULL OR pe.tensor_id <> e.tensor_id
"""
# ... and the names the first parent has and a commit continuing its line has not.
_REMOVED = """
INSERT INTO entry_runs (name, line_id, fp_depth, tensor_id, changed_chunks)
SELECT pe.name, c.line_id, c.fp_depth, NULL, 0
FROM commits c JOIN entries pe ON pe.commit_id = c.first_parent_id
WHERE c.line_id <> c.id AND NOT EXISTS (
    SELECT 1 FROM entries e WHERE e.commit_id = c.id AND e.name = pe.name)
"""


def upgrade() -> None:
    bind = op.get_bind()
    op.add_column("edges", sa.Column("fork_line_id", _id_type(bind), nullable=True))
    op.add_column("edges", sa.Column("fork_depth", sa.Integer(), nullable=True))
    bind.execute(sa.text(_FORKS))
    where = sa.text("fork_line_id IS NOT NULL")
    op.create_index("ix_edges_forks", "edges", ["fork_line_id", "fork_depth", "kind", "child_id", "parent_id"],
                    sqlite_where=where, postgresql_where=where)
    op.create_table(
        "entry_runs",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("line_id", _id_type(bind), nullable=False),
        sa.Column("fp_depth", sa.Integer(), nullable=False),
        sa.Column("tensor_id", _id_type(bind), nullable=True),
        sa.Column("changed_chunks", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["line_id", "fp_depth"], ["commits.line_id", "commits.fp_depth"],
                                name=op.f("fk_entry_runs_line_id_commits"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("name", "line_id", "fp_depth", name=op.f("pk_entry_runs")),
        sqlite_with_rowid=False,
    )
    bind.execute(sa.text(_RUNS))
    bind.execute(sa.text(_REMOVED))
    op.create_index("ix_entry_runs_line", "entry_runs", ["line_id", "fp_depth"])


def downgrade() -> None:
    op.drop_index("ix_entry_runs_line", table_name="entry_runs")
    op.drop_table("entry_runs")
    op.drop_index("ix_edges_forks", table_name="edges")
    with op.batch_alter_table("edges") as batch:
        batch.drop_column("fork_depth")
        batch.drop_column("fork_line_id")
