"""What every response carries and what every request must be: an ASGI middleware.

Headers on every response (``HEADERS``): a Content-Security-Policy that allows scripts,
styles and images from the app itself only (no inline script or style, no plugin, no base
URL, no framing), ``nosniff``, no referrer; dynamic responses also ``Cache-Control:
no-store`` (the repository changes underneath). Requests: GET and HEAD only (anything else:
405 with ``Allow``), and with ``allowed_hosts`` a ``Host`` header among them (else 400), which
stops DNS-rebinding pages from reading a server bound to loopback.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

from starlette.datastructures import Headers
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSP: Final = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; object-src 'none'; "
              "base-uri 'none'; frame-ancestors 'none'")
HEADERS: Final = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}
METHODS: Final = ("GET", "HEAD")
STATIC_PREFIX: Final = "/static/"


def secure(response: Response, *, path: str = "") -> Response:
    """``response`` with ``HEADERS`` set (and ``no-store`` unless it is a static file): for
    responses made outside the middleware (the 500 handler runs outside it)."""
    for name, value in HEADERS.items():
        response.headers[name] = value
    if not path.startswith(STATIC_PREFIX):
        response.headers.setdefault("cache-control", "no-store")
    return response


def host_name(host: str) -> str:
    """A ``Host`` header's name without its port (``[::1]:8765`` -> ``::1``), lowercase."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class SecurityMiddleware:
    """Sets ``HEADERS`` on every response and refuses methods other than GET/HEAD (405) and,
    when ``allowed_hosts`` is given, requests for another host name (400)."""

    def __init__(self, app: ASGIApp, allowed_hosts: Collection[str] | None = None) -> None:
        self.app = app
        self.allowed_hosts = None if allowed_hosts is None else {host_name(h) for h in allowed_hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        refused = self._refusal(scope)
        if refused is not None:
            await secure(refused, path=path)(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = Headers(raw=message.get("headers", []))
                raw = [(k, v) for k, v in headers.raw if k.decode("latin-1").lower() not in HEADERS]
                raw += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in HEADERS.items()]
                if not path.startswith(STATIC_PREFIX) and "cache-control" not in headers:
                    raw.append((b"cache-control", b"no-store"))
                message = {**message, "headers": raw}
            await send(message)

        await self.app(scope, receive, with_headers)

    def _refusal(self, scope: Scope) -> Response | None:
        if scope["method"] not in METHODS:
            return _refuse(scope, 405, "method not allowed", "This app is read-only: GET and HEAD only.",
                           {"allow": ", ".join(METHODS)})
        if self.allowed_hosts is not None:
            host = Headers(scope=scope).get("host", "")
            if host_name(host) not in self.allowed_hosts:
                return _refuse(scope, 400, f"unexpected Host header {host!r}",
                               "Open the app at the address `ckpt ui` printed.", {})
        return None


def _refuse(scope: Scope, status: int, error: str, hint: str, headers: dict[str, str]) -> Response:
    """A refusal before routing: JSON under ``/api/``, plain text elsewhere."""
    if str(scope.get("path", "")).startswith("/api/"):
        return JSONResponse({"error": error, "hint": hint}, status_code=status, headers=headers)
    return PlainTextResponse(f"{error}\n{hint}\n", status_code=status, headers=headers)
