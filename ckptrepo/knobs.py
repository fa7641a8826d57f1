"""Every process knob: a setting of one process (not of the repository), read from the
environment variable ``CKPT_<NAME>`` when set, else its default.

``KNOBS`` is the one table of them; ``docs/design.md`` shows it (a test keeps the two equal).
Repository settings, fixed at ``init`` and stored with the repository, are ``config.RepoConfig``.
Read knobs with ``get_int`` / ``get_str`` at the moment they are needed, so a test or a caller
may set the variable before that.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ckptrepo.errors import UsageError

PREFIX = "CKPT_"


@dataclass(frozen=True)
class Knob:
    """One knob: its name without the prefix, its default as text, and what it does."""

    name: str
    default: str
    doc: str

    @property
    def variable(self) -> str:
        return PREFIX + self.name


KNOBS: dict[str, Knob] = {k.name: k for k in (
    Knob("WORKERS", "all cores", "Threads that hash, encode and decode chunks."),
    Knob("MAX_INFLIGHT", "1", "Asynchronous commits staged but not yet durable; `commit()` waits beyond."),
    Knob("STAGING_BUDGET", "0 (unbounded)", "Bytes of staging memory for those commits; `commit()` waits beyond."),
    Knob("BACKGROUND_PRIORITY", "normal", "CPU priority of asynchronous commits' phase 2: `normal` or `idle`."),
    Knob("IDLE_REPACK", "1", "Encode what asynchronous commits stored raw, between commits, at idle priority."),
    Knob("IDLE_REPACK_SPARE", "50", "Percent of one core the machine must leave spare before that repack starts."),
    Knob("WRITE_AHEAD", "1", "Write an asynchronous commit's raw chunks while phase 2 still hashes them."),
    Knob("COPY_STATS", "1", "Take float chunks' statistics in the staging copy's pass over memory."),
    Knob("DEFER_LAYOUTS", "1", "SQLite: asynchronous commits record tensor-level rows later, in batches."),
    Knob("DELTA_CACHE", "0", "Bytes of recent chunks kept in memory as delta bases (0: read them back)."),
    Knob("DIRECT_IO", "1", "Write packs and read imported files with O_DIRECT where the filesystem allows."),
    Knob("WRITE_BUFFER", "2097152", "Bytes per direct-I/O write request."),
    Knob("WRITES_IN_FLIGHT", "2", "Direct-I/O writes one file keeps in flight."),
    Knob("DB_BUSY_TIMEOUT", "60", "Seconds a SQLite writer waits for another process's write lock."),
    Knob("DIST_TIMEOUT", "300", "Seconds a rank of a distributed commit waits for the others before it fails."),
    Knob("LEASE_TTL", "21600", "Seconds after which gc ignores (and deletes) a writer's lease it never released."),
    Knob("AUTHOR", "the login name", "The author recorded on commits."),
    Knob("NO_AVX512", "unset", "Set: the statistics pass does not use AVX-512 (read by the C extension)."),
    Knob("NO_AVX2", "unset", "Set: the statistics pass uses neither AVX-512 nor AVX2 (read by the C extension)."),
    Knob("FAULTS", "unset", "Test only: fault points to arm in this process (`ckptrepo.faults`)."),
)}


def _raw(name: str) -> str | None:
    if name not in KNOBS:
        raise KeyError(f"unknown knob {name!r}")
    value = os.environ.get(PREFIX + name)
    return None if value is None or value == "" else value


def get_str(name: str, default: str) -> str:
    """Knob ``name`` as text, ``default`` when the variable is unset or empty."""
    value = _raw(name)
    return default if value is None else value


def get_int(name: str, default: int) -> int:
    """Knob ``name`` as an integer, ``default`` when unset; UsageError for other text."""
    value = _raw(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise UsageError(f"{PREFIX}{name}={value!r} is not an integer") from exc


def get_bool(name: str, default: bool) -> bool:
    """Knob ``name`` as a switch: ``0`` is off, any other integer on (``get_int``)."""
    return bool(get_int(name, int(default)))


def workers() -> int:
    """Worker threads for hashing, encoding and decoding (knob ``WORKERS``, default: all cores)."""
    return max(1, get_int("WORKERS", os.cpu_count() or 1))
