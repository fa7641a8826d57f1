"""What a request brings: the app's repository, and query parameters, checked (a malformed
value is a ``UsageError``, HTTP 400, never a crash)."""

from __future__ import annotations

import re
from typing import Final

from starlette.requests import Request

from ckptrepo import Repo
from ckptrepo.errors import UsageError

# The largest integer a parameter may be: a count the queries take (``limit + offset`` and the
# like stay within the database's 64 bits), as ``Repo``'s own checks allow.
MAX_INTEGER: Final = 10**18
_MAX_DIGITS: Final = len(str(MAX_INTEGER))
_INTEGER: Final = re.compile(r"[+-]?[0-9]+")


def repo_of(request: Request) -> Repo:
    """The repository the app serves (``create_app``'s)."""
    repo = request.app.state.repo
    assert isinstance(repo, Repo)
    return repo


def text(request: Request, name: str) -> str | None:
    """The parameter's value (the first, when repeated), None when absent or blank."""
    value = request.query_params.get(name)
    return value if value is not None and value.strip() else None


def texts(request: Request, name: str) -> list[str]:
    """Every value of a repeatable parameter, blanks and repeats left out, in order."""
    return list(dict.fromkeys(v for v in request.query_params.getlist(name) if v.strip()))


def integer(request: Request, name: str, *, default: int | None, minimum: int,
            maximum: int = MAX_INTEGER) -> int | None:
    """An integer parameter within [``minimum``, ``maximum``]; ``default`` when absent or blank.

    Only ASCII digits after an optional sign count as an integer (no ``1_000``, no other
    scripts' digits, no ``1e3``), and at most ``MAX_INTEGER``: a huge one is a UsageError (400)
    naming the parameter, before ``int()`` or a query could meet it (``int()`` refuses over
    4300 digits; the database, over 64 bits)."""
    raw = text(request, name)
    if raw is None:
        return default
    digits = raw.strip()
    if not _INTEGER.fullmatch(digits):
        raise UsageError(f"{name} must be an integer, got {_quoted(raw)}", hint=f"Pass ?{name}=N with N a number.")
    significant = digits.lstrip("+-").lstrip("0")
    value = int(digits) if len(significant) <= _MAX_DIGITS else None
    if value is None or not minimum <= value <= maximum:
        shown = str(value) if value is not None else f"a number of {len(significant)} digits"
        raise UsageError(f"{name} must be from {minimum} to {maximum}, got {shown}",
                         hint=f"Pass ?{name}=N with {minimum} <= N <= {maximum}.")
    return value


def _quoted(raw: str) -> str:
    return repr(raw) if len(raw) <= 40 else repr(raw[:37]) + "..."


def required(request: Request, name: str, what: str) -> str:
    """A parameter that must be given (UsageError naming ``what`` otherwise)."""
    value = text(request, name)
    if value is None:
        raise UsageError(f"no {what} given", hint=f"Pass ?{name}=...")
    return value
