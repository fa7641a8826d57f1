"""Whether the machine has had spare CPU: the gate of the background repack between commits.

Idle-priority (``SCHED_IDLE``) threads only get CPU time nobody else wants, but on cores a
training job keeps busy, "unwanted" means the microsecond gaps of its OpenMP barriers and
Python glue: a repack that fills them delays the step that wakes up next (cache, memory
bandwidth, the interpreter lock) and, given way at the next ``commit()``, has often not
finished a batch (its work is lost). Measured on the 2-core benchmark machine (k=50, 3
rounds): training overhead 7.3% with the repack between commits against 2.8% without it,
with 0.08 of the 0.16 CPU-s per commit spent by repacks that recorded nothing.

``SpareCpuGate`` therefore lets the repack start only after a window in which the machine's
cores were idle for at least ``min_spare`` of a core on average (from ``/proc/stat``: idle
and iowait time over all time, times the number of CPUs). A GPU job, a data loader waiting
on I/O or a finished training loop leave that much; a CPU training job on every core does
not, and its deferred encoding then waits for ``repo.repack()`` / ``ckpt repack`` or a quiet
moment. Where ``/proc/stat`` cannot be read (other systems) the gate always opens, as before.

Once started, the repack's own threads take whatever idle time there is, so the gate's reading
no longer says whether anything else wants the CPU. ``BusyWatch`` does: it leaves the repack's
threads' own CPU time out and tells when the rest of the machine left less than ``min_spare``
of a core idle over its last window; the repack then gives way (and waits for the next window
with spare CPU). Measured on the 2-core benchmark machine (``benchmarks/bench_idle_repack.py``,
k=50, 30 rounds each): a repack that kept running beside a training loop that had resumed
made its blocks 12.4% [8.5, 16.1] slower while encoding 3.9 MiB per 5.8 s block; giving way,
1.8% [-1.4, 5.2].
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from ckptrepo import knobs

ENV = "IDLE_REPACK_SPARE"  # knob CKPT_IDLE_REPACK_SPARE: percent of one core


def read_cpu_times(path: Path = Path("/proc/stat")) -> tuple[int, int, int] | None:
    """``(idle, total, cpus)``: jiffies the machine's CPUs spent idle (idle + iowait), in all
    (guest time is already in user time), and how many CPUs there are; None if unreadable."""
    try:
        text = path.read_text()
    except OSError:
        return None
    lines = text.splitlines()
    if not lines or not lines[0].startswith("cpu "):
        return None
    try:
        fields = [int(x) for x in lines[0].split()[1:]]
    except ValueError:
        return None
    if len(fields) < 4:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])
    cpus = sum(1 for line in lines[1:] if line.startswith("cpu") and line[3:4].isdigit())
    return idle, total, max(1, cpus)


class SpareCpuGate:
    """Tells, window by window, whether the machine had ``min_spare`` idle cores on average.

    ``start()`` opens a window; ``passed()`` closes it, answers for it and opens the next.
    A window too short to measure (no clock tick elapsed) does not pass.
    """

    def __init__(self, min_spare: float | None = None, path: Path = Path("/proc/stat")) -> None:
        self.min_spare = min_spare if min_spare is not None else knobs.get_int(ENV) / 100.0
        self.path = path
        self._last: tuple[int, int, int] | None = None
        self.last_spare: float | None = None  # idle cores in the last window measured

    def start(self) -> None:
        """Open a window from now."""
        self._last = read_cpu_times(self.path)

    def passed(self) -> bool:
        """Whether the window since ``start()`` (or the last ``passed()``) had enough idle CPU."""
        if self.min_spare <= 0:
            return True
        now = read_cpu_times(self.path)
        before, self._last = self._last, now
        if now is None or before is None:
            return now is None  # unreadable here: no measurement, no gate
        d_idle, d_total = now[0] - before[0], now[1] - before[1]
        if d_total <= 0:
            return False
        self.last_spare = now[2] * d_idle / d_total
        return self.last_spare >= self.min_spare


def thread_cpu_ns(native_ids: Iterable[int]) -> int:
    """CPU nanoseconds of these threads of this process so far (threads gone count 0)."""
    total = 0
    for tid in native_ids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


def threads_named(*prefixes: str) -> list[int]:
    """Native ids of this process's Python threads whose names start with one of ``prefixes``."""
    return [t.native_id for t in threading.enumerate()
            if t.native_id is not None and t.name.startswith(prefixes)]


class BusyWatch:
    """Tells whether the machine, apart from some threads of this process (``own``: their
    native ids), left less than ``min_spare`` of a core idle over the last ``window`` seconds.

    ``busy()`` is cheap to call often (before every chunk): it measures only once a window has
    passed and otherwise repeats its last answer; once busy it stays busy. Where ``/proc/stat``
    cannot be read it never reports busy. ``ticks`` is the kernel's clock ticks per second.
    """

    def __init__(self, own: Callable[[], Iterable[int]], min_spare: float | None = None, window: float = 0.5,
                 path: Path = Path("/proc/stat"), clock: Callable[[], float] = time.monotonic,
                 thread_ns: Callable[[Iterable[int]], int] = thread_cpu_ns, ticks: int | None = None) -> None:
        self.own, self.window, self.path, self.clock, self.thread_ns = own, window, path, clock, thread_ns
        self.min_spare = min_spare if min_spare is not None else knobs.get_int(ENV) / 100.0
        self.ticks = ticks or _clock_ticks()
        self.last_spare: float | None = None  # idle cores left by the rest of the machine, last window
        self._busy = False
        self._mark = self._read()

    def _read(self) -> tuple[float, tuple[int, int, int] | None, int]:
        ids = list(self.own())
        return self.clock(), read_cpu_times(self.path), self.thread_ns(ids)

    def busy(self) -> bool:
        """Whether a window ended with the rest of the machine leaving less than ``min_spare`` idle cores."""
        if self._busy or self.min_spare <= 0 or self.clock() - self._mark[0] < self.window:
            return self._busy
        now = self._read()
        (t0, before, own0), (t1, after, own1) = self._mark, now
        self._mark = now
        if before is None or after is None or after[1] <= before[1]:
            return False
        elapsed = t1 - t0
        used = ((after[1] - before[1]) - (after[0] - before[0])) / self.ticks  # CPU-seconds, all threads
        others = max(0.0, used - (own1 - own0) / 1e9)
        self.last_spare = after[2] - others / elapsed
        self._busy = self.last_spare < self.min_spare
        return self._busy


def _clock_ticks() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not Linux
        return 100
