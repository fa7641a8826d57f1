"""From an exception to what the user sees: one ``error:`` line, one ``hint:`` line, an exit code.

Under ``--json`` the same failure is one line on stderr instead, a JSON object
``{"error": message, "hint": hint, "exit_code": code}`` (what stdout holds is left as it is:
the command's document when it printed one before failing, such as ``verify``'s report, else
nothing). The text lines show the names an error quotes with their control characters made
visible (``terminal.one_line``); the JSON object holds them exactly.

``ckptrepo.errors.CkptError`` subclasses carry their own ``exit_code`` and ``hint``;
``FAILURES`` covers the exceptions from outside the library that a command can meet (and a SQLite
database's damage, however it surfaced, is ``errors.DatabaseDamaged``).
Anything else is a bug or an unforeseen input: exit 1, traceback only with ``--debug``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from dataclasses import dataclass
from typing import Final

import typer

from ckptrepo import errors

EXIT_INTERRUPTED: Final = 130
EXIT_BROKEN_PIPE: Final = 141  # 128 + SIGPIPE, as a shell reports a reader that went away

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


def report(exc: BaseException, *, debug: bool, as_json: bool = False) -> int:
    """Print ``exc`` on stderr (traceback first with ``debug``): for a person, or with ``as_json``
    as one line of JSON (``emit``); return the exit code."""
    from . import terminal  # rich: imported on failure only, so that `ckpt --version` does not

    if isinstance(exc, BrokenPipeError):  # `ckpt log | head`: the reader has all it wanted
        _drop_stdout()
        return EXIT_BROKEN_PIPE
    failure = classify(exc)
    if debug:
        typer.echo(terminal.lines("".join(traceback.format_exception(exc)).rstrip()), err=True)
    if as_json:
        return emit(failure)
    typer.echo(f"{typer.style('error:', fg='red', bold=True)} {terminal.one_line(failure.message)}", err=True)
    if failure.hint:
        typer.echo(f"{typer.style('hint:', fg='yellow', bold=True)} {terminal.one_line(failure.hint)}", err=True)
    return failure.exit_code


def _drop_stdout() -> None:
    """Point stdout at the null device, so that flushing it at exit raises no second BrokenPipeError."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no file descriptor behind stdout (a test's capture)
        pass


def usage(exc: typer.TyperException) -> Failure:
    """One of Typer's own usage errors (an unknown option, a malformed value) as a Failure."""
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "ckpt"
    return Failure(getattr(exc, "exit_code", 2), _one_line(exc.format_message()), f"See `{command} --help`.")


def emit(failure: Failure) -> int:
    """Print ``failure`` on stderr as one line, ``{"error", "hint", "exit_code"}`` (``--json``);
    return its exit code."""
    document = {"error": failure.message, "hint": failure.hint, "exit_code": failure.exit_code}
    typer.echo(json.dumps(document), err=True)
    return failure.exit_code


def _one_line(text: str) -> str:
    return " ".join(text.split())
