"""Alembic environment for ckptrepo; run in-process by ``ckptrepo.db.migrate`` (no alembic.ini).

Online, the caller normally hands over a Connection in ``config.attributes["connection"]``
and owns its transaction (``migrate.upgrade`` runs every step in one transaction it
commits); without one, an Engine is made from ``sqlalchemy.url`` and the migrations run
in a transaction of their own. Offline (``--sql``) renders SQL for ``sqlalchemy.url``.
"""

from __future__ import annotations

from typing import Any, Literal

from alembic import context
from sqlalchemy import Connection
from sqlalchemy.types import TypeDecorator

from ckptrepo.db.engine import make_engine
from ckptrepo.db.models import include_object, schema_metadata

config = context.config
target_metadata = schema_metadata()


def render_item(type_: str, obj: Any, autogen_context: Any) -> str | Literal[False]:
    """Render model TypeDecorators as the column type they store.

    Revision files are frozen history: they must not import ``ckptrepo.db.models``,
    whose classes change with the code.
    """
    if type_ == "type" and isinstance(obj, TypeDecorator):
        return f"sa.{obj.impl!r}"
    return False


def _common_options(is_sqlite: bool) -> dict[str, Any]:
    return {
        "target_metadata": target_metadata,
        # Autogenerate leaves out the indexes that exist on the other database only.
        "include_object": include_object("sqlite" if is_sqlite else "postgresql"),
        # SQLite cannot ALTER most things: emit batch (copy-and-move) operations for it.
        "render_as_batch": is_sqlite,
        "compare_type": True,
        "render_item": render_item,
    }


def _run_online(connection: Connection) -> None:
    # The ckptrepo engine makes SQLite DDL transactional (SQLAlchemy emits BEGIN), so a
    # failed migration rolls back on SQLite as it does on PostgreSQL.
    context.configure(
        connection=connection,
        transactional_ddl=True,
        **_common_options(connection.dialect.name == "sqlite"),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_online(connection)
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url") or "")
    try:
        with engine.connect() as connection:
            _run_online(connection)
    finally:
        engine.dispose()


def run_migrations_offline() -> None:
    url = config.get_main_option("sqlalchemy.url") or ""
    context.configure(
        url=url,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        **_common_options(url.startswith("sqlite")),
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
