"""Browser tests: the `ckpt ui` app served by uvicorn on loopback, driven by Playwright in the
system's headless Chromium (Debian's ``chromium``; ``./scripts/test`` installs it when missing
and it runs as root). No browser is downloaded: Playwright is pointed at that executable.

Without Chromium or Playwright the tests are skipped, except under CI (``CI`` set), where
that is a failure. Screenshots go to ``test-artifacts/screenshots/`` (or ``CKPT_SCREENSHOTS``).
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ckptrepo

SCREENSHOTS = Path(os.environ.get("CKPT_SCREENSHOTS", Path(__file__).parents[2] / "test-artifacts" / "screenshots"))


def _missing(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what}: browser tests cannot run (scripts/test installs Chromium as root)")
    pytest.skip(what)


@pytest.fixture(scope="session")
def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        _missing("no system Chromium (apt-get install -y chromium)")
    assert found is not None
    return found


@pytest.fixture(scope="session")
def browser(chromium_path: str) -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[test]')")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium_path, headless=True, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page; a JavaScript dialog (``alert``) or an uncaught page error fails the test."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    problems: list[str] = []
    pg.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    pg.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    pg.problems = problems
    try:
        yield pg
    finally:
        context.close()
    assert not problems, problems


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Served:
    """The UI of ``repo`` served by uvicorn on a thread, at ``url``."""

    def __init__(self, repo: ckptrepo.Repo) -> None:
        import uvicorn

        from ckptrepo.ui.app import create_app

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(create_app(repo), host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="ckpt-ui-test", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the UI server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def screenshot(page: Any, name: str) -> Path:
    """Save a full-page screenshot of ``page`` as ``SCREENSHOTS/name.png``."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 1000, path
    return path


@pytest.fixture(scope="session")
def ui() -> Any:
    """What the tests use of this module: ``ui.Served(repo)``, ``ui.screenshot(page, name)``."""
    import sys

    return sys.modules[__name__]
