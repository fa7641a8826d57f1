"""CPU priority of the threads that run asynchronous commits' phase 2.

On a machine whose cores the training job keeps busy, background hashing and encoding
takes its CPU time from training steps; with intra-op parallelism (OpenMP) a step then
waits for its slowest thread, so a commit's background work costs training up to a few
times its own CPU time. ``idle`` puts those threads in Linux ``SCHED_IDLE``: they run only
on CPU time nobody else wants (the gaps in a training step, a GPU-bound job's idle cores,
the moments the trainer waits), so overlapped steps keep their speed and phase 2 takes
longer to become durable. When phase 2 cannot finish within the commit interval, the next
``commit()`` waits for it as before (``max_inflight``), and the waiting trainer leaves the
cores to it. ``normal`` keeps the default priority.

A thread cannot leave ``SCHED_IDLE`` again without privileges, so only threads dedicated to
asynchronous commits are lowered; blocking commits and checkouts never run on them.
"""

from __future__ import annotations

import contextlib
import os

from ckptrepo.errors import UsageError

PRIORITIES = ("idle", "normal")
ENV = "CKPT_BACKGROUND_PRIORITY"
DEFAULT = "idle"


def resolve(value: str | None) -> str:
    """``value``, else ``CKPT_BACKGROUND_PRIORITY``, else ``idle``; UsageError for anything else."""
    chosen = value if value is not None else (os.environ.get(ENV) or DEFAULT)
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
