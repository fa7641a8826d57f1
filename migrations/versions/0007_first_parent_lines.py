"""First-parent lines: ``commits.line_id``, ``commits.fp_depth`` and ``commits.linear``.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24

A first-parent chain (``history``, ``metrics``) was a recursive walk of one step per commit
(10,000 index lookups along a 10,000-commit run). With each commit placed on a line of
first parents (``ckptrepo.db.lines``) it is one range of the new unique index
``ux_commits_line (line_id, fp_depth)`` per fork on the way. Existing commits are placed
here in generation order (the earliest child of a parent continues its line); new commits
are placed as they are recorded (``catalog.record_commit``). ``linear`` marks the commits
whose ancestors are all on their first-parent chain (no merge or transfer on the way):
their ancestors and log read the chain.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from ckptrepo.db.lines import assign_all

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BATCH = 5000


def _id_type(bind: sa.engine.Connection) -> sa.String:
    return sa.String(64, collation="C") if bind.dialect.name == "postgresql" else sa.String(64)


def upgrade() -> None:
    bind = op.get_bind()
    columns = [sa.Column("line_id", _id_type(bind), nullable=True),
               sa.Column("fp_depth", sa.Integer(), nullable=True),
               sa.Column("linear", sa.Boolean(), nullable=True)]
    # As in 0004: on SQLite the columns go next to ``first_parent_id``, before the large
    # ``skeleton``, so reading them never follows overflow pages.
    if bind.dialect.name == "sqlite":
        with op.batch_alter_table("commits", recreate="always") as batch:
            batch.add_column(columns[0], insert_after="first_parent_id")
            batch.add_column(columns[1], insert_after="line_id")
            batch.add_column(columns[2], insert_after="fp_depth")
    else:
        for column in columns:
            op.add_column("commits", column)
    rows = bind.execute(sa.text(
        "SELECT id, first_parent_id FROM commits ORDER BY generation, created_at, id")).all()
    extra = {r[0] for r in bind.execute(sa.text(
        "SELECT DISTINCT child_id FROM edges WHERE NOT (kind = 'parent' AND position = 0)"))}
    placed = assign_all((r[0], r[1], r[0] in extra) for r in rows)
    update = sa.text("UPDATE commits SET line_id = :line, fp_depth = :depth, linear = :linear WHERE id = :cid")
    values = [{"cid": cid, "line": p.line_id, "depth": p.fp_depth, "linear": p.linear} for cid, p in placed.items()]
    for i in range(0, len(values), _BATCH):
        bind.execute(update, values[i : i + _BATCH])
    with op.batch_alter_table("commits") as batch:
        batch.alter_column("line_id", existing_type=_id_type(bind), nullable=False)
        batch.alter_column("fp_depth", existing_type=sa.Integer(), nullable=False)
        batch.alter_column("linear", existing_type=sa.Boolean(), nullable=False)
    op.create_index("ux_commits_line", "commits", ["line_id", "fp_depth"], unique=True,
                    postgresql_include=["id", "step", "created_at"])


def downgrade() -> None:
    op.drop_index("ux_commits_line", table_name="commits")
    with op.batch_alter_table("commits") as batch:
        batch.drop_column("linear")
        batch.drop_column("fp_depth")
        batch.drop_column("line_id")
