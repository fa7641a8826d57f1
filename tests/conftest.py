"""Shared fixtures.

Databases: every test that takes ``db_url`` (or ``engine``) runs once on SQLite and once
on PostgreSQL. The PostgreSQL variant runs when ``CKPT_TEST_POSTGRES_URL`` names a
server database (CI sets it, e.g. ``postgresql://postgres@127.0.0.1:5432/test``) and is
skipped otherwise; each test gets a fresh schema there, dropped afterwards.

Object store: ``s3_url`` is an ``s3://`` store URL in a fresh bucket of a real S3-protocol
server (moto's) that this session starts on loopback, with dummy credentials set in the
environment for that test only.

Slow tests: a test marked ``slow`` (minutes of kill loops, campaigns, spawned job ranks) is
left out unless ``--slow`` or ``CKPT_TEST_SLOW=1`` is given, or ``-m`` selects by marker. The
default run, which CI makes, keeps a representative test of each kind unmarked (every kill
test's kind, single-rank kills of a job, the tamper campaign at its CI size, the README, ...)
and marks their repeats (more kill moments, more world sizes, the PostgreSQL twin of a test
whose database plays no part: ``slow(only="postgres")``); ``./scripts/test --slow`` runs all.

Background repack: off (``CKPT_IDLE_REPACK=0``) unless a test turns it on, so that what a
test reads after a commit (stats, packs, encodings) does not depend on how far an idle-time
repack got meanwhile; ``tests/integration/test_repack.py`` and the kill tests run it.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from ckptrepo.db import migrate
from ckptrepo.db.engine import database_url, make_engine

POSTGRES_ENV = "CKPT_TEST_POSTGRES_URL"
os.environ.setdefault("CKPT_IDLE_REPACK", "0")
S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "ckpt-test",
    "AWS_SECRET_ACCESS_KEY": "ckpt-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run the tests marked slow (CKPT_TEST_SLOW=1 does the same)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the tests marked ``slow`` unless asked for (see the module docstring)."""
    if config.getoption("--slow") or os.environ.get("CKPT_TEST_SLOW") == "1" or config.getoption("markexpr"):
        return
    slow = [item for item in items if _slow(item)]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not _slow(item)]


def _slow(item: pytest.Item) -> bool:
    """Marked ``slow``; ``slow(only="postgres")`` marks only the PostgreSQL variant of a test that
    runs on both databases (its SQLite variant stays in the default run)."""
    marker = item.get_closest_marker("slow")
    if marker is None:
        return False
    only = marker.kwargs.get("only")
    return only is None or (getattr(item, "callspec", None) is not None and item.callspec.params.get("db_url") == only)


def postgres_base_url() -> str | None:
    """The server database named by ``CKPT_TEST_POSTGRES_URL``, or None when unset."""
    return os.environ.get(POSTGRES_ENV) or None


@contextmanager
def pg_schema_url(base_url: str) -> Iterator[str]:
    """A fresh, empty schema ``t_<hex>`` in the database at ``base_url``, dropped (CASCADE) on exit.

    Yields a ``postgresql+psycopg`` URL whose connections use that schema as their
    ``search_path``, so every table (``alembic_version`` included) lands in it. Dispose
    every engine made from the URL before the block ends, or the drop waits on its locks
    (it gives up after 10 s rather than hang the test run).
    """
    url = make_url(database_url(base_url, Path.cwd()))
    schema = f"t_{uuid.uuid4().hex}"
    admin = create_engine(url, poolclass=NullPool)
    try:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        try:
            yield url.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
                hide_password=False
            )
        finally:
            with admin.begin() as conn:
                conn.exec_driver_sql("SET LOCAL lock_timeout = '10s'")
                conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        admin.dispose()


@pytest.fixture(scope="session")
def pg_schemas() -> Any:
    """For fixtures wider than a test: ``pg_schema_url`` over ``CKPT_TEST_POSTGRES_URL`` (a
    context manager of a fresh schema's URL), or None when that is unset."""
    base = postgres_base_url()
    return None if base is None else (lambda: pg_schema_url(base))


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL of an empty database: a SQLite file in ``tmp_path`` (not created yet), or a fresh PG schema."""
    if request.param == "sqlite":
        yield database_url(None, tmp_path)
        return
    base = postgres_base_url()
    if base is None:
        pytest.skip(f"{POSTGRES_ENV} is not set")
    with pg_schema_url(base) as url:
        yield url


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    """An Engine on ``db_url`` with the schema upgraded to head; disposed after the test."""
    eng = make_engine(db_url)
    try:
        migrate.upgrade(eng)
        yield eng
    finally:
        eng.dispose()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of an S3-protocol server (moto) running for the whole session.

    S3 applies a conditional PUT (``If-Match``, ``If-None-Match``) atomically; moto checks the
    condition, then writes, with nothing held in between, so two racing PUTs with one ETag can
    both succeed there (a lost update that the store's compare-and-swap tests see under load).
    PUTs are serialized in this server, which then keeps S3's contract."""
    from moto.s3.responses import S3Response
    from moto.server import ThreadedMotoServer

    _serialize_puts(S3Response)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def _serialize_puts(response: Any) -> None:
    """Run moto's ``put_object`` handler under one lock (once per process)."""
    import threading

    if getattr(response.put_object, "_ckpt_serialized", False):
        return
    lock, put = threading.Lock(), response.put_object

    def locked_put(self: Any) -> Any:
        with lock:
            return put(self)

    locked_put._ckpt_serialized = True  # type: ignore[attr-defined]
    response.put_object = locked_put


@pytest.fixture
def s3_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dummy credentials (and no AWS config files) for this test's boto3 clients."""
    for name, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)


@pytest.fixture
def s3_url(s3_endpoint: str, s3_credentials: None) -> str:
    """``s3://BUCKET/PREFIX?endpoint_url=...`` in a bucket made for this test (empty)."""
    import boto3

    bucket = f"ckpt-{uuid.uuid4().hex[:20]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/repo/store?endpoint_url={s3_endpoint}"
