"""A database rebuild killed part-way (SIGKILL of a real process at its fault points) leaves the
database as it was, on SQLite and PostgreSQL; the next rebuild completes it, after which every
commit restores bit-exactly.

Two situations: the database was lost (after the kill there is still none: the repository does
not open, nothing half-built is visible), and ``--replace`` over a database that works (after
the kill it is the old one, unchanged).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptrepo
from ckptrepo import faults
from ckptrepo.db import migrate
from ckptrepo.db.engine import database_url, make_engine

CHUNK = 16 * 1024
N = 12
CHILD = """
import sys, ckptrepo
ckptrepo.Repo.rebuild_database(sys.argv[1], replace=sys.argv[2] == "replace")
"""


def _state(i: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(i)
    return {"w": torch.randn(CHUNK // 2, generator=g), "i": torch.tensor(i)}


def _repo(tmp_path: Path, db_url: str) -> tuple[Path, str | None, dict[str, dict[str, Any]], list[Any]]:
    kept = None if db_url.startswith("sqlite") else db_url
    states = {}
    with ckptrepo.Repo.init(tmp_path / "work", db_url=kept, chunk_size=CHUNK) as repo:
        for i in range(N):
            s = _state(i)
            states[repo.commit(s, step=i, metrics={"i": i}, branch="main" if i % 3 else "side").wait().id] = s
        repo.tag("t", at="main~1")
        view = _view(repo)
        return repo.repo_dir, kept, states, view


def _view(repo: ckptrepo.Repo) -> list[Any]:
    return [[(c.id, c.parent_ids, sorted(c.refs), c.metrics) for c in repo.log()],
            [(b.name, b.commit_id) for b in (*repo.branches(), *repo.tags())]]


def _lose(repo_dir: Path, kept: str | None) -> None:
    url = database_url(kept, repo_dir)
    if kept is None:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{repo_dir / 'db.sqlite'}{suffix}").unlink(missing_ok=True)
        return
    engine = make_engine(url)
    with engine.begin() as conn:
        migrate.drop_schema(conn)
    engine.dispose()


def _killed_rebuild(repo_dir: Path, spec: str, *, replace: bool) -> None:
    import os

    env = {**os.environ, faults.ENV: spec}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(repo_dir), "replace" if replace else "new"],
                          env=env, timeout=120, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, (spec, proc.returncode, proc.stderr.decode()[-2000:])


def _restores(repo_dir: Path, states: dict[str, dict[str, Any]], view: list[Any]) -> None:
    with ckptrepo.Repo.open(repo_dir) as repo:
        assert _view(repo) == view
        for cid, state in states.items():
            got = repo.checkout(cid)
            assert got.keys() == state.keys() and all(torch.equal(got[k], v) for k, v in state.items()), cid
        report = repo.verify(full=True)
        assert report.ok and not report.warnings, report.to_json()


@pytest.mark.parametrize("spec", ["rebuild.after_commit=kill@5", "rebuild.before_commit=kill"])
def test_a_rebuild_killed_part_way_leaves_no_database_and_the_next_completes(tmp_path: Path, db_url: str,
                                                                             spec: str) -> None:
    repo_dir, kept, states, view = _repo(tmp_path, db_url)
    _lose(repo_dir, kept)
    _killed_rebuild(repo_dir, spec, replace=False)
    with pytest.raises(ckptrepo.errors.CkptError):  # nothing half-built is visible
        ckptrepo.Repo.open(repo_dir).log()
    report = ckptrepo.Repo.rebuild_database(repo_dir)
    assert report.commits == N and not report.skipped
    _restores(repo_dir, states, view)


def test_a_replacing_rebuild_killed_part_way_leaves_the_old_database(tmp_path: Path, db_url: str) -> None:
    repo_dir, _, states, view = _repo(tmp_path, db_url)
    _killed_rebuild(repo_dir, "rebuild.after_commit=kill@7", replace=True)
    _restores(repo_dir, states, view)  # the old database, as it was
    ckptrepo.Repo.rebuild_database(repo_dir, replace=True)
    _restores(repo_dir, states, view)
