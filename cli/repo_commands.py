"""Commands about the repository as a whole: ``init``, ``status``, ``stats``, ``db upgrade|rebuild|manifests``,
``demo``."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import ckptrepo  # its names load when a command runs: `ckpt --version` imports no database stack
from ckptrepo import errors
from ckptrepo.config import SQLITE_NAME, RepoConfig

from . import render
from .options import (
    ChunkSizeOpt,
    CompressionOpt,
    DbUrlOpt,
    DeltaBaseOpt,
    DeltaDepthOpt,
    DeltaOpt,
    DemoDirOpt,
    DemoStepsOpt,
    EncodeOpt,
    InitPathArg,
    JsonOpt,
    ReplaceDbOpt,
    StoreUrlOpt,
)
from .session import branch_head, current


def init(
    path: InitPathArg = None,
    db: DbUrlOpt = None,
    store: StoreUrlOpt = None,
    chunk_size: ChunkSizeOpt = None,
    compression: CompressionOpt = True,
    delta: DeltaOpt = True,
    max_delta_depth: DeltaDepthOpt = None,
    delta_base: DeltaBaseOpt = "root",
    encode: EncodeOpt = "auto",
    as_json: JsonOpt = False,
) -> None:
    """Create a repository in PATH/.ckpt (its database, chunk store and settings)."""
    target = path if path is not None else current().repo or Path(".")
    with ckptrepo.Repo.init(target, db_url=db, store_url=store, chunk_size=chunk_size, compression=compression,
                   delta=delta, max_delta_depth=max_delta_depth, delta_base=delta_base,
                   encode=encode) as repo:
        repo_dir, config = repo.repo_dir, repo.config
    if as_json:
        render.emit_json({"path": str(repo_dir.parent), "repo_dir": str(repo_dir), **_public(config)})
        return
    database = "SQLite in .ckpt" if config.db_url is None else _hide_password(config.db_url)
    store_desc = "local packs in .ckpt/store" if config.store_url is None else config.store_url
    render.out.print(f"Initialized empty ckpt repository in {repo_dir}", markup=False)
    on = config.compression and config.delta
    delta_desc = f"on ({config.delta_base}, depth {config.max_delta_depth})" if on else "off"
    render.out.print(
        f"chunk size {render.size(config.chunk_size)}, compression {'on' if config.compression else 'off'}, "
        f"delta {delta_desc}, encode {config.encode if config.compression else 'off'}, "
        f"database: {database}, store: {store_desc}",
        markup=False,
        style="dim",
    )


def status(as_json: JsonOpt = False) -> None:
    """Show the current branch and its head commit, and where the repository keeps its database and store.

    The current branch (.ckpt/HEAD) is where `ckpt commit` commits; a branch with no
    commits yet is created by its first commit."""
    with current().open() as repo:
        name = repo.head
        head_id = branch_head(repo, name)
        head = repo.get_commit(head_id) if head_id is not None else None
        repo_dir, config, read_only = repo.repo_dir, repo.config, repo.read_only
        replication = repo.replication()
    where = {
        "repository": str(repo_dir),
        "database": f"SQLite {repo_dir / SQLITE_NAME}" if config.db_url is None else _hide_password(config.db_url),
        "store": f"local {repo_dir / 'store'}" if config.store_url is None else config.store_url,
    }
    if as_json:
        render.emit_json({"branch": name, "exists": head is not None, "head": head.to_json() if head else None,
                          "path": str(repo_dir.parent), "repo_dir": str(repo_dir), "database": where["database"],
                          "store": where["store"], "read_only": read_only,
                          "replication": replication.to_json() if replication is not None else None})
        return
    if read_only:
        where["access"] = "read-only"
    if replication is not None:
        where.update(render.replication_rows(replication))
    render.out.print(render.status_grid(name, head, where))


def stats(as_json: JsonOpt = False) -> None:
    """Show the repository's size: commits, logical, unique and stored bytes, dedup and compression."""
    with current().open() as repo:
        result = repo.stats()
        packs, raw = repo.repack_pending()
    if as_json:
        render.emit_json({**result.to_json(), "awaiting_repack_packs": packs, "awaiting_repack_bytes": raw})
    else:
        render.out.print(render.stats_table(result, awaiting_repack=(packs, raw)))


def db_upgrade(as_json: JsonOpt = False) -> None:
    """Upgrade the repository database's schema to this ckptrepo's version (works on an outdated one)."""
    current().check_writable("upgrade the database")
    location = current().location()
    before, after = ckptrepo.upgrade_database(location)
    if as_json:
        render.emit_json({"from_revision": before, "to_revision": after, "upgraded": before != after})
    elif before == after:
        render.out.print(f"database schema already at {after}", markup=False)
    else:
        render.out.print(f"database schema upgraded from {before or 'nothing'} to {after}", markup=False)


def db_rebuild(replace: ReplaceDbOpt = False, as_json: JsonOpt = False) -> None:
    """Recreate the repository's database from its store alone (packs, commit manifests, the journal).

    For a lost or damaged database: commits, lineage, branches, tags, metrics, pruned marks and
    the chunk index come back, in one transaction. Stop every process using the repository first.
    Every manifest and journal entry is checked before it is used; what fails is skipped, and
    commits whose manifest or data is gone come back marked damaged. Exits 0 only when nothing
    was skipped and nothing is damaged, else 5 (the database is rebuilt either way).
    """
    current().check_writable("rebuild the database")
    report = ckptrepo.Repo.rebuild_database(current().location(), replace=replace)
    if as_json:
        render.emit_json(report.to_json())
    else:
        render.out.print(render.rebuild_summary(report), markup=False)
    if not report.ok:
        raise errors.IntegrityError(
            detail=f"the rebuild skipped {len(report.skipped)} object(s) and found {report.damaged} damaged commit(s)",
            hint="The database is rebuilt with what the store holds intact. Restore the objects named above from a "
            "backup and run `ckpt db rebuild --replace` again, or accept the loss with `ckpt prune --damaged`; "
            "`ckpt verify` names per branch the last good commit.")


def db_manifests(as_json: JsonOpt = False) -> None:
    """Write the store's manifests that are missing, damaged or outdated, from the database, so `db rebuild` works."""
    with current().open() as repo:
        written = repo.write_missing_manifests()
    if as_json:
        render.emit_json({"manifests_written": written})
    else:
        render.out.print(f"{written} manifest(s) written" if written else "every commit has its manifest",
                         markup=False)


def demo(directory: DemoDirOpt = None, steps: DemoStepsOpt = 400) -> None:
    """Train a small model on the CPU with commits, branch it, restore it, show log and stats (under a minute)."""
    from ckptrepo.demo import main as run_demo  # torch: only the demo trains a model

    run_demo(directory, steps=steps, console=render.out)


def _public(config: RepoConfig) -> dict[str, Any]:
    data = asdict(config)
    if config.db_url is not None:
        data["db_url"] = _hide_password(config.db_url)
    return data


def _hide_password(url: str) -> str:
    from sqlalchemy.engine import make_url  # imported here: `ckpt --version` loads no database stack
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:  # not an SQLAlchemy URL: show it as given
        return url
