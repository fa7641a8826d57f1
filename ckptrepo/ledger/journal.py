"""The journal: one small store object per change of the repository's state that no commit
manifest records, written durably *before* the database transaction that makes the change.

Entries (JSON objects, ``op`` first):

- ``{"op": "ref", "kind": "branch"|"tag", "name", "to": id|None, "from": id|None}``: a ref set,
  moved by force or deleted (``to`` None) outside a commit. (A commit's own branch move is in
  its manifest: ``manifest``.)
- ``{"op": "prune", "commits": [ids]}``: commits whose data retention dropped.
- ``{"op": "retention", "rules": {...}|None}``: the stored retention setting.

Each entry is ``journal/<nanoseconds since the epoch, 20 digits>-<16 hex>.json``, so listing
the prefix gives them in the order they were written (on one host's clock); ``at`` holds the
same time in seconds. A change whose transaction then fails is taken back (``discard``); a crash
in between leaves an entry for a change that may not have happened, which a rebuild applies
(the change was about to commit, and everything it names is durable). Entries are never
rewritten.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

from ckptrepo.errors import CkptError, IntegrityError, storage_failure
from ckptrepo.storage.base import Backend

PREFIX = "journal/"


def append(backend: Backend, entry: dict[str, Any]) -> str:
    """Store ``entry`` durably as a new journal object; returns its key (for ``discard``)."""
    now = time.time_ns()
    key = f"{PREFIX}{now:020d}-{secrets.token_hex(8)}.json"
    record = {**entry, "at": now / 1e9}
    try:
        backend.put_bytes(key, json.dumps(record, sort_keys=True, separators=(",", ":")).encode())
    except OSError as exc:
        raise storage_failure(exc) from exc
    return key


def discard(backend: Backend, key: str | None) -> None:
    """Take back an entry whose change did not happen (best effort: a leftover is applied by a
    rebuild, as after a crash)."""
    if key is None:
        return
    with contextlib.suppress(CkptError, OSError):
        backend.delete(key)


@contextlib.contextmanager
def entry(backend: Backend, change: dict[str, Any]) -> Iterator[str]:
    """Journal ``change`` durably, then run the block that makes it (its transaction); the entry
    is taken back when the block raises."""
    key = append(backend, change)
    try:
        yield key
    except BaseException:
        discard(backend, key)
        raise


def entries(backend: Backend) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every entry as ``(key, entry)``, oldest first. IntegrityError for one that is not JSON."""
    for key in backend.list(PREFIX):
        if not key.endswith(".json"):
            continue
        try:
            value = json.loads(backend.get(key))
        except ValueError as exc:
            raise IntegrityError(f"journal entry {key} is not valid JSON: {exc}") from exc
        if not isinstance(value, dict) or "op" not in value:
            raise IntegrityError(f"journal entry {key} has no 'op'")
        yield key, value
