"""The global options of one ``ckpt`` invocation, how commands open the repository, and the
current branch.

The current branch is a CLI notion, like git's HEAD: ``.ckpt/HEAD`` holds one branch name
(``main`` when the file is absent). ``ckpt commit`` without ``-b`` commits on it, ``ckpt log``
without REV shows it, ``ckpt checkout BRANCH`` / ``checkout -b NEW`` switch it. The Python API
has no HEAD: it always names its branch.
"""

from __future__ import annotations

import os
import tempfile
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from ckptrepo import Repo, errors
from ckptrepo.lineage import revparse
from ckptrepo.repository import DEFAULT_BRANCH, find_repo

HEAD_FILE = "HEAD"


@dataclass
class Session:
    """The global options ``--repo`` and ``--debug`` of one invocation."""

    repo: Path | None = None
    debug: bool = False

    def open(self) -> Repo:
        """The repository named by ``--repo``, else the nearest one at or above the working directory."""
        if self.repo is not None:
            return Repo.open(self.repo)
        return Repo.discover(Path.cwd())

    def location(self) -> Path:
        """Where ``open()`` would look, found without opening the database (``db upgrade`` needs this
        for a schema that ``open()`` refuses)."""
        if self.repo is not None:
            return self.repo
        return find_repo(Path.cwd(), search_parents=True)


_current: ContextVar[Session | None] = ContextVar("ckpt_session", default=None)


def begin(session: Session) -> None:
    """Make ``session`` the one ``current()`` returns (the app callback calls this per invocation)."""
    _current.set(session)


def current() -> Session:
    """The session of the running command (defaults when a command function is called directly)."""
    return _current.get() or Session()


def current_branch(repo: Repo) -> str:
    """The branch ``.ckpt/HEAD`` names (``main`` when there is no HEAD file). The branch may
    not exist yet (a new repository, or a branch deleted since): the next commit creates it.
    UsageError when the file holds something that is not a branch name."""
    try:
        text = (repo.repo_dir / HEAD_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return DEFAULT_BRANCH
    name = text.strip()
    try:
        revparse.check_ref_name(name, "branch")
    except errors.InvalidRefName as exc:
        raise errors.UsageError(
            f"{repo.repo_dir / HEAD_FILE} holds {name[:80]!r}, which is not a branch name",
            hint="Switch to a branch with `ckpt checkout BRANCH` (it rewrites the file).",
        ) from exc
    return name


def set_current_branch(repo: Repo, name: str) -> None:
    """Make ``name`` the current branch: write ``.ckpt/HEAD`` atomically, so a reader sees the
    old name or the new one, never a partial file (InvalidRefName for a bad name)."""
    revparse.check_ref_name(name, "branch")
    fd, tmp = tempfile.mkstemp(prefix=".HEAD.", suffix=".tmp", dir=repo.repo_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(name + "\n")
            f.flush()
            os.fsync(f.fileno())  # the new content is on disk before the rename makes it HEAD
        os.replace(tmp, repo.repo_dir / HEAD_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(repo.repo_dir)  # the rename itself survives a crash


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # platforms that cannot open a folder (Windows) persist renames on their own
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def branch_head(repo: Repo, name: str) -> str | None:
    """The commit branch ``name`` points at, None when there is no such branch."""
    return next((ref.commit_id for ref in repo.branches() if ref.name == name), None)


def log_start(repo: Repo, rev: str | None, *, all_commits: bool = False) -> str | None:
    """Where ``ckpt log`` starts: ``rev`` when given; None (every commit) with ``--all`` or in a
    repository without branches; else the current branch. UsageError when the current branch has
    no commits yet while other branches do (like git: nothing to show there)."""
    if rev is not None or all_commits:
        return rev
    name = current_branch(repo)
    branches = repo.branches()
    if any(ref.name == name for ref in branches) or not branches:
        return name if branches else None
    raise errors.UsageError(
        f"the current branch {name!r} has no commits yet",
        hint="Switch with `ckpt checkout BRANCH`, name a revision (`ckpt log REV`), or list all with `ckpt log --all`.",
    )
