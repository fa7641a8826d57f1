"""Commit manifests: everything the database knows of one commit, as one small store object.

A commit writes its manifest after its packs are durable and before the transaction that
makes it visible (write-ordering step 2, docs/design.md). With the packs (whose footers give
the chunk index) and the journal (``journal``), the manifests are enough to rebuild the
database (``maintenance.rebuild``).

Object ``manifests/<id[:2]>/<id>.json.zst``: one zstd frame of canonical JSON::

    {"format": 1, "id": <commit id>,
     "commit": {message, created_at (ISO 8601, UTC), author, host, branch, step, epoch, config,
                code_version, skeleton, n_tensors, logical_bytes, new_bytes, stored_bytes,
                stall_s, wait_s, persist_s, nonfinite},
     "edges": [[parent id, kind, position, mapping | null], ...],
     "metrics": {name: value},
     "entries": {tensor name: tensor id},
     "tensors": {tensor id: [dtype, shape, nbytes, chunk_size, boxes | null,
                             {numel, mean, std, min, max, l2_norm, abs_max, nan_count, inf_count},
                             "<chunk ids, 64 hex characters each, concatenated>"]},
     "move": {"branch": <name>, "from": <head it expected> | null, "at": <seconds>}}

``move`` is the commit's own branch move, the journal entry of that ref change: a rebuild
replays these moves by compare-and-swap (``from`` must be the branch's value then). The id is
``commit_id`` of the identity fields, so a rebuild checks every manifest against its name.
A manifest whose transaction never committed (a crash in between, or a transaction rolled
back and its manifest not yet taken back) names a commit whose data is durable; a rebuild
shows it, on a ``conflicts/`` branch when its move does not apply.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import zstandard

from ckptrepo.errors import CkptError, IntegrityError
from ckptrepo.ids import ID_HEX_LEN, hash_json, is_hex
from ckptrepo.storage.base import Backend

PREFIX = "manifests/"
FORMAT = 1
SUFFIX = ".json.zst"
# The ``commits`` columns a manifest carries (the rest are derived from edges when recorded).
COMMIT_FIELDS = ("message", "created_at", "author", "host", "branch", "step", "epoch", "config", "code_version",
                 "skeleton", "n_tensors", "logical_bytes", "new_bytes", "stored_bytes", "stall_s", "wait_s",
                 "persist_s", "nonfinite")
STAT_FIELDS = ("numel", "mean", "std", "min", "max", "l2_norm", "abs_max", "nan_count", "inf_count")
_LEVEL = 9


def key_of(commit_id: str) -> str:
    """The store key of commit ``commit_id``'s manifest."""
    return f"{PREFIX}{commit_id[:2]}/{commit_id}{SUFFIX}"


def commit_of_key(key: str) -> str | None:
    """The commit id a manifest key names, or None for another key."""
    name = key.rpartition("/")[2]
    if not name.endswith(SUFFIX):
        return None
    cid = name[: -len(SUFFIX)]
    return cid if len(cid) == ID_HEX_LEN and is_hex(cid) and key == key_of(cid) else None


def commit_id(*, entries: Mapping[str, str], skeleton: Any, edges: Sequence[Sequence[Any]], message: str,
              step: int | None, epoch: int | None, metrics: Mapping[str, float], config: Any, created_at: str,
              author: str, host: str) -> str:
    """A commit's id: the hash of its content (entries, skeleton, edges as ``[parent, kind,
    position, mapping]``) and metadata; ``created_at`` in ISO 8601."""
    identity = {
        "entries": sorted(entries.items()), "skeleton": skeleton, "edges": [list(e) for e in edges],
        "message": message, "step": step, "epoch": epoch, "metrics": sorted(metrics.items()),
        "config": config, "created_at": created_at, "author": author, "host": host,
    }
    return hash_json(identity)


def build(row: Mapping[str, Any], edges: Sequence[Sequence[Any]], metrics: Mapping[str, float],
          entries: Mapping[str, str], tensors: Sequence[tuple[str, str, Sequence[int], int, int, Any,
                                                             Mapping[str, Any], Sequence[str]]],
          *, branch: str, expected: str | None, at: float) -> dict[str, Any]:
    """The manifest of the commit whose ``commits`` row is ``row``. ``tensors``: ``(tensor id,
    dtype, shape, nbytes, chunk_size, boxes, stats, chunk ids)`` of every tensor ``entries``
    names; ``expected``: the head of ``branch`` the commit's move expects."""
    commit = {name: row[name] for name in COMMIT_FIELDS}
    created = commit["created_at"]
    commit["created_at"] = created.isoformat() if isinstance(created, datetime) else created
    return {
        "format": FORMAT, "id": row["id"], "commit": commit,
        "edges": [list(e) for e in edges], "metrics": dict(metrics), "entries": dict(entries),
        "tensors": {tid: [dtype, list(shape), nbytes, chunk_size, boxes, {k: stats[k] for k in STAT_FIELDS},
                          "".join(chunks)]
                    for tid, dtype, shape, nbytes, chunk_size, boxes, stats, chunks in tensors},
        "move": {"branch": branch, "from": expected, "at": at},
    }


def encode(manifest: Mapping[str, Any]) -> bytes:
    """A manifest's stored bytes (canonical JSON, one zstd frame)."""
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return zstandard.ZstdCompressor(level=_LEVEL).compress(text.encode())


def decode(data: bytes, *, key: str = "") -> dict[str, Any]:
    """A manifest from its stored bytes, checked: its format, its shape and its id against its
    content (IntegrityError otherwise)."""
    try:
        value = json.loads(zstandard.ZstdDecompressor().decompress(data))
    except (ValueError, zstandard.ZstdError) as exc:
        raise IntegrityError(f"manifest {key} cannot be read: {exc}") from exc
    if not isinstance(value, dict) or value.get("format") != FORMAT:
        raise IntegrityError(f"manifest {key} is not a format-{FORMAT} manifest")
    try:
        c = value["commit"]
        expected = commit_id(entries=value["entries"], skeleton=c["skeleton"], edges=value["edges"],
                             message=c["message"], step=c["step"], epoch=c["epoch"], metrics=value["metrics"],
                             config=c["config"], created_at=c["created_at"], author=c["author"], host=c["host"])
    except (KeyError, TypeError, AttributeError) as exc:
        raise IntegrityError(f"manifest {key} lacks a field: {exc}") from exc
    if expected != value.get("id"):
        raise IntegrityError(f"manifest {key} does not hash to its commit id")
    return value


def chunk_ids(record: Sequence[Any]) -> list[str]:
    """The ordered chunk ids of a manifest's tensor record."""
    joined = record[6]
    return [joined[i : i + ID_HEX_LEN] for i in range(0, len(joined), ID_HEX_LEN)]


def write(backend: Backend, manifest: Mapping[str, Any]) -> int:
    """Store ``manifest`` durably under its commit's key; returns its stored size."""
    data = encode(manifest)
    backend.put_bytes(key_of(manifest["id"]), data)
    return len(data)


def discard(backend: Backend, commit_ids: Sequence[str]) -> None:
    """Remove the manifests of commits that were not recorded, or are deleted (best effort: a
    leftover is reclaimed by ``gc``)."""
    for cid in commit_ids:
        with contextlib.suppress(CkptError, OSError):
            backend.delete(key_of(cid))


def stored_ids(backend: Backend) -> Iterator[str]:
    """The commit ids the store holds manifests of, in key order."""
    for key in backend.list(PREFIX):
        cid = commit_of_key(key)
        if cid is not None:
            yield cid


def read(backend: Backend, cid: str) -> dict[str, Any]:
    """Commit ``cid``'s manifest, checked (``decode``)."""
    key = key_of(cid)
    return read_bytes(backend.get(key), cid, key=key)


def read_bytes(data: bytes, cid: str, *, key: str = "") -> dict[str, Any]:
    """The manifest of commit ``cid`` from its stored bytes, checked (``decode``; IntegrityError
    when it is another commit's)."""
    value = decode(data, key=key)
    if value["id"] != cid:
        raise IntegrityError(f"manifest {key} holds commit {value['id']}")
    return value
