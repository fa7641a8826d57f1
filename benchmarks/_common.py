"""Shared helpers for the benchmark scripts: timing, fsync'd writes, result tables."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Median wall seconds of ``repeat`` calls, and the last call's result."""
    times = []
    result = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def fsync_path(path: Path) -> None:
    """fsync a file and its directory, as a durable save must."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def raw_write(path: Path, data: memoryview) -> None:
    """The machine's floor: write the bytes once, fsync."""
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def drop_caches() -> bool:
    """Ask the kernel to drop clean page cache (root only); True if it did."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def report(title: str, rows: list[tuple[str, float, str]], extra: dict[str, Any] | None = None) -> None:
    """Print a table (name, value, note) and one JSON line for tooling."""
    print(f"\n== {title}")
    width = max(len(r[0]) for r in rows)
    for name, value, note in rows:
        print(f"  {name:<{width}}  {value:10.3f}  {note}")
    print("JSON " + json.dumps({"title": title, "rows": {r[0]: r[1] for r in rows}, **(extra or {})}))


def fsync_dir(path: Path) -> None:
    """fsync a directory (its entries), as a durable save of new files in it must."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def median(values: list[float]) -> float:
    """Median of the measurements (NaN when there are none)."""
    return statistics.median(values) if values else float("nan")


def goal_note(ratio: float, limit: float, *, at_most: bool = True) -> str:
    """``goal <= 1.3  met`` / ``... MISSED``: the goal next to a ratio, and whether it holds."""
    ok = ratio <= limit if at_most else ratio >= limit
    return f"goal {'<=' if at_most else '>='} {limit:g}  {'met' if ok else 'MISSED'}"
