"""``ckpt ui``: serve the read-only web UI (``ckptrepo.ui``) over the repository with uvicorn.

The UI's packages (the ``ui`` extra: starlette, uvicorn, jinja2) are imported only when the
command runs, so the CLI starts without them; missing, the command fails with the install
command (exit 2). The socket is bound here, before the server starts, so a port in use is one
clear error; ``--port 0`` takes any free port (the URL printed names it).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
import webbrowser
from typing import Any

import typer

from ckptrepo import errors

from . import render
from .options import UiHostOpt, UiOpenOpt, UiPortOpt
from .session import current

UI_PACKAGES = ("starlette", "uvicorn", "jinja2", "anyio")
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def ui(host: UiHostOpt = "127.0.0.1", port: UiPortOpt = 8765, open_browser: UiOpenOpt = False) -> None:
    """Browse the repository in a web browser: the lineage graph, commits, metrics, tensor history, diffs.

    Read-only (GET only) and local by default (127.0.0.1); stop it with Ctrl-C."""
    uvicorn, create_app = _ui_packages()
    with current().open() as repo:
        sock = _listen(host, port)
        bound = sock.getsockname()[1]
        loopback = _is_loopback(host)
        if not loopback:
            typer.echo(f"{typer.style('warning:', fg='yellow', bold=True)} listening on {host}:{bound}, reachable from "
                       "other machines: the UI is read-only but has no authentication, so anyone who can connect can "
                       "read this repository's lineage, metrics and tensor statistics.", err=True)
        allowed = [*LOOPBACK_NAMES, host] if loopback else None  # refuse DNS-rebinding Host names on loopback
        app = create_app(repo, allowed_hosts=allowed)
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=bound, log_level="warning"))
        url = _url(host, bound)
        render.out.print(f"ckpt ui: serving {repo.repo_dir.parent} at {url} (Ctrl-C to stop)", markup=False,
                         soft_wrap=True)
        if open_browser:
            threading.Thread(target=_open_when_up, args=(server, url), daemon=True, name="ckpt-ui-open").start()
        server.run(sockets=[sock])


def _ui_packages() -> tuple[Any, Any]:
    """``(uvicorn, ckptrepo.ui.create_app)``; UsageError with the install command when the ui
    extra is missing (an import error of anything else is left as it is)."""
    try:
        import uvicorn

        from ckptrepo.ui import create_app
    except ImportError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in UI_PACKAGES:
            raise
        raise errors.UsageError(f"`ckpt ui` needs {missing}, which is not installed",
                                hint="Install the UI's packages with `pip install 'ckptrepo[ui]'`.") from exc
    return uvicorn, create_app


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (IPv6 when the host is an IPv6 address); UsageError
    when it cannot be bound (in use, not an address of this machine)."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except BaseException:
            sock.close()
            raise
    except OSError as exc:
        raise errors.UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                                hint="Pick another --port (0: any free one) or --host.") from exc
    sock.set_inheritable(True)
    return sock


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url(host: str, port: int) -> str:
    """The URL to open: a wildcard address becomes loopback; IPv6 goes in brackets."""
    shown = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://[{shown}]:{port}/" if ":" in shown else f"http://{shown}:{port}/"


def _open_when_up(server: Any, url: str, timeout: float = 30.0) -> None:
    """Open ``url`` in the browser once ``server`` has started (or give up after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while not server.started:
        if server.should_exit or time.monotonic() > deadline:
            return
        time.sleep(0.05)
    webbrowser.open(url)
