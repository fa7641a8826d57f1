"""A remote's own objects: the marker that makes a store a remote, and its refs.

- ``remote.json``: ``{"format": 1, "repo_id", "config": {...}, "checksum"}``, written by the first
  push to an empty store (after its identity, ``ledger.identity``). ``config`` holds the
  repository settings a clone takes (chunk size, packs, compression, deltas), so that commits
  made in a clone deduplicate against the remote's.
- ``refs/<kind>/<name, percent-quoted>.json``: ``{"kind", "name", "to": id|None, "at", "by",
  "checksum"}``, one object per branch or tag. It moves only by compare-and-swap
  (``Backend.put_if`` against the version read): of two pushes that read the same version, one
  lands and the other is refused. A deleted ref is a tombstone (``to`` None), so a delete is a
  compare-and-swap too.

Every object is checked as it is read (checksum, fields, a ref name a user could give);
IntegrityError names a damaged one.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from ckptrepo.config import RepoConfig
from ckptrepo.db.refs import check_ref_name
from ckptrepo.errors import IntegrityError, InvalidRefName
from ckptrepo.ledger import fields as f
from ckptrepo.storage.base import Backend

MARKER = "remote.json"
PREFIX = "refs/"
KINDS = ("branch", "tag")
FORMAT = 1
# The settings of the repository a clone takes from the remote (the rest are the clone's own).
SHARED_SETTINGS = ("chunk_size", "pack_target", "zstd_level", "compression", "delta", "max_delta_depth",
                   "delta_base", "encode")
_MAX_BYTES = 1 << 16


@dataclass(frozen=True)
class RemoteRef:
    """A ref object as read: ``target`` None is a deleted ref (a tombstone); ``version`` is the
    store's token for the compare-and-swap that replaces it."""

    kind: str
    name: str
    target: str | None
    version: str
    at: float


def key_of(kind: str, name: str) -> str:
    """The store key of ref ``name`` of ``kind``."""
    return f"{PREFIX}{kind}/{quote(name, safe='')}.json"


def _encode(value: dict[str, Any]) -> bytes:
    value[f.CHECKSUM] = f.checksum(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _decode(data: bytes, key: str) -> dict[str, Any]:
    try:
        if len(data) > _MAX_BYTES:
            raise f.Invalid(f"it is larger than {_MAX_BYTES} bytes")
        value = f.need_dict(json.loads(data), "it")
        f.check_sum(value, required=True)
        return value
    except (ValueError, f.Invalid) as exc:
        raise IntegrityError(f"remote object {key} is damaged: {exc}") from exc


def is_remote(backend: Backend) -> bool:
    """Whether the store is a remote made by ``push`` (it holds the marker)."""
    return backend.exists(MARKER)


def read_marker(backend: Backend) -> dict[str, Any] | None:
    """The marker's content, checked; None when the store is not a remote."""
    got = backend.read_versioned(MARKER)
    if got is None:
        return None
    value = _decode(got[0], MARKER)
    try:
        if value.get("format") != FORMAT:
            raise f.Invalid(f"it is not of format {FORMAT}")
        f.need_str(f.need(value, "repo_id"), "its repo_id")
        f.need_dict(f.need(value, "config"), "its config")
    except f.Invalid as exc:
        raise IntegrityError(f"remote object {MARKER} is damaged: {exc}") from exc
    return value


def write_marker(backend: Backend, repo_id: str, config: RepoConfig) -> None:
    """Make the store a remote of repository ``repo_id`` (once: an existing marker is kept)."""
    body = {"format": FORMAT, "repo_id": repo_id, "created_at": time.time(),
            "config": {name: getattr(config, name) for name in SHARED_SETTINGS}}
    backend.put_if(MARKER, _encode(body), expected=None)


def _ref_of(key: str, data: bytes, version: str) -> RemoteRef:
    value = _decode(data, key)
    try:
        kind = f.need(value, "kind")
        if kind not in KINDS:
            raise f.Invalid("its kind is not branch or tag")
        name = str(f.need_str(f.need(value, "name"), "its name"))
        check_ref_name(name, kind)
        if key != key_of(kind, name):
            raise f.Invalid(f"it names {kind} {name[:80]!r}, stored as another ref")
        target = f.need_id(f.need(value, "to"), "its target", optional=True)
        at = f.need_finite(f.need(value, "at"), "its time")
    except (f.Invalid, InvalidRefName) as exc:
        raise IntegrityError(f"remote ref {key} is damaged: {exc}") from exc
    return RemoteRef(kind=kind, name=name, target=target, version=version, at=at)


def read(backend: Backend, kind: str, name: str) -> RemoteRef | None:
    """Ref ``name`` of ``kind`` as stored (a tombstone included), or None when never written."""
    key = key_of(kind, name)
    got = backend.read_versioned(key)
    return None if got is None else _ref_of(key, *got)


def read_all(backend: Backend, damaged: dict[tuple[str, str], str] | None = None
             ) -> dict[tuple[str, str], RemoteRef]:
    """Every ref object of the remote (tombstones included) by ``(kind, name)``. IntegrityError
    for a damaged one; with ``damaged``, that one is left out and why is put there by ``(kind,
    name)``."""
    found: dict[tuple[str, str], RemoteRef] = {}
    for key in backend.list(PREFIX):
        kind, _, rest = key[len(PREFIX):].partition("/")
        if kind not in KINDS or not rest.endswith(".json"):
            continue
        name = unquote(rest[: -len(".json")])
        try:
            ref = read(backend, kind, name)
        except IntegrityError as exc:
            if damaged is None:
                raise
            damaged[(kind, name)] = exc.message
            continue
        if ref is not None:
            found[(kind, name)] = ref
    return found


def heads(found: dict[tuple[str, str], RemoteRef]) -> dict[tuple[str, str], str]:
    """The refs that point at a commit (tombstones left out)."""
    return {ref: r.target for ref, r in found.items() if r.target is not None}


def swap(backend: Backend, kind: str, name: str, target: str | None, expected: RemoteRef | None,
         *, wrote: Callable[[int], None] | None = None) -> bool:
    """Point ref ``name`` at ``target`` (None: delete it) if it is still as ``expected`` was read
    (None: never written); False when it moved meanwhile (nothing written). ``wrote`` is told
    the object's size when it is stored."""
    body = {"kind": kind, "name": name, "to": target, "at": time.time(),
            "by": f"{socket.gethostname()}:{os.getpid()}"}
    data = _encode(body)
    version = backend.put_if(key_of(kind, name), data, expected=None if expected is None else expected.version)
    if version is not None and wrote is not None:
        wrote(len(data))
    return version is not None
