"""From an exception to what the user sees: one ``error:`` line, one ``hint:`` line, an exit code.

``ckptrepo.errors.CkptError`` subclasses carry their own ``exit_code`` and ``hint``;
``FAILURES`` covers the exceptions from outside the library that a command can meet (and a SQLite
database's damage, however it surfaced, is ``errors.DatabaseDamaged``).
Anything else is a bug or an unforeseen input: exit 1, traceback only with ``--debug``.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Final

import typer

from ckptrepo import errors

EXIT_INTERRUPTED: Final = 130

# First match wins, so subclasses come before their bases.
FAILURES: Final[tuple[tuple[type[BaseException], int, str], ...]] = (
    (KeyboardInterrupt, EXIT_INTERRUPTED, "Interrupted; a commit that had not finished is not visible."),
    (PermissionError, 7, "Check the permissions of that path."),
    (FileNotFoundError, 3, "Check the path."),
    (IsADirectoryError, 2, "Give a file path, not a folder."),
    (OSError, 7, "Check free space, permissions and the path; nothing partial was made visible."),
    (MemoryError, 1, "The state does not fit in memory; commit it from the training process instead."),
)
UNEXPECTED_HINT: Final = "This looks like a bug in ckptrepo; rerun with --debug for the traceback and report it."


@dataclass(frozen=True)
class Failure:
    """What to print and exit with for one exception."""

    exit_code: int
    message: str
    hint: str


def classify(exc: BaseException) -> Failure:
    """Map ``exc`` through the library's own fields, else ``FAILURES``, else 'unexpected'. A SQLite
    database found damaged by whatever query met it counts as the library's DatabaseDamaged."""
    if not isinstance(exc, errors.CkptError):
        exc = errors.database_damage(exc) or exc
    if isinstance(exc, errors.CkptError):
        return Failure(exc.exit_code, _one_line(exc.message), _one_line(exc.hint))
    for kind, code, hint in FAILURES:
        if isinstance(exc, kind):
            return Failure(code, _one_line(str(exc)) or kind.__name__, hint)
    return Failure(1, _one_line(f"{type(exc).__name__}: {exc}"), UNEXPECTED_HINT)


def report(exc: BaseException, *, debug: bool) -> int:
    """Print ``exc`` for a person on stderr (traceback first with ``debug``); return the exit code."""
    failure = classify(exc)
    if debug:
        typer.echo("".join(traceback.format_exception(exc)).rstrip(), err=True)
    typer.echo(f"{typer.style('error:', fg='red', bold=True)} {failure.message}", err=True)
    if failure.hint:
        typer.echo(f"{typer.style('hint:', fg='yellow', bold=True)} {failure.hint}", err=True)
    return failure.exit_code


def _one_line(text: str) -> str:
    return " ".join(text.split())
