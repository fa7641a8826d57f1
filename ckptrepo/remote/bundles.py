"""Bundles: what a push stored, described in one object, so that a clone or fetch reads a few
objects per push instead of one manifest and one pack footer per commit (restic's index files).

``bundles/<ns since the epoch, 20 digits>-<16 hex>.json.zst``: one zstd frame of canonical JSON
``{"format": 1, "packs": [[pack id, size, index and trailer, base64]], "manifests": [[commit id,
key, manifest text]], "covers": [bundle keys], "checksum"}``. Nothing in a bundle is trusted for
being there: each pack's index must hash, with the header this version writes, to the pack's id
(``chunks.pack``), and each manifest goes through the manifest chain (``ledger.manifest``); an
item that fails is reported and read from the store the usual way instead. ``covers``: older
bundles whose items this one repeats (a push that finds many bundles on the remote folds them
into its own); a reader that read this one skips them. Bundles are never rewritten or deleted.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import blake3
import zstandard

from ckptrepo.errors import CkptError, IntegrityError
from ckptrepo.ledger import fields as f
from ckptrepo.ledger import manifest
from ckptrepo.locations import ChunkLocation
from ckptrepo.storage.base import Backend

PREFIX = "bundles/"
FORMAT = 1
FOLD_AT = 32  # bundles a push leaves uncovered before it folds them into its own
_KEY = re.compile(r"bundles/\d{20}-[0-9a-f]{16}\.json\.zst")
MAX_BYTES = 1 << 30


@dataclass
class Bundle:
    """A bundle as read: its packs' index entries by pack id (with sizes), its manifests (checked)
    by commit id, the bundles it covers, and what in it failed its checks."""

    packs: dict[str, tuple[int, list[ChunkLocation]]] = field(default_factory=dict)
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    raw_manifests: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (key, text), to fold
    tails: dict[str, tuple[int, str]] = field(default_factory=dict)  # pack id -> (size, base64), to fold
    covers: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def is_key(key: str) -> bool:
    return _KEY.fullmatch(key) is not None


def tail_of(pack_id: str, size: int, entries: Sequence[ChunkLocation]) -> bytes | None:
    """The index and trailer of pack ``pack_id`` rebuilt from its ``entries`` (its chunk rows), or
    None when they do not make that pack (rows of chunks gc dropped, or another layout)."""
    from ckptrepo.chunks.pack import ENTRY, TRAILER, pack_tail

    ordered = sorted(entries, key=lambda e: e.offset)
    length = len(ordered) * ENTRY.size + TRAILER.size
    tail, pid = pack_tail(list(ordered), size - length)
    return tail if pid == pack_id else None


def write(backend: Backend, packs: Iterable[tuple[str, int, bytes]], manifests: Iterable[tuple[str, str, bytes]],
          *, fold: Sequence[Bundle] = (), covers: Sequence[str] = ()) -> tuple[str, int]:
    """Store a bundle of ``packs`` (id, size, index and trailer) and ``manifests`` (commit id, key,
    bytes), with the items of the bundles ``fold`` (whose keys are ``covers``); returns its key and
    size."""
    pack_rows: dict[str, list[Any]] = {}
    manifest_rows: dict[str, list[Any]] = {}
    for b in fold:
        pack_rows.update({pid: [pid, size, text] for pid, (size, text) in b.tails.items()})
        manifest_rows.update({cid: [cid, key, text] for cid, (key, text) in b.raw_manifests.items()})
    pack_rows.update({pid: [pid, size, base64.b64encode(tail).decode()] for pid, size, tail in packs})
    manifest_rows.update({cid: [cid, key, data.decode()] for cid, key, data in manifests})
    body: dict[str, Any] = {"format": FORMAT, "packs": [pack_rows[k] for k in sorted(pack_rows)],
                            "manifests": [manifest_rows[k] for k in sorted(manifest_rows)],
                            "covers": sorted(set(covers) | {c for b in fold for c in b.covers})}
    body[f.CHECKSUM] = f.checksum(body)
    data = zstandard.ZstdCompressor(level=3).compress(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
    key = f"{PREFIX}{time.time_ns():020d}-{secrets.token_hex(8)}.json.zst"
    backend.put_bytes(key, data)
    return key, len(data)


def read(data: bytes, key: str) -> Bundle:
    """The bundle stored at ``key`` from its bytes: IntegrityError when it is not one (bad frame,
    JSON, checksum or fields); each item checked on its own (module docstring)."""
    from ckptrepo.chunks.pack import header, parse_index

    try:
        text = zstandard.ZstdDecompressor().decompressobj().decompress(data)
        if len(text) > MAX_BYTES:
            raise f.Invalid(f"it expands past {MAX_BYTES} bytes")
        body = f.need_dict(json.loads(text), "it")
        f.check_sum(body, required=True)
        if body.get("format") != FORMAT:
            raise f.Invalid(f"it is not of format {FORMAT}")
        packs = f.need_list(f.need(body, "packs"), "its packs")
        manifests = f.need_list(f.need(body, "manifests"), "its manifests")
        covers = [c for c in f.need_list(f.need(body, "covers"), "its covers") if isinstance(c, str) and is_key(c)]
    except (ValueError, zstandard.ZstdError, f.Invalid) as exc:
        raise IntegrityError(f"bundle {key} is damaged: {exc}") from exc
    found = Bundle(covers=covers)
    for item in packs:
        try:
            pid, size, text64 = item
            tail = base64.b64decode(text64, validate=True)
            entries = parse_index(tail, int(size), pack_id=str(pid))
            if blake3.blake3(header() + tail).hexdigest() != pid:
                raise IntegrityError(f"its index does not hash to pack {str(pid)[:10]}")
            found.packs[pid] = (int(size), entries)
            found.tails[pid] = (int(size), text64)
        except (ValueError, TypeError, CkptError) as exc:
            found.problems.append(f"bundle {key}: a pack's index is refused ({exc})")
    for item in manifests:
        try:
            cid, mkey, mtext = item
            if manifest.commit_of_key(mkey) != cid:
                raise IntegrityError(f"key {str(mkey)[:80]!r} is not commit {str(cid)[:10]}'s")
            found.manifests[cid] = manifest.read_bytes(str(mtext).encode(), cid, key=mkey)
            found.raw_manifests[cid] = (mkey, mtext)
        except (ValueError, TypeError, CkptError) as exc:
            found.problems.append(f"bundle {key}: a manifest is refused ({exc})")
    return found
