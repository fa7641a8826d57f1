"""Commit manifests: everything the database knows of one commit, as one small store object.

A commit writes its manifest after its packs are durable and before the transaction that
makes it visible (write-ordering step 2, docs/design.md). With the packs (whose footers give
the chunk index) and the journal (``journal``), the manifests are enough to rebuild the
database (``maintenance.rebuild``).

Object ``manifests/<id[:2]>/<id>.json``: canonical JSON (sorted keys, no spaces, ASCII)::

    {"format": 2, "id": <commit id>,
     "commit": {message, created_at (ISO 8601, UTC), author, host, branch, step, epoch, config,
                code_version, skeleton, n_tensors, logical_bytes, new_bytes, stored_bytes,
                stall_s, wait_s, persist_s, nonfinite},
     "edges": [[parent id, kind, position, mapping | null], ...],
     "metrics": {name: value},
     "entries": {tensor name: tensor id},
     "tensors": {tensor id: [dtype, shape, nbytes, chunk_size, boxes | null,
                             {numel, mean, std, min, max, l2_norm, abs_max, nan_count, inf_count},
                             "<chunk ids, 64 hex characters each, concatenated>"]},
     "move": {"branch": <name>, "from": <head it expected> | null, "at": <seconds>},
     "checksum": <BLAKE3 of the canonical JSON of everything else>}

A tensor's record is its ``rows.TensorRow`` (the id its key), written by ``build`` and read back
by ``tensor_rows``, field by field.

``move`` is the commit's own branch move, the journal entry of that ref change: a rebuild
replays these moves by compare-and-swap (``from`` must be the branch's value then).

**The chain of checks** (``decode``): a manifest is used only when (1) it parses and its bytes
are the canonical form of what they parse to (so no byte of it can change without changing its
content), (2) every field has its type (ids are 64 hex characters, dtypes known, shapes and sizes
non-negative integers, ...), (3) its checksum matches (format 1, written before checksums, has
none), (4) its id is ``commit_id`` of its identity fields, which include ``entries`` (name ->
tensor id), (5) ``tensors`` holds exactly the tensors ``entries`` names and each one's id is
recomputed from its record (``ids.tensor_id`` of dtype, shape, chunk size, chunk ids and boxes),
and its byte count is its shape's. So a commit's id fixes its tensors' chunk ids, and each chunk
id the chunk's bytes (every decode is verified against it): a manifest cannot make a checkout
return other data than the commit held. Statistics, ingest figures and the move are covered by
the checksum. Anything that fails is an ``IntegrityError`` naming the manifest and the check.

Format 1 (before checksums) was one zstd frame of the same JSON without ``checksum``, stored as
``<id>.json.zst``: it is still read (checks 2, 4 and 5), and ``ckpt db manifests`` rewrites it.

A manifest whose transaction never committed (a crash in between, or a transaction rolled
back and its manifest not yet taken back) names a commit whose data is durable; a rebuild
shows it, on a ``conflicts/`` branch when its move does not apply.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import zstandard

from ckptrepo import dtypes
from ckptrepo.errors import CkptError, FormatError, IntegrityError
from ckptrepo.ids import ID_HEX_LEN, hash_json, is_hex, tensor_id
from ckptrepo.ledger import fields as f
from ckptrepo.rows import STAT_KEYS, TensorRow
from ckptrepo.storage.base import Backend

PREFIX = "manifests/"
FORMAT = 2
SUFFIX = ".json"
LEGACY_SUFFIX = ".json.zst"  # format 1: zstd, no checksum
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# The ``commits`` columns a manifest carries (the rest are derived from edges when recorded).
COMMIT_FIELDS = ("message", "created_at", "author", "host", "branch", "step", "epoch", "config", "code_version",
                 "skeleton", "n_tensors", "logical_bytes", "new_bytes", "stored_bytes", "stall_s", "wait_s",
                 "persist_s", "nonfinite")
EDGE_KINDS = ("parent", "merge", "transfer")
_LEVEL = 9
# A manifest holds metadata, never tensor bytes: one far beyond this is not one ckptrepo wrote.
MAX_BYTES = 1 << 30


def key_of(commit_id: str, *, legacy: bool = False) -> str:
    """The store key of commit ``commit_id``'s manifest (``legacy``: where format 1 kept it)."""
    return f"{PREFIX}{commit_id[:2]}/{commit_id}{LEGACY_SUFFIX if legacy else SUFFIX}"


def commit_of_key(key: str) -> str | None:
    """The commit id a manifest key (of either format) names, or None for another key."""
    name = key.rpartition("/")[2]
    for suffix, legacy in ((SUFFIX, False), (LEGACY_SUFFIX, True)):
        if name.endswith(suffix):
            cid = name[: -len(suffix)]
            return cid if len(cid) == ID_HEX_LEN and is_hex(cid) and key == key_of(cid, legacy=legacy) else None
    return None


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
          entries: Mapping[str, str], tensors: Iterable[TensorRow],
          *, branch: str, expected: str | None, at: float) -> dict[str, Any]:
    """The manifest of the commit whose ``commits`` row is ``row``, with its checksum. ``tensors``:
    the row of every tensor ``entries`` names; ``expected``: the head of ``branch`` the commit's
    move expects."""
    commit = {name: row[name] for name in COMMIT_FIELDS}
    created = commit["created_at"]
    commit["created_at"] = created.isoformat() if isinstance(created, datetime) else created
    body = {
        "format": FORMAT, "id": row["id"], "commit": commit,
        "edges": [list(e) for e in edges], "metrics": dict(metrics), "entries": dict(entries),
        "tensors": {t.tensor_id: [t.dtype, list(t.shape), t.nbytes, t.chunk_size, t.boxes,
                                  {k: t.stats[k] for k in STAT_KEYS}, "".join(t.chunk_ids)]
                    for t in tensors},
        "move": {"branch": branch, "from": expected, "at": at},
    }
    body[f.CHECKSUM] = f.checksum(body)
    return body


def encode(manifest: Mapping[str, Any]) -> bytes:
    """A manifest's stored bytes: canonical JSON (sorted keys, no spaces, ASCII; NaN allowed)."""
    return json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True).encode()


def _parse(data: bytes) -> tuple[Any, bool]:
    """The JSON value of a manifest's bytes and whether they are format 1's zstd frame."""
    if data[:4] == _ZSTD_MAGIC:
        reader = zstandard.ZstdDecompressor().decompressobj()
        text = reader.decompress(data)
        if len(text) > MAX_BYTES:
            raise ValueError(f"it expands past {MAX_BYTES} bytes")
        return json.loads(text), True
    if len(data) > MAX_BYTES:
        raise ValueError(f"it is larger than {MAX_BYTES} bytes")
    return json.loads(data), False


def decode(data: bytes, *, key: str = "") -> dict[str, Any]:
    """A manifest from its stored bytes, through every check of the chain (module docstring);
    IntegrityError naming ``key`` and the failed check otherwise."""
    try:
        value, zstd = _parse(data)
    except (ValueError, zstandard.ZstdError) as exc:
        raise IntegrityError(f"manifest {key} cannot be read: {exc}") from exc
    try:
        value = f.need_dict(value, "it")
        if value.get("format") != (1 if zstd else FORMAT):
            raise f.Invalid("it is neither format 1 (zstd, no checksum) nor format 2 (JSON with a checksum)")
        if not zstd:
            if encode(value) != data:
                raise f.Invalid("its bytes are not the canonical JSON of their content")
            f.check_sum(value, required=True)
        elif f.CHECKSUM in value:
            raise f.Invalid("a format-1 manifest has no checksum")
        _check_fields(value)
        c = value["commit"]
        expected = commit_id(entries=value["entries"], skeleton=c["skeleton"], edges=value["edges"],
                             message=c["message"], step=c["step"], epoch=c["epoch"], metrics=value["metrics"],
                             config=c["config"], created_at=c["created_at"], author=c["author"], host=c["host"])
        if expected != value["id"]:
            raise f.Invalid("it does not hash to its commit id")
        _check_tensors(value)
    except f.Invalid as exc:
        raise IntegrityError(f"manifest {key} is damaged: {exc}") from exc
    return value


def _check_fields(value: dict[str, Any]) -> None:
    """Every field of a manifest has its type (``fields.Invalid`` naming the first that does not)."""
    f.need_id(f.need(value, "id"), "its id")
    c = f.need_dict(f.need(value, "commit"), "its commit row")
    for name in ("message", "author", "host"):
        f.need_str(f.need(c, name), name)
    for name in ("branch", "code_version"):
        f.need_str(f.need(c, name), name, optional=True)
    created = f.need_str(f.need(c, "created_at"), "created_at")
    try:
        datetime.fromisoformat(str(created))
    except ValueError as exc:
        raise f.Invalid(f"created_at {created!r} is not an ISO 8601 time") from exc
    for name in ("step", "epoch"):
        f.need_int(f.need(c, name), name, optional=True)
    for name in ("n_tensors", "logical_bytes", "new_bytes", "stored_bytes", "nonfinite"):
        f.need_int(f.need(c, name), name, minimum=0)
    for name in ("stall_s", "wait_s", "persist_s"):
        f.need_number(f.need(c, name), name)
    f.need(c, "config")
    f.need(c, "skeleton")
    for i, edge in enumerate(f.need_list(f.need(value, "edges"), "its edges")):
        if not isinstance(edge, list) or len(edge) != 4:
            raise f.Invalid(f"edge {i} is not [parent, kind, position, mapping]")
        f.need_id(edge[0], f"edge {i}'s parent")
        if edge[1] not in EDGE_KINDS:
            raise f.Invalid(f"edge {i}'s kind is not one of {', '.join(EDGE_KINDS)}")
        f.need_int(edge[2], f"edge {i}'s position", minimum=0)
        if edge[3] is not None and not all(isinstance(v, str) for v in f.need_dict(edge[3], "a mapping").values()):
            raise f.Invalid(f"edge {i}'s mapping does not map names to names")
    for name, metric in f.need_dict(f.need(value, "metrics"), "its metrics").items():
        f.need_number(metric, f"metric {name!r}")
    entries = f.need_dict(f.need(value, "entries"), "its entries")
    for name, tid in entries.items():
        f.need_id(tid, f"entry {name!r}")
    if c["n_tensors"] != len(entries):
        raise f.Invalid(f"n_tensors is {c['n_tensors']}, it has {len(entries)} entries")
    for tid, record in f.need_dict(f.need(value, "tensors"), "its tensors").items():
        _check_record(tid, record)
    move = f.need_dict(f.need(value, "move"), "its move")
    f.need_str(f.need(move, "branch"), "the move's branch")
    f.need_id(f.need(move, "from"), "the move's expected head", optional=True)
    f.need_finite(f.need(move, "at"), "the move's time")


def _check_record(tid: str, record: Any) -> None:
    what = f"tensor {tid[:10]}"
    f.need_id(tid, f"a tensor id ({tid[:80]!r})")
    if not isinstance(record, list) or len(record) != 7:
        raise f.Invalid(f"{what} is not [dtype, shape, nbytes, chunk_size, boxes, stats, chunks]")
    dtype, shape, nbytes, chunk_size, boxes, stats, chunks = record
    if not isinstance(dtype, str):
        raise f.Invalid(f"{what}'s dtype is not a string")
    try:
        itemsize = dtypes.dtype(dtype).itemsize
    except FormatError as exc:
        raise f.Invalid(f"{what}'s dtype {dtype[:40]!r} is unknown") from exc
    numel = 1
    for d in f.need_list(shape, f"{what}'s shape"):
        numel *= f.need_int(d, f"{what}'s shape", minimum=0) or 0
    if f.need_int(nbytes, f"{what}'s nbytes", minimum=0) != numel * itemsize:
        raise f.Invalid(f"{what} records {nbytes} bytes, its dtype and shape make {numel * itemsize}")
    f.need_int(chunk_size, f"{what}'s chunk size", minimum=1)
    if boxes is not None:
        for box in f.need_list(boxes, f"{what}'s boxes"):
            for part in f.need_list(box, f"{what}'s boxes"):
                for d in f.need_list(part, f"{what}'s boxes"):
                    f.need_int(d, f"{what}'s boxes", minimum=0)
    stats = f.need_dict(stats, f"{what}'s statistics")
    if set(stats) != set(STAT_KEYS):
        raise f.Invalid(f"{what}'s statistics are not {', '.join(STAT_KEYS)}")
    for name in STAT_KEYS:
        f.need_number(stats[name], f"{what}'s {name}", optional=True)
    if not isinstance(chunks, str) or len(chunks) % ID_HEX_LEN or (chunks and not is_hex(chunks)):
        raise f.Invalid(f"{what}'s chunk ids are not a run of {ID_HEX_LEN}-hex-character ids")


def _check_tensors(value: dict[str, Any]) -> None:
    """``tensors`` holds exactly the tensors ``entries`` names, each one's id its record's."""
    named = set(value["entries"].values())
    have = set(value["tensors"])
    if named != have:
        odd = sorted(named ^ have)[0]
        raise f.Invalid(f"tensor {odd[:10]} is {'named but not recorded' if odd in named else 'recorded, not named'}")
    for tid, t in tensor_rows(value).items():
        if tensor_id(t.dtype, t.shape, t.chunk_size, t.chunk_ids, t.boxes) != tid:
            raise f.Invalid(f"tensor {tid[:10]}'s record (dtype, shape, chunk size, chunks, boxes) does not hash "
                            "to its id")


def tensor_rows(manifest: Mapping[str, Any]) -> dict[str, TensorRow]:
    """The row of every tensor a manifest records (``decode`` checked them), by id."""
    rows = {}
    for tid, record in manifest["tensors"].items():
        dtype, shape, nbytes, chunk_size, boxes, stats, _ = record
        rows[tid] = TensorRow(tensor_id=tid, dtype=dtype, shape=shape, nbytes=nbytes, chunk_size=chunk_size,
                              chunk_ids=chunk_ids(record), boxes=boxes, stats=stats)
    return rows


def chunk_ids(record: Sequence[Any]) -> list[str]:
    """The ordered chunk ids of a manifest's tensor record (its last field, their concatenation)."""
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
        for legacy in (False, True):
            with contextlib.suppress(CkptError, OSError):
                backend.delete(key_of(cid, legacy=legacy))


def stored(backend: Backend) -> Iterator[tuple[str, str]]:
    """``(commit id, key)`` of every manifest the store holds, in key order."""
    for key in backend.list(PREFIX):
        cid = commit_of_key(key)
        if cid is not None:
            yield cid, key


def stored_ids(backend: Backend) -> Iterator[str]:
    """The commit ids the store holds manifests of (once each), in key order."""
    seen = ""
    for cid, _ in stored(backend):
        if cid != seen:
            yield cid
        seen = cid


def stored_key(backend: Backend, cid: str) -> str:
    """The key commit ``cid``'s manifest is stored under (format 2's, else format 1's if that one
    exists: the key to read)."""
    key = key_of(cid)
    legacy = key_of(cid, legacy=True)
    return legacy if not backend.exists(key) and backend.exists(legacy) else key


def read(backend: Backend, cid: str) -> dict[str, Any]:
    """Commit ``cid``'s manifest, checked (``decode``); StorageError when it is not stored."""
    key = stored_key(backend, cid)
    if backend.size(key) > MAX_BYTES:
        raise IntegrityError(f"manifest {key} is damaged: it is larger than {MAX_BYTES} bytes")
    return read_bytes(backend.get(key), cid, key=key)


def read_bytes(data: bytes, cid: str, *, key: str = "") -> dict[str, Any]:
    """The manifest of commit ``cid`` from its stored bytes, checked (``decode``; IntegrityError
    when it is another commit's)."""
    value = decode(data, key=key)
    if value["id"] != cid:
        raise IntegrityError(f"manifest {key} is damaged: it holds commit {value['id']}")
    return value
