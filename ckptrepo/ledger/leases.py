"""Leases: a writer's notice, kept in the store, that it is putting objects no database row names yet.

Between write-ordering step 1 (packs durable) and step 3 (the transaction that names them) a
commit's packs, manifest and staging files look like garbage to ``gc``. A writer therefore takes
a lease first: one small object ``leases/<ns since the epoch, 20 digits>-<16 hex>.json`` holding
``{"host", "pid", "purpose", "at"}``, put durably *before* its first pack or staging file, and
deleted once the transaction that names its objects has committed or failed (``Lease``). The
store keeps the leases, not the database, so that a store several clones share carries the
same guarantee.

``gc`` lists its candidate objects, then reads the leases (``read``), then rechecks rows, stats
and deletes. An object listed was put before the listing; the lease of its writer was put before
the object, so before the read, and is found unless it was released, by which time a row names
the object or its transaction failed. A live lease protects every object whose store mtime is at
or after the lease object's own store mtime minus ``MARGIN_S`` (``Leases.protects``): the store's
clock against the store's clock, so a writer whose clock is off changes nothing. Staging files
are local files, so for them the earlier of that mtime and the writer's ``at`` counts
(``Leases.protects_local``).

A lease is stale, ignored and deleted by ``gc``, when its host is this host and its process is
not running, or when it is older than the ``LEASE_TTL`` knob (by ``gc``'s clock against the
lease's store mtime: hours, so minutes of skew do not matter). A lease that cannot be read as
one is live until it is that old. Leases of a killed process on another host thus hold ``gc``
back for at most the TTL; after it, the grace period alone protects their objects again.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from ckptrepo import knobs
from ckptrepo.errors import CkptError, storage_failure
from ckptrepo.storage.base import Backend

PREFIX = "leases/"
MARGIN_S = 5.0
"""Seconds before a lease's mtime from which it protects objects: mtime granularity (1 s on S3,
2 s on FAT) and a store whose clock steps back a little; it only ever keeps more."""
_KEY = re.compile(r"leases/(\d{20})-[0-9a-f]{16}\.json")
_MAX_BYTES = 4096

log = logging.getLogger("ckptrepo")
HOST = socket.gethostname()


def is_key(key: str) -> bool:
    """Whether ``key`` names a lease."""
    return _KEY.fullmatch(key) is not None


class Lease:
    """One writer's lease (see the module docstring): ``take`` puts it (once), ``release``
    deletes it. Thread-safe: the threads of one commit share it, and whichever is first to
    need it takes it. ``purpose`` says who holds it (``commit``, ``repack``, ``rank 3``)."""

    def __init__(self, backend: Backend, purpose: str) -> None:
        self._backend = backend
        self._purpose = purpose
        self._lock = threading.Lock()
        self._key: str | None = None

    @property
    def key(self) -> str | None:
        """The lease's store key while it is held, else None."""
        return self._key

    def take(self) -> str:
        """Put the lease durably if it is not held yet; returns its key. The caller puts no pack
        or staging file before this returned. StorageError (or StoreFull) when it cannot be put."""
        with self._lock:
            if self._key is None:
                self._key = take(self._backend, self._purpose)
            return self._key

    def release(self) -> None:
        """Delete the lease, once the transaction naming its objects committed or failed; safe
        to repeat. Best effort: a lease left behind only holds ``gc`` back until it is stale."""
        with self._lock:
            key, self._key = self._key, None
        if key is not None:
            release(self._backend, [key])


def take(backend: Backend, purpose: str) -> str:
    """Put a new lease for this process durably; returns its key (see ``Lease``)."""
    now = time.time_ns()
    key = f"{PREFIX}{now:020d}-{secrets.token_hex(8)}.json"
    body = {"host": HOST, "pid": os.getpid(), "purpose": purpose, "at": now / 1e9}
    try:
        # Durable before the writer's first object: gc must find it if it finds any of them.
        backend.put_bytes(key, json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
    except OSError as exc:
        raise storage_failure(exc) from exc
    return key


def release(backend: Backend, keys: Iterable[str]) -> None:
    """Delete the leases ``keys`` (keys that are not lease keys are ignored: they may come from
    another process, a rank's write result). Best effort, with a warning."""
    for key in keys:
        if not is_key(key):
            continue
        try:
            backend.delete(key)
        except (CkptError, OSError) as exc:
            log.warning("could not release lease %s (gc ignores it once stale): %s", key, exc)


@dataclass(frozen=True)
class Found:
    """A lease as ``read`` found it: ``mtime`` is the store's; ``host``/``pid`` are empty/-1 and
    ``at`` the mtime when the object is not a readable lease."""

    key: str
    host: str
    pid: int
    purpose: str
    at: float
    mtime: float


@dataclass(frozen=True)
class Leases:
    """What ``read`` found: the live leases, and the stale ones (for ``gc`` to delete)."""

    live: tuple[Found, ...] = ()
    stale: tuple[Found, ...] = ()

    def protects(self, mtime: float) -> bool:
        """Whether a store object with this store ``mtime`` may belong to a live lease's writer."""
        return bool(self.live) and mtime >= min(f.mtime for f in self.live) - MARGIN_S

    def protects_local(self, mtime: float) -> bool:
        """The same for a file in the store's local staging folder (``mtime`` by the local clock)."""
        return bool(self.live) and mtime >= min(min(f.mtime, f.at) for f in self.live) - MARGIN_S


def ttl_s() -> float:
    """Seconds after which a lease is stale whoever holds it (knob ``LEASE_TTL``)."""
    return float(knobs.get_int("LEASE_TTL"))


def read(backend: Backend, *, now: float | None = None) -> Leases:
    """Every lease in the store, sorted into live and stale (see the module docstring). A lease
    deleted while this reads is left out: its writer's transaction has ended."""
    now = time.time() if now is None else now
    ttl = ttl_s()
    live: list[Found] = []
    stale: list[Found] = []
    for key in backend.list(PREFIX):
        try:
            mtime = backend.mtime(key)
            data = backend.get(key) if backend.size(key) <= _MAX_BYTES else b""
        except CkptError:
            if backend.exists(key):
                raise
            continue  # released meanwhile
        found = _parse(key, data, mtime)
        if now - mtime > ttl or (found.host == HOST and found.pid > 0 and not _running(found.pid)):
            stale.append(found)
        else:
            live.append(found)
    return Leases(tuple(live), tuple(stale))


def _parse(key: str, data: bytes, mtime: float) -> Found:
    try:
        body = json.loads(data)
        host, pid, purpose, at = body["host"], body["pid"], body["purpose"], body["at"]
        if isinstance(host, str) and isinstance(pid, int) and isinstance(purpose, str) and \
                isinstance(at, int | float) and is_key(key):
            return Found(key, host, pid, purpose, float(at), mtime)
    except (ValueError, TypeError, KeyError):
        pass
    return Found(key, "", -1, "", mtime, mtime)  # not readable: live until the TTL


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (one of another user counts; a zombie, which has
    ended but was not reaped yet, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            state = fh.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True  # no /proc: only its existence is known
    return state not in ("Z", "X")
