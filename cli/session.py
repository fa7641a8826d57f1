"""The global options of one ``ckpt`` invocation and how commands open the repository."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from ckptrepo import Repo
from ckptrepo.repository import find_repo


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
