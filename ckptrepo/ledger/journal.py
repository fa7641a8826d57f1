"""The journal: one small store object per change of the repository's state that no commit
manifest records, written durably *before* the database transaction that makes the change.

Entries (JSON objects, ``op`` first):

- ``{"op": "ref", "kind": "branch"|"tag", "name", "to": id|None, "from": id|None}``: a ref set,
  moved by force or deleted (``to`` None) outside a commit. (A commit's own branch move is in
  its manifest: ``manifest``.)
- ``{"op": "prune", "commits": [ids]}``: commits whose data retention dropped.
- ``{"op": "retention", "rules": {...}|None}``: the stored retention setting.
- ``{"op": "annotate", "commit": id, "metrics": {name: number}, "note": str|None, "source":
  str|None}``: results attached to a commit after it was made (``db.notes``). The entry's
  key is the annotation's identity on every store: a push copies the object as it is, and a
  fetch adds the annotations of an entry whose key it has not seen.

Each entry is ``journal/<nanoseconds since the epoch, 20 digits>-<16 hex>.json``, so listing
the prefix gives them in the order they were written (on one host's clock); ``at`` holds the
same time in seconds, ``key`` the entry's own key (a renamed entry is refused) and ``checksum``
the BLAKE3 of the rest (``fields.checksum``; entries written before checksums have neither and
are read as they are). ``read`` checks every entry's shape, so a damaged or crafted one is
reported by key and never applied. A change whose transaction then fails is taken back
(``discard``); a crash in between leaves an entry for a change that may not have happened, which
a rebuild applies (the change was about to commit, and everything it names is durable). The
change's transaction records the key (``journal_keys``), so ``verify`` finds an entry that went
missing, and ``gc`` reclaims an entry no transaction recorded (once past its grace period and no
lease may own it: ``entry`` holds one). Entries are never rewritten.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ckptrepo.errors import CkptError, IntegrityError, storage_failure
from ckptrepo.ledger import fields as f
from ckptrepo.ledger import leases
from ckptrepo.storage.base import Backend

PREFIX = "journal/"
OPS = ("ref", "prune", "retention", "annotate")
REF_KINDS = ("branch", "tag")
_KEY = re.compile(r"journal/(\d{20})-[0-9a-f]{16}\.json")
MAX_NAME = 255  # a metric name (``metrics.name``)
MAX_NOTE = 64 << 10  # characters of an annotation's note or source
MAX_BYTES = 64 << 20  # an entry names refs and commit ids: one far larger is not one ckptrepo wrote


def time_of(key: str) -> int | None:
    """When the entry at ``key`` was written (ns since the epoch), or None for another key."""
    m = _KEY.fullmatch(key)
    return int(m.group(1)) if m else None


def append(backend: Backend, entry: dict[str, Any]) -> str:
    """Store ``entry`` durably as a new journal object; returns its key (for ``discard``, and for
    the change's transaction to record)."""
    now = time.time_ns()
    key = f"{PREFIX}{now:020d}-{secrets.token_hex(8)}.json"
    record = {**entry, "at": now / 1e9, "key": key}
    record[f.CHECKSUM] = f.checksum(record)
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
def entry(backend: Backend, change: dict[str, Any], *, purpose: str = "journal") -> Iterator[str]:
    """Journal ``change`` durably, then run the block that makes it (its transaction, which
    records the yielded key); the entry is taken back when the block raises. A lease
    (``leases``) is held from before the entry until the block ends: until its transaction
    records the key, the entry looks like a leftover that ``gc`` reclaims."""
    lease = leases.Lease(backend, purpose)
    lease.take()
    try:
        key = append(backend, change)
        try:
            yield key
        except BaseException:
            discard(backend, key)
            raise
    finally:
        lease.release()


def decode(data: bytes, key: str) -> dict[str, Any]:
    """The entry stored at ``key``, checked: JSON, its checksum and own key (when it has them),
    and the fields of its ``op``; IntegrityError naming the key otherwise."""
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise IntegrityError(f"journal entry {key} is not valid JSON: {exc}") from exc
    try:
        value = f.need_dict(value, "it")
        f.check_sum(value, required="key" in value)
        if "key" in value and value["key"] != key:
            raise f.Invalid(f"it was written as {str(value['key'])[:80]!r}")
        _check_fields(value)
    except f.Invalid as exc:
        raise IntegrityError(f"journal entry {key} is damaged: {exc}") from exc
    return value


def _check_fields(value: dict[str, Any]) -> None:
    op = f.need(value, "op")
    if op not in OPS:
        raise f.Invalid(f"its op is not one of {', '.join(OPS)}")
    f.need_finite(f.need(value, "at"), "its time")
    if op == "ref":
        if f.need(value, "kind") not in REF_KINDS:
            raise f.Invalid("its ref kind is not branch or tag")
        f.need_str(f.need(value, "name"), "its ref name")
        f.need_id(f.need(value, "to"), "its target", optional=True)
    elif op == "prune":
        for cid in f.need_list(f.need(value, "commits"), "its commits"):
            f.need_id(cid, "a pruned commit")
    elif op == "annotate":
        f.need_id(f.need(value, "commit"), "its commit")
        for name, number in f.need_dict(f.need(value, "metrics"), "its metrics").items():
            if not name or len(name) > MAX_NAME:
                raise f.Invalid("a metric name is empty or too long")
            f.need_finite(number, f"metric {name[:80]!r}")
        note, source = f.need_str(value.get("note"), "its note", optional=True), f.need_str(
            value.get("source"), "its source", optional=True)
        if (note is not None and len(note) > MAX_NOTE) or (source is not None and len(source) > MAX_NOTE):
            raise f.Invalid("its note or source is too long")
    elif value.get("rules") is not None:
        f.need_dict(value["rules"], "its rules")


@dataclass
class Journal:
    """What ``read`` found: the entries that pass their checks, oldest first, and the keys of
    those that do not, with why."""

    entries: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    damaged: list[tuple[str, str]] = field(default_factory=list)


def read(backend: Backend) -> Journal:
    """Every entry of the journal, checked (``decode``); damaged ones are reported, not raised."""
    found = Journal()
    for key in backend.list(PREFIX):
        if not key.endswith(".json"):
            continue
        try:
            if backend.size(key) > MAX_BYTES:
                raise IntegrityError(f"journal entry {key} is damaged: larger than {MAX_BYTES} bytes")
            found.entries.append((key, decode(backend.get(key), key)))
        except IntegrityError as exc:
            found.damaged.append((key, exc.message))
    return found


def entries(backend: Backend) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every entry as ``(key, entry)``, oldest first. IntegrityError for one that fails its checks."""
    for key in backend.list(PREFIX):
        if not key.endswith(".json"):
            continue
        yield key, decode(backend.get(key), key)
