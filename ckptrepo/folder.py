"""The repository folder: finding one, creating one, whether it can be written, upgrading its database.

A repository is a ``.ckpt`` folder holding ``config.json`` (``config.RepoConfig``), ``HEAD``
(``db.refs``), by default the SQLite database ``db.sqlite`` and the local pack store ``store/``.
None of these functions opens the repository, so they work on one whose schema needs an upgrade.
"""

from __future__ import annotations

import os
from pathlib import Path

from ckptrepo.atomic import atomic_build
from ckptrepo.config import CONFIG_NAME, REPO_DIRNAME, SQLITE_NAME, RepoConfig
from ckptrepo.db import migrate
from ckptrepo.db.engine import database_url, make_engine
from ckptrepo.errors import DatabaseMissing, NotARepository, OutputExists, ReadOnlyRepository, RepositoryExists
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
    # Built under a temporary name and published durably (``atomic_build``): commits made next
    # fsync only inside the repository, so a crash must not take the folder's name with it.
    try:
        with atomic_build(repo_dir) as building:
            building.mkdir()
            _initialize(building, config)
    except OutputExists as exc:  # another process created it meanwhile
        raise RepositoryExists(path=str(repo_dir)) from exc
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
        migrate.initialize(engine, {"repo_id": config.repo_id, "format_version": str(config.format_version),
                                    identity.CLAIMED: "1"})
    finally:
        engine.dispose()
    config.save(repo_dir)


def write_refusal(repo_dir: Path, config: RepoConfig) -> str | None:
    """Why this process cannot write the repository in ``repo_dir``, or None when it can.

    Looked at: the ``.ckpt`` folder, the SQLite database in it and the local store in it (those
    of the default settings; a PostgreSQL database or a store elsewhere is not probed). A
    read-only mount is seen by its filesystem flag (``statvfs``), whoever runs; anything else
    by ``access(2)``, which answers for this process (root may write where mode bits say no).
    """
    probed = [repo_dir]
    if config.db_url is None:
        probed.append(repo_dir / SQLITE_NAME)
    if config.store_url is None:
        probed.append(repo_dir / "store")
    for path in probed:
        if not path.exists():
            continue
        name = "its folder" if path == repo_dir else f"its {path.name}"
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return f"{name} is on a read-only filesystem"
        if not os.access(path, os.W_OK):
            return f"this process may not write {name}"
    return None


def check_writable(repo_dir: Path, config: RepoConfig, what: str) -> None:
    """ReadOnlyRepository (``what``: the refused action) when ``write_refusal`` names a reason."""
    why = write_refusal(repo_dir, config)
    if why is not None:
        raise ReadOnlyRepository(what=what, path=str(repo_dir), why=why)


def upgrade_database(path: str | Path) -> tuple[str | None, str]:
    """Bring the schema of the repository at ``path`` to this code's head; returns (from, to).
    ReadOnlyRepository, before anything is opened, when it cannot be written; DatabaseMissing,
    changing nothing, when the database holds no ckpt schema (an upgrade would make an empty
    one: ``ckpt db rebuild`` is what recreates a lost database)."""
    repo_dir = find_repo(path)
    config = RepoConfig.load(repo_dir)
    check_writable(repo_dir, config, "upgrade the database")
    if config.db_url is None and not (repo_dir / SQLITE_NAME).exists():  # connecting would create it
        raise DatabaseMissing(detail=f"database file {repo_dir / SQLITE_NAME} is missing")
    engine = make_engine(database_url(config.db_url, repo_dir))
    try:
        before = migrate.current_revision(engine)
        if before is None:
            raise DatabaseMissing(detail="it holds no ckpt schema to upgrade")
        migrate.upgrade(engine)
        return before, migrate.head_revision()
    finally:
        engine.dispose()
