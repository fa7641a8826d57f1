"""CPU priority of the threads that run asynchronous commits' phase 2.

``normal`` (the default) runs phase 2 at the caller's priority, right after the copy: on a
2-core machine whose cores a CPU training job keeps busy, a 117 MiB commit's phase 2 is
then durable ~0.06 s after the copy, and costs the loop about its own CPU time (2.3% at
k=50 against 3.5% with ``idle``, the same 100 paired rounds of ``bench_training_paired.py``).

``idle`` puts those threads in Linux ``SCHED_IDLE``: they run only on CPU time nobody else
wants (a GPU-bound job's idle cores, the moments the trainer waits). On cores a training
job keeps busy that time hardly exists: phase 2 then runs in the next ``commit()``'s wait
for a free slot (``max_inflight``), so a commit becomes durable up to one commit interval
late (a crash in that interval loses it). Measured on that machine, this cost the loop
more than running phase 2 at once, not less: the wait at the next commit plus what the idle
threads still took from the steps.

A thread cannot leave ``SCHED_IDLE`` again without privileges, so only threads dedicated to
idle work are lowered; blocking commits and checkouts never run on them. The repack between
commits (``Repo(idle_repack=...)``) always runs on idle threads, whatever this setting.
"""

from __future__ import annotations

import contextlib
import os

from ckptrepo import knobs
from ckptrepo.errors import UsageError

PRIORITIES = ("normal", "idle")
ENV = "BACKGROUND_PRIORITY"  # knob CKPT_BACKGROUND_PRIORITY


def resolve(value: str | None) -> str:
    """``value``, else knob ``BACKGROUND_PRIORITY``; UsageError for anything but ``PRIORITIES``."""
    chosen = value if value is not None else knobs.get_str(ENV)
    if chosen not in PRIORITIES:
        raise UsageError(f"background priority {chosen!r} is unknown", hint=f"Use one of {', '.join(PRIORITIES)}.")
    return chosen


def supported() -> bool:
    """Whether this platform can lower a single thread (Linux ``SCHED_IDLE``)."""
    return hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE")


def lower_this_thread(priority: str) -> None:
    """Apply ``priority`` to the calling thread (a thread-pool initializer); ``normal`` or an
    unsupported platform leaves it as it is. Irreversible for this thread."""
    if priority != "idle" or not supported():
        return
    with contextlib.suppress(OSError):  # a sandbox may forbid it: commits still work, at normal priority
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
