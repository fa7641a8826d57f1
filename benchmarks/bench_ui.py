"""`ckpt ui` on large lineages: `/api/graph` answer time and the graph page's time to first render.

Lineages: the lineage benchmark's synthetic ones (``bench_lineage.build``: a ``main`` chain,
branches of 50..150 commits forking from random commits, one in ten ending in a merge, one in
fifty starting with a transfer; metrics and a step each), of ``--small`` (2,000) and
``--commits`` (10,000) commits, loaded into SQLite repositories. The app (``create_app``) is
served by uvicorn on loopback, as ``ckpt ui`` serves it.

1. ``GET /api/graph``: wall time of the whole request through HTTP, median of ``--repeat``
   (goal: <= 1 s at 2,000 commits); beside it ``Repo.log()`` of every commit, the same rows as
   the API reads for the terminal's ``ckpt log --all``.
2. Time to first render of ``/``: a fresh page in headless Chromium (Debian's, through
   Playwright), from navigation start to the page's JavaScript setting ``body[data-ready]``
   after drawing the graph (``performance.now()`` then), median of ``--repeat`` loads; with the
   size of the HTML and of ``/api/graph``'s JSON.

    python benchmarks/bench_ui.py [--commits 10000] [--small 2000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import goal_note, report
from bench_lineage import build, prepare

import ckptrepo


class Served:
    """``create_app(repo)`` served by uvicorn on a thread."""

    def __init__(self, repo: ckptrepo.Repo) -> None:
        import socket

        import uvicorn

        from ckptrepo.ui.app import create_app

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(create_app(repo), host="127.0.0.1", port=port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def fetch(url: str) -> tuple[float, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as resp:
        body = resp.read()
    return time.perf_counter() - started, len(body)


def api_times(served: Served, repo: ckptrepo.Repo, repeat: int) -> tuple[float, int, float]:
    fetch(served.url + "/api/graph")  # warm: imports, page cache
    times, size = [], 0
    for _ in range(repeat):
        t, size = fetch(served.url + "/api/graph")
        times.append(t)
    log_times = []
    for _ in range(repeat):
        started = time.perf_counter()
        repo.log()
        log_times.append(time.perf_counter() - started)
    return statistics.median(times), size, statistics.median(log_times)


def first_render(served: Served, repeat: int, chromium: str) -> tuple[float, int, int]:
    from playwright.sync_api import sync_playwright

    times = []
    html = 0
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        try:
            for _ in range(repeat + 1):
                context = browser.new_context(viewport={"width": 1400, "height": 900})
                page = context.new_page()
                resp = page.goto(served.url + "/")
                assert resp is not None and resp.ok
                html = len(resp.body())
                page.wait_for_selector('body[data-ready="1"]', timeout=120_000)
                times.append(page.evaluate("performance.now()") / 1000)
                items = page.locator("#commit-list li").count()
                context.close()
        finally:
            browser.close()
    return statistics.median(times[1:]), html, items


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", type=int, default=10_000)
    ap.add_argument("--small", type=int, default=2_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.commits, args.small, args.repeat = 2_000, 500, 2
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    base = Path(tempfile.mkdtemp(prefix="bench-ui-", dir=args.dir))
    rows: list[tuple[str, float, str]] = []
    extra: dict[str, Any] = {}
    try:
        for size in (args.small, args.commits):
            path = base / f"repo-{size}"
            prepare(f"SQLite, {size:,} commits", path, None, build(size, depth=min(size // 2, 10_000)))
            with ckptrepo.Repo.open(path) as repo:
                n = repo.stats().commits
                served = Served(repo)
                try:
                    api, payload, log = api_times(served, repo, args.repeat)
                    rows.append((f"/api/graph, {n:,} commits, s", api, f"{payload / 1e6:.1f} MB JSON"
                                 + (f"; {goal_note(api, 1.0)}" if size == args.small else "")))
                    rows.append((f"RATIO /api/graph / Repo.log(), {n:,} commits", api / log, f"log {log:.3f} s"))
                    if size == args.commits:
                        if chromium is None:
                            print("no chromium: the render is not measured")
                        else:
                            render, html, items = first_render(served, args.repeat, chromium)
                            assert items == n, f"{items} commits listed of {n}"
                            rows.append((f"graph page, first render, {n:,} commits, s", render,
                                         f"HTML {html / 1e3:.0f} kB; every short id in #commit-list"))
                            extra["render_s"] = render
                finally:
                    served.stop()
        report("ckpt ui", rows, extra)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
