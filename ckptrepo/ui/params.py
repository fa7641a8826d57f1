"""What a request brings: the app's repository, and query parameters, checked (a malformed
value is a ``UsageError``, HTTP 400, never a crash)."""

from __future__ import annotations

from starlette.requests import Request

from ckptrepo import Repo
from ckptrepo.errors import UsageError


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
            maximum: int | None = None) -> int | None:
    """An integer parameter within [``minimum``, ``maximum``]; ``default`` when absent."""
    raw = text(request, name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise UsageError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise UsageError(f"{name} must be {bound}, got {value}")
    return value


def required(request: Request, name: str, what: str) -> str:
    """A parameter that must be given (UsageError naming ``what`` otherwise)."""
    value = text(request, name)
    if value is None:
        raise UsageError(f"no {what} given", hint=f"Pass ?{name}=...")
    return value
