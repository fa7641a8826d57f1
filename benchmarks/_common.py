"""Shared helpers for the benchmark scripts: timing, fsync'd writes, result tables."""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


def timed_rounds(fns: dict[str, Callable[[], Any]], repeat: int) -> tuple[dict[str, float], dict[str, Any]]:
    """Median wall seconds of each of ``fns`` over ``repeat`` rounds, and each one's last result.

    Every round calls every function once, in an order rotated from round to round, so a
    drift of the shared machine (another process, the page cache, memory compaction)
    falls on all of them alike instead of on whichever ran during it.
    """
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    results: dict[str, Any] = {}
    for r in range(repeat):
        for name in names[r % len(names):] + names[: r % len(names)]:
            start = time.perf_counter()
            results[name] = fns[name]()
            times[name].append(time.perf_counter() - start)
            results[name] = results[name] if r == repeat - 1 else None
    return {name: statistics.median(t) for name, t in times.items()}, results


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


BOOTSTRAP = 2000  # resamples behind every 95% interval over rounds


def bootstrap(stat: Callable[[list[int]], float], n: int, rng: random.Random) -> tuple[float, float]:
    """95% interval of ``stat`` (a function of round indices) over ``n`` rounds resampled
    with replacement."""
    values = sorted(stat([rng.randrange(n) for _ in range(n)]) for _ in range(BOOTSTRAP))
    return values[int(0.025 * BOOTSTRAP)], values[int(0.975 * BOOTSTRAP) - 1]


def median(values: list[float]) -> float:
    """Median of the measurements (NaN when there are none)."""
    return statistics.median(values) if values else float("nan")


def goal_note(ratio: float, limit: float, *, at_most: bool = True) -> str:
    """``goal <= 1.3  met`` / ``... MISSED``: the goal next to a ratio, and whether it holds."""
    ok = ratio <= limit if at_most else ratio >= limit
    return f"goal {'<=' if at_most else '>='} {limit:g}  {'met' if ok else 'MISSED'}"


class ForeignLoad:
    """What other processes took of this machine while a block ran (Linux /proc).

    ``with ForeignLoad() as load: ...`` then ``load.share``: CPU they used, as a share of all
    cores (0.0 .. 1.0), and ``load.write_mib_s``: what they wrote to disk, MiB/s (disk-wide
    writes minus this process's own). NaN where /proc is missing. Timings are only as good
    as both are small.
    """

    def __init__(self) -> None:
        self.share = float("nan")
        self.write_mib_s = float("nan")

    @staticmethod
    def _sample() -> tuple[float, float, float, float] | None:
        try:
            fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
            own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
            disks = {p.name for p in Path("/sys/block").iterdir() if not p.name.startswith(("loop", "zram", "ram"))}
            sectors = sum(int(line.split()[9]) for line in Path("/proc/diskstats").read_text().splitlines()
                          if line.split()[2] in disks)
            io = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
        except (OSError, ValueError, IndexError):
            return None
        ticks = [int(x) for x in fields]
        busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
        own_written = int(io["write_bytes"]) - int(io["cancelled_write_bytes"])
        return float(busy), float(int(own[11]) + int(own[12])), 512.0 * sectors - own_written, time.monotonic()

    def __enter__(self) -> ForeignLoad:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ForeignLoad:
        self._start = self._sample()
        return self

    def stop(self) -> None:
        end = self._sample()
        if self._start is None or end is None:
            return
        wall = end[3] - self._start[3]
        if wall > 0:
            foreign = (end[0] - self._start[0]) - (end[1] - self._start[1])
            self.share = max(0.0, foreign / os.sysconf("SC_CLK_TCK") / (wall * (os.cpu_count() or 1)))
            self.write_mib_s = max(0.0, (end[2] - self._start[2]) / (1 << 20) / wall)

    def noisy(self, max_share: float, max_write_mib_s: float) -> bool:
        """True if others took more than ``max_share`` of the CPU or wrote faster than ``max_write_mib_s``."""
        return self.share > max_share or self.write_mib_s > max_write_mib_s


def wait_quiet(max_share: float, max_write_mib_s: float = 20.0, timeout: float = 30.0, probe: float = 0.5) -> float:
    """Wait (up to ``timeout`` s) until other processes leave the CPU and the disk alone over
    a ``probe``-second sample; returns the seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        with ForeignLoad() as load:
            time.sleep(probe)
        if not load.noisy(max_share, max_write_mib_s):
            break
    return time.monotonic() - start


def quiet_run(
    fn: Callable[[], Any], max_share: float, retries: int, max_write_mib_s: float = 20.0
) -> tuple[Any, ForeignLoad, int]:
    """Run ``fn`` once the machine is quiet; again (up to ``retries`` times) when other
    processes took more than ``max_share`` of the CPU or wrote more than ``max_write_mib_s``
    to disk meanwhile. Returns the last result, the load during it and the runs thrown away."""
    thrown = 0
    while True:
        wait_quiet(max_share, max_write_mib_s)
        with ForeignLoad() as load:
            result = fn()
        if not load.noisy(max_share, max_write_mib_s) or thrown >= retries:
            return result, load, thrown
        thrown += 1


@contextmanager
def scratch_dir(parent: Path | None) -> Iterator[Path]:
    """A fresh directory for one benchmark run (under ``parent``, else /work when it exists,
    so writes hit the same disk as the repository), removed afterwards."""
    default = Path("/work") if Path("/work").is_dir() else None
    base = Path(tempfile.mkdtemp(prefix="ckptbench-", dir=parent or default))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run_parts(title: str, parts: dict[str, str], doc: str | None) -> None:
    """The main of a benchmark made of parts (``--quick``, ``--only a,b``): each part's module
    (``parts[name]``, a script of this folder with ``run(quick) -> [(name, value, note)]``) runs in
    turn, its rows printed as they come, then all rows together (``report``) and the RATIO lines
    of those whose note starts with ``goal``."""
    import argparse
    import importlib
    import platform

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--only", default=",".join(parts), help="comma-separated parts: " + ", ".join(parts))
    args = parser.parse_args()
    chosen = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in parts]
    if unknown:
        parser.error(f"unknown parts {unknown}; known: {', '.join(parts)}")
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"# {title} on {cpu}, {time.strftime('%Y-%m-%d', time.gmtime())}")
    rows: list[tuple[str, float, str]] = []
    for part in chosen:
        started = time.perf_counter()
        got = importlib.import_module(parts[part]).run(args.quick)
        rows += got
        print(f"# {part}: {time.perf_counter() - started:.0f} s")
        for name, value, note in got:
            print(f"  {name}: {value:.3f}  {note}", flush=True)
    report(title, rows)
    for name, value, note in rows:
        if note.startswith("goal"):
            print(f"RATIO {name}: {value:.3f}  {note}")
