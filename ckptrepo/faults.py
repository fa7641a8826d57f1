"""Fault injection at named points of the write path, for crash and error tests.

Production code calls ``point("pack.before_put")`` at each step whose failure matters;
it costs one dict lookup when no fault is armed. Faults are armed either in-process
with ``inject`` (tests of error paths) or for a whole process through the environment
variable ``CKPT_FAULTS`` (crash tests that run a real child process), as a
comma-separated list of ``NAME=ACTION[@N]``: ACTION is ``kill`` (SIGKILL this process
on the spot), ``raise`` (raise ``InjectedFault``) or ``stop`` (SIGSTOP this process: it goes on
where it stopped on SIGCONT, so a test can run something else at exactly that moment, e.g. a
``gc`` between a commit's durable packs and its transaction); ``@N`` fires on the N-th time the
point is reached (default 1), counted per process.

Points: ``stage.copy`` (phase 1, per tensor), ``ingest.chunk`` (per chunk job),
``pack.write`` (per chunk appended to a pack file, per request of a write-ahead), ``pack.before_put`` /
``pack.after_put`` (around making a pack durable in the store), ``commit.after_manifest`` (its
manifest is durable, its transaction not begun), ``db.before_commit`` /
``db.after_commit`` (around the transaction that makes a commit visible); ``gc.before_commit``,
``gc.after_commit`` (``GC_POINTS``); ``prune.before_commit``, ``prune.after_commit`` (``PRUNE_POINTS``);
``db.index_pending`` (per layout indexed, ``db.pending``);
``repack.chunk``, ``repack.before_commit``, ``repack.after_commit`` (see ``REPACK_POINTS``);
``rebuild.after_commit`` (per commit recorded), ``rebuild.before_commit`` (``REBUILD_POINTS``);
``push.after_packs``, ``push.after_manifests``, ``push.after_refs``, ``fetch.before_commit``,
``fetch.after_commit`` (``REMOTE_POINTS``).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ckptrepo import knobs

ENV = "CKPT_FAULTS"
POINTS = (
    "stage.copy",
    "ingest.chunk",
    "pack.write",
    "pack.before_put",
    "pack.after_put",
    "commit.after_manifest",
    "db.before_commit",
    "db.after_commit",
)
"""The points a commit passes, in order."""
GC_POINTS = ("gc.before_commit", "gc.after_commit")
"""The points a gc passes (inside its transaction once it deleted the rows; after it commits)."""
PRUNE_POINTS = ("prune.before_commit", "prune.after_commit")
"""The points a prune passes (inside the transaction that marks commits, once marked; after it commits)."""
INDEX_POINTS = ("db.index_pending",)
"""The point indexing pending layouts passes (per layout, inside its batch's transaction)."""
REPACK_POINTS = ("repack.chunk", "repack.before_commit", "repack.after_commit")
"""The points a repack passes (per chunk; inside each batch's transaction, after it commits),
besides ``pack.write``, ``pack.before_put`` and ``pack.after_put`` of the packs it writes."""


REMOTE_POINTS = ("push.after_packs", "push.after_manifests", "push.after_refs", "fetch.before_commit",
                 "fetch.after_commit")
"""The points a push passes (its packs durable on the remote; its manifests too; its refs moved)
and a fetch (inside its transaction; after it commits)."""
REBUILD_POINTS = ("rebuild.after_commit", "rebuild.before_commit")
"""The points a database rebuild passes (per commit recorded; before its one transaction commits)."""


def known_points() -> tuple[str, ...]:
    """Every fault point production code has."""
    return POINTS + GC_POINTS + PRUNE_POINTS + INDEX_POINTS + REPACK_POINTS + REBUILD_POINTS + REMOTE_POINTS


ACTIONS = ("kill", "raise", "stop")


class InjectedFault(RuntimeError):
    """Raised at an armed fault point (tests only)."""


_lock = threading.Lock()
_armed: dict[str, tuple[str, int]] = {}
_hits: dict[str, int] = {}


def _parse(spec: str) -> dict[str, tuple[str, int]]:
    armed: dict[str, tuple[str, int]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, action = item.partition("=")
        action, _, nth = action.partition("@")
        if name not in known_points() or action not in ACTIONS:
            known = ", ".join(known_points())
            raise ValueError(f"{ENV}: bad fault {item!r}; points: {known}; actions: {', '.join(ACTIONS)}")
        armed[name] = (action, int(nth or 1))
    return armed


_armed.update(_parse(knobs.get_str("FAULTS")))


def point(name: str) -> None:
    """Fire the fault armed at ``name``, if any (see module docstring)."""
    if not _armed or name not in _armed:
        return
    with _lock:
        if name not in _armed:
            return
        _hits[name] = _hits.get(name, 0) + 1
        action, nth = _armed[name]
        if _hits[name] != nth:
            return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "stop":
        # To this thread: it takes the stop on leaving the call, before running on (a signal to
        # the process may be taken by another thread while this one runs into its next step).
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
        return
    raise InjectedFault(f"injected fault at {name}")


@contextmanager
def inject(name: str, action: str = "raise", nth: int = 1) -> Iterator[None]:
    """Arm ``name`` for the duration of the block (in this process)."""
    if name not in known_points():
        raise ValueError(f"unknown fault point {name!r}")
    with _lock:
        _armed[name] = (action, nth)
        _hits[name] = 0
    try:
        yield
    finally:
        with _lock:
            _armed.pop(name, None)
            _hits.pop(name, None)
