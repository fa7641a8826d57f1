"""What a store holds, read and checked, for a database rebuild (``maintenance.rebuild``).

Every object is checked as it is read and nothing that fails is used: a pack whose footer does
not read back (``chunks.pack.read_index``: header, trailer, index hash, its name) contributes no
chunk; a manifest that fails the chain of checks (``ledger.manifest``), or whose branch name is
not one a user could give (``db.refs.check_ref_name``), contributes no commit; a journal entry
that fails its checks (``ledger.journal``) or names an invalid ref is not applied. Each is
reported by name (``Scan.skipped``), and the commits whose manifest was lost or refused are
listed (``Scan.lost``) so that the rebuild keeps them as damaged lineage nodes.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ckptrepo.chunks.pack import read_index
from ckptrepo.db import refs
from ckptrepo.errors import CkptError, InvalidRefName
from ckptrepo.ids import short
from ckptrepo.ledger import journal, manifest
from ckptrepo.locations import ChunkLocation
from ckptrepo.storage.base import Backend

_PACK_KEY = re.compile(r"packs/([0-9a-f]{2})/([0-9a-f]{64})\.pack")
_RAW = 0  # codecs.Encoding.RAW
_READERS = 8  # store reads in flight (an object store's latency, not the CPU, bounds them)


@dataclass
class Scan:
    """What the store holds. ``packs``: ``(id, size, chunk count, deferred, stored at)``;
    ``chunks``: each chunk id at its shallowest stored encoding; ``manifests``: the commits'
    checked manifests by id; ``lost``: commits whose manifest is stored but refused, by id, with
    why; ``journal``: the entries that pass their checks, oldest first, as ``(key, entry)``;
    ``skipped``: everything not used, each with why; ``remote_packs``: packs of the repository's
    remotes whose chunks the store lacks (``add_remote_packs``), with the remote's name."""

    packs: list[tuple[str, int, int, bool, datetime]] = field(default_factory=list)
    chunks: dict[str, ChunkLocation] = field(default_factory=dict)
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    manifest_bytes: int = 0
    lost: dict[str, str] = field(default_factory=dict)
    journal: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    remote_packs: list[tuple[str, int, int, bool, datetime, str]] = field(default_factory=list)


def scan(backend: Backend, *, compression: bool) -> Scan:
    """Read every pack footer, manifest and journal entry of ``backend``, checked (module docstring)."""
    found = Scan()
    pack_keys = [(m.group(2), key) for key in backend.list("packs/")
                 if (m := _PACK_KEY.fullmatch(key)) is not None and m.group(2).startswith(m.group(1))]

    def one_pack(item: tuple[str, str]) -> tuple[str, int, float, list[ChunkLocation]] | str:
        pid, key = item
        try:
            return pid, backend.size(key), backend.mtime(key), read_index(backend, key, pack_id=pid, named=True)
        except CkptError as exc:
            return f"pack {pid}: {exc}"

    def one_manifest(cid: str) -> tuple[dict[str, Any], int] | str:
        try:
            key = manifest.stored_key(backend, cid)
            if backend.size(key) > manifest.MAX_BYTES:
                return f"it is larger than {manifest.MAX_BYTES} bytes"
            data = backend.get(key)
            body = manifest.read_bytes(data, cid, key=key)
            refs.check_ref_name(body["move"]["branch"], "branch")
            if body["commit"]["branch"] is not None:
                refs.check_ref_name(body["commit"]["branch"], "branch")
            return body, len(data)
        except InvalidRefName as exc:
            return f"its branch name is refused: {exc}"
        except CkptError as exc:
            return str(exc)

    with ThreadPoolExecutor(_READERS, thread_name_prefix="ckpt-rebuild") as pool:
        for got in pool.map(one_pack, pack_keys):
            if isinstance(got, str):
                found.skipped.append(got)
                continue
            pid, size, mtime, entries = got
            deferred = compression and bool(entries) and all(e.encoding == _RAW for e in entries)
            found.packs.append((pid, size, len(entries), deferred, datetime.fromtimestamp(mtime, timezone.utc)))
            for loc in entries:
                have = found.chunks.get(loc.chunk_id)
                if have is None or loc.depth < have.depth:
                    found.chunks[loc.chunk_id] = loc
        ids = list(manifest.stored_ids(backend))
        for cid, got_m in zip(ids, pool.map(one_manifest, ids), strict=True):
            if isinstance(got_m, str):
                found.lost[cid] = f"its manifest is damaged ({got_m})"
                found.skipped.append(f"manifest of {short(cid)}: {got_m}")
                continue
            body, size = got_m
            found.manifests[cid] = body
            found.manifest_bytes += size
    read = journal.read(backend)
    for key, entry in read.entries:
        if entry["op"] == "ref":
            try:
                refs.check_ref_name(entry["name"], entry["kind"])
            except InvalidRefName as exc:
                found.skipped.append(f"journal entry {key}: {exc}")
                continue
        found.journal.append((key, entry))
    found.skipped.extend(f"journal entry {key}: {why}" for key, why in read.damaged)
    return found


def decodable(chunks: dict[str, ChunkLocation], skipped: list[str]) -> list[ChunkLocation]:
    """The chunks whose delta chain ends in a stored chunk (the others are reported)."""
    ok: dict[str, bool] = {}

    def check(cid: str) -> bool:
        chain: list[str] = []
        at: str | None = cid
        while at is not None and at not in ok:
            loc = chunks.get(at)
            if loc is None or at in chain:
                break
            chain.append(at)
            at = loc.base_id
        good = at is None or ok.get(at, False)
        for x in chain:
            ok[x] = good
        return ok.get(cid, False)

    out = [loc for cid, loc in chunks.items() if check(cid)]
    if len(out) < len(chunks):
        skipped.append(f"{len(chunks) - len(out)} chunk(s) whose delta base is stored nowhere")
    return out


def add_remote_packs(found: Scan, packs: list[tuple[str, str, int, list[ChunkLocation]]], problems: list[str]) -> None:
    """Add the chunks of remotes' packs (``(remote, pack id, size, index entries)``) that the store
    holds nowhere, and their packs, to ``found``; ``problems``: what could not be read there."""
    local = {p[0] for p in found.packs}
    now = datetime.now(timezone.utc)
    for remote, pid, size, entries in packs:
        if pid in local:
            continue
        added = False
        for loc in entries:
            if loc.chunk_id not in found.chunks:
                found.chunks[loc.chunk_id] = loc
                added = True
        if added:
            local.add(pid)
            found.remote_packs.append((pid, size, len(entries), False, now, remote))
    found.skipped.extend(problems)
