"""Every process knob: a setting of one process (not of the repository), read from the
environment variable ``CKPT_<NAME>`` when set, else its default.

``KNOBS`` is the one table of them and the one place their defaults are written: ``get_int``,
``get_bool`` and ``get_str`` take a knob's name and fall back on the table's default, and
``docs/design.md`` shows the table (tests/unit/test_knobs.py keeps both so: every ``CKPT_``
name in the code is a knob, no call passes a default, the documented table is this one).
Repository settings, fixed at ``init`` and stored with the repository, are ``config.RepoConfig``.
Read knobs at the moment they are needed, so a test or a caller may set the variable before that.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple, TypeVar

from ckptrepo.errors import UsageError

PREFIX = "CKPT_"

_T = TypeVar("_T", int, str)


def _all_cores() -> int:
    return os.cpu_count() or 1


def _login_name() -> str:
    import getpass  # here, not at start: only a commit with CKPT_AUTHOR unset needs it

    return getpass.getuser()


class Knob(NamedTuple):  # not a dataclass, slower to define: `ckpt` imports this module at start
    """One knob: its name without the prefix, its default, what it does, and its default as the
    docs show it (``shown``; when empty, the default itself).

    The default is an int (a number, or a switch: 0 off, 1 on), a str, a function that computes
    it when the knob is read, or None for a variable read elsewhere (the C extension tests it
    for being set; ``ckpt``'s option parser reads ``CKPT_REPO``).
    """

    name: str
    default: int | str | Callable[[], int | str] | None
    doc: str
    shown: str = ""

    @property
    def variable(self) -> str:
        return PREFIX + self.name

    @property
    def shown_default(self) -> str:
        return self.shown or str(self.default)


KNOBS: dict[str, Knob] = {k.name: k for k in (
    Knob("WORKERS", _all_cores, "Threads that hash, encode and decode chunks.", "all cores"),
    Knob("MAX_INFLIGHT", 1, "Asynchronous commits staged but not yet durable; `commit()` waits beyond."),
    Knob("STAGING_BUDGET", 0, "Bytes of staging memory for those commits; `commit()` waits beyond.",
         "0 (unbounded)"),
    Knob("BACKGROUND_PRIORITY", "normal", "CPU priority of asynchronous commits' phase 2: `normal` or `idle`."),
    Knob("IDLE_REPACK", 1, "Encode what asynchronous commits stored raw, between commits, at idle priority."),
    Knob("IDLE_REPACK_SPARE", 50, "Percent of one core the machine must leave spare before that repack starts."),
    Knob("WRITE_AHEAD", 1, "Write an asynchronous commit's raw chunks while phase 2 still hashes them."),
    Knob("COPY_STATS", 1, "Take float chunks' statistics in the staging copy's pass over memory."),
    Knob("DEFER_LAYOUTS", 1, "SQLite: asynchronous commits record tensor-level rows later, in batches."),
    Knob("DELTA_CACHE", 0, "Bytes of recent chunks kept in memory as delta bases (0: read them back)."),
    Knob("FOLLOW_DELTAS", 0, "Commits of this process encode new chunks at once, as deltas against the parent "
         "commit's chunk itself where smaller, so followers of the branch (`Repo.follow`) read only the difference."),
    Knob("DIRECT_IO", 1, "Write packs and read imported files with O_DIRECT where the filesystem allows."),
    Knob("WRITE_BUFFER", 2 << 20, "Bytes per direct-I/O write request."),
    Knob("WRITES_IN_FLIGHT", 2, "Direct-I/O writes one file keeps in flight."),
    Knob("DB_BUSY_TIMEOUT", 60, "Seconds a SQLite writer waits for another process's write lock."),
    Knob("DIST_TIMEOUT", 300, "Seconds a rank of a distributed commit waits for the others before it fails."),
    # 6 h: far beyond any commit's phase 2 or repack batch, which release their lease when their
    # transaction ends; only a writer that died on another host leaves one this old.
    Knob("LEASE_TTL", 6 * 3600, "Seconds after which gc ignores (and deletes) a writer's lease it never released.",
         "21600 (6 h)"),
    Knob("NODE_STORE", "", "A folder on this node's own disk where this process writes packs (a node-local "
         "tier; ranks of one node share it); what it lacks is read from the repository's store and its remotes.",
         "unset"),
    Knob("REPLICATION_BACKLOG", 0, "Bytes of commits not yet on the replica remote beyond which a new commit is "
         "refused (ReplicationBacklog); 0: no limit.", "0 (no limit)"),
    Knob("VIEW_CACHE", 64 << 20,
         "Bytes of decoded chunks a view of a commit (fsspec, `ckpt mount`) keeps for its reads."),
    Knob("VIEW_READ_AHEAD", 8 << 20, "Bytes of a file a view of a commit decodes ahead of its last read (0: none)."),
    Knob("MAX_FILE_BYTES", 1 << 30, "Bytes of the largest file (config, tokenizer, model card ...) a commit "
         "may keep beside its tensors.", "1073741824 (1 GiB)"),
    Knob("AUTHOR", _login_name, "The author recorded on commits.", "the login name"),
    Knob("REPO", None, "`ckpt` only: the repository to use when `--repo` is not given.",
         "the nearest .ckpt/ at or above the working directory"),
    Knob("NO_AVX512", None, "Set: the statistics pass does not use AVX-512 (read by the C extension).", "unset"),
    Knob("NO_AVX2", None, "Set: the statistics pass uses neither AVX-512 nor AVX2 (read by the C extension).",
         "unset"),
    Knob("FAULTS", "", "Test only: fault points to arm in this process (`ckptrepo.faults`).", "unset"),
)}


def _variable(name: str) -> str | None:
    """The variable of knob ``name``, None when unset or empty; KeyError for a name that is no
    knob (a mistake in the calling code)."""
    if name not in KNOBS:
        raise KeyError(f"unknown knob {name!r}")
    return os.environ.get(PREFIX + name) or None


def _default(name: str, kind: type[_T]) -> _T:
    """The default of knob ``name``, computed if the table says how; TypeError when it is not of
    ``kind`` (a mistake in the calling code)."""
    default = KNOBS[name].default
    value = default() if callable(default) else default
    if not isinstance(value, kind):
        raise TypeError(f"knob {name} has no {kind.__name__} default")
    return value


def get_str(name: str) -> str:
    """Knob ``name`` as text; its default when the variable is unset or empty."""
    value = _variable(name)
    return _default(name, str) if value is None else value


def get_int(name: str) -> int:
    """Knob ``name`` as an integer; its default when unset or empty, UsageError for other text."""
    value = _variable(name)
    if value is None:
        return _default(name, int)
    try:
        return int(value)
    except ValueError as exc:
        raise UsageError(f"{PREFIX}{name}={value!r} is not an integer") from exc


def get_bool(name: str) -> bool:
    """Knob ``name`` as a switch: ``0`` is off, any other integer on (``get_int``)."""
    return get_int(name) != 0


def workers() -> int:
    """Worker threads for hashing, encoding and decoding (knob ``WORKERS``, at least 1)."""
    return max(1, get_int("WORKERS"))
