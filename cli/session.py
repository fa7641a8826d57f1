"""The global options of one ``ckpt`` invocation, how commands open the repository, and the
current branch.

The current branch is the repository's, like git's HEAD (``Repo.head``): ``ckpt commit``
without ``-b`` commits on it, ``ckpt log`` without REV shows it, ``ckpt checkout BRANCH`` /
``checkout -b NEW`` switch it (``Repo.switch``).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import ckptrepo  # its names load when a command runs: `ckpt --version` imports no database stack
from ckptrepo import errors

if TYPE_CHECKING:
    from ckptrepo import Repo


@dataclass
class Session:
    """The global options ``--repo``, ``--read-only`` and ``--debug`` of one invocation, and
    whether its command was given ``--json`` (``json``: a failure is then reported as JSON)."""

    repo: Path | None = None
    debug: bool = False
    read_only: bool = False
    json: bool = False

    def open(self) -> Repo:
        """The repository named by ``--repo``, else the nearest one at or above the working directory
        (read-only with ``--read-only``)."""
        if self.repo is not None:
            return ckptrepo.Repo.open(self.repo, read_only=self.read_only)
        return ckptrepo.Repo.discover(Path.cwd(), read_only=self.read_only)

    def check_writable(self, what: str) -> None:
        """ReadOnlyRepository (``what``: the refused action) under ``--read-only``, for the commands
        that write without opening the repository (``db upgrade``, ``db rebuild``)."""
        if self.read_only:
            raise errors.ReadOnlyRepository(what=what, path=str(self.location()), why="opened read-only")

    def location(self) -> Path:
        """Where ``open()`` would look, found without opening the database (``db upgrade`` needs this
        for a schema that ``open()`` refuses)."""
        if self.repo is not None:
            return self.repo
        return ckptrepo.find_repo(Path.cwd(), search_parents=True)


_current: ContextVar[Session | None] = ContextVar("ckpt_session", default=None)


def begin(session: Session) -> None:
    """Make ``session`` the one ``current()`` returns (the app callback calls this per invocation)."""
    _current.set(session)


def current() -> Session:
    """The session of the running command (defaults when a command function is called directly)."""
    return _current.get() or Session()


def branch_head(repo: Repo, name: str) -> str | None:
    """The commit branch ``name`` points at, None when there is no such branch."""
    return next((ref.commit_id for ref in repo.branches() if ref.name == name), None)


def log_start(repo: Repo, rev: str | None, *, all_commits: bool = False) -> str | None:
    """Where ``ckpt log`` starts: ``rev`` when given; None (every commit) with ``--all`` or in a
    repository without branches; else the current branch. UsageError when the current branch has
    no commits yet while other branches do (like git: nothing to show there)."""
    if rev is not None or all_commits:
        return rev
    name = repo.head
    branches = repo.branches()
    if any(ref.name == name for ref in branches) or not branches:
        return name if branches else None
    raise errors.UsageError(
        f"the current branch {name!r} has no commits yet",
        hint="Switch with `ckpt checkout BRANCH`, name a revision (`ckpt log REV`), or list all with `ckpt log --all`.",
    )
