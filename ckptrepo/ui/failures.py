"""From an exception to a response: the message and hint of a ``CkptError``, never a traceback.

Status by the error's CLI exit code (``errors``): 2 (bad input: a malformed revision, ``where``
expression or parameter) -> 400, 3 (not found: revision, tensor, ref) -> 404, 4 (conflict) ->
409, anything else -> 500. Under ``/api/`` the body is ``{"error": message, "hint": hint}``;
elsewhere an HTML page saying the same. An exception that is not a ``CkptError`` is a bug: 500,
"internal error", and the exception is left to the server's log.
"""

from __future__ import annotations

from typing import Final

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ckptrepo.errors import CkptError
from ckptrepo.ui import security, templating

STATUS_BY_EXIT_CODE: Final = {2: 400, 3: 404, 4: 409}
TITLES: Final = {400: "Bad request", 404: "Not found", 405: "Method not allowed", 409: "Conflict",
                 500: "Internal error"}


def is_api(request: Request) -> bool:
    return request.url.path.startswith("/api/")


def respond(request: Request, status: int, message: str, hint: str, headers: dict[str, str] | None = None) -> Response:
    """The error response for ``request``: JSON under ``/api/``, else the error page."""
    if is_api(request):
        return JSONResponse({"error": message, "hint": hint}, status_code=status, headers=headers)
    response = templating.render("error.html", {"page": "error", "status": status,
                                                "title": TITLES.get(status, "Error"), "message": message,
                                                "hint": hint}, status=status)
    if headers:
        response.headers.update(headers)
    return response


def ckpt_error(request: Request, exc: Exception) -> Response:
    """A ``CkptError`` a call raised: its message and hint, status by its exit code."""
    assert isinstance(exc, CkptError)
    return respond(request, STATUS_BY_EXIT_CODE.get(exc.exit_code, 500), exc.message, exc.hint)


def http_error(request: Request, exc: Exception) -> Response:
    """Routing's own errors (404 for an unknown path, 405 for a method a route does not take)."""
    assert isinstance(exc, HTTPException)
    status = exc.status_code
    message = {404: "no such page", 405: "method not allowed"}.get(status, str(exc.detail))
    hint = "The pages are / (the graph), /metrics, /commit/REV, /tensor/NAME and /diff/A/B." if status == 404 else ""
    return respond(request, status, message, hint, dict(exc.headers or {}))


def internal_error(request: Request, exc: Exception) -> Response:
    """Anything unforeseen: 500 without details (the server logs the exception), with the headers
    ``security`` sets, since this response is made outside its middleware."""
    response = respond(request, 500, "internal error", "This is a bug in ckptrepo's UI; the server's log has the "
                       "traceback.")
    return security.secure(response, path=request.url.path)
