"""The repository folder: finding one, creating one, upgrading its database.

A repository is a ``.ckpt`` folder holding ``config.json`` (``config.RepoConfig``), ``HEAD``
(``db.refs``), by default the SQLite database ``db.sqlite`` and the local pack store ``store/``.
None of these functions opens the repository, so they work on one whose schema needs an upgrade.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ckptrepo.atomic import fsync_dir
from ckptrepo.config import CONFIG_NAME, REPO_DIRNAME, RepoConfig
from ckptrepo.db import migrate
from ckptrepo.db.engine import database_url, make_engine
from ckptrepo.errors import NotARepository, RepositoryExists
from ckptrepo.ledger import identity
from ckptrepo.storage import open_backend


def repo_dir_of(path: str | Path) -> Path:
    """The ``.ckpt`` folder a repository at ``path`` has (``path`` itself if so named)."""
    p = Path(path).expanduser().resolve()
    return p if p.name == REPO_DIRNAME else p / REPO_DIRNAME


def find_repo(path: str | Path = ".", *, search_parents: bool = False) -> Path:
    """The ``.ckpt`` folder at ``path`` (``path`` itself or ``path/.ckpt``), or with
    ``search_parents`` the nearest one at or above it; NotARepository otherwise."""
    p = Path(path).expanduser().resolve()
    if (p / CONFIG_NAME).is_file() and p.name == REPO_DIRNAME:
        return p
    for folder in (p, *p.parents) if search_parents else (p,):
        if (folder / REPO_DIRNAME / CONFIG_NAME).is_file():
            return folder / REPO_DIRNAME
    if not search_parents and (p / CONFIG_NAME).is_file():
        return p
    raise NotARepository(path=str(p))


def create(path: str | Path, config: RepoConfig) -> Path:
    """Create a repository with ``config`` (validated first) at ``path``; returns its folder.

    Nothing is changed if one exists already (RepositoryExists) or the store is unusable (a bad
    URL, a missing bucket). The folder is made whole under a temporary name beside it and
    renamed into place, so a failed create leaves nothing, and of several processes creating
    the same repository at once one succeeds and the others get RepositoryExists. (An existing
    ``.ckpt`` folder without ``config.json`` is initialised in place, ``config.json`` last.)"""
    repo_dir = repo_dir_of(path)
    if (repo_dir / CONFIG_NAME).exists():
        raise RepositoryExists(path=str(repo_dir))
    config.validate()
    open_backend(config.store_url, repo_dir / "store").close()
    if repo_dir.is_dir():
        _initialize(repo_dir, config)
        return repo_dir
    repo_dir.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f"{REPO_DIRNAME}-init-", dir=repo_dir.parent))
    try:
        _initialize(building, config)
        try:
            os.rename(building, repo_dir)
        except OSError as exc:
            if repo_dir.exists():  # another process created it meanwhile
                raise RepositoryExists(path=str(repo_dir)) from exc
            raise
        # The rename is durable only once the parent folder is: commits made next fsync only
        # inside the repository, and a crash must not take the whole folder's name with it.
        fsync_dir(repo_dir.parent)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return repo_dir


def _initialize(repo_dir: Path, config: RepoConfig) -> None:
    """The store's identity (``ledger.identity``: StoreInUse for a store of another repository,
    before anything is made), the schema in the repository's database, then ``config.json``
    (last: until it exists, the folder is not a repository)."""
    backend = open_backend(config.store_url, repo_dir / "store")
    try:
        identity.claim(backend, config.repo_id)
    finally:
        backend.close()
    engine = make_engine(database_url(config.db_url, repo_dir))
    try:
        migrate.initialize(engine, {"repo_id": config.repo_id, "format_version": str(config.format_version)})
    finally:
        engine.dispose()
    config.save(repo_dir)


def upgrade_database(path: str | Path) -> tuple[str | None, str]:
    """Bring the schema of the repository at ``path`` to this code's head; returns (from, to)."""
    repo_dir = find_repo(path)
    config = RepoConfig.load(repo_dir)
    engine = make_engine(database_url(config.db_url, repo_dir))
    try:
        before = migrate.current_revision(engine)
        migrate.upgrade(engine)
        return before, migrate.head_revision()
    finally:
        engine.dispose()
