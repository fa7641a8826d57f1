"""``create_app(repo)``: the Starlette application of ``ckpt ui``: routes, error handlers, headers.

Read-only by construction: every route is GET (HEAD), ``security.SecurityMiddleware`` refuses
other methods before routing and sets the Content-Security-Policy and the other headers on every
response; static files come from the package's own ``static/`` folder only (Starlette's
``StaticFiles`` resolves a path inside it or answers 404); revisions and tensor names from a
request reach nothing but ``Repo`` methods. The app holds the ``Repo`` it was given and no
other state: nothing is cached between requests.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from ckptrepo import Repo
from ckptrepo.errors import CkptError
from ckptrepo.ui import api, failures, pages
from ckptrepo.ui.security import SecurityMiddleware

STATIC = Path(__file__).resolve().parent / "static"


def create_app(repo: Repo, *, allowed_hosts: Collection[str] | None = None) -> Starlette:
    """The UI over ``repo`` (which the caller keeps open while the app serves, and closes).

    ``allowed_hosts``: host names the ``Host`` header may give (``ckpt ui`` passes the loopback
    names when bound to loopback); None accepts any. Requests run in Starlette's thread pool,
    each on ``Repo`` calls that open their own sessions (a ``Repo`` may be shared by threads).
    """
    app = Starlette(
        routes=[*pages.routes(), *api.routes(), Mount("/static", app=StaticFiles(directory=STATIC), name="static")],
        middleware=[Middleware(SecurityMiddleware, allowed_hosts=allowed_hosts)],
        exception_handlers={CkptError: failures.ckpt_error, HTTPException: failures.http_error,
                            Exception: failures.internal_error},
    )
    app.state.repo = repo
    return app
