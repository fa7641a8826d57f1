"""Keeping what a lazy clone reads: chunks held only by the remote are copied into new local
packs and their rows repointed there (``Repo.fetch(data=...)``, and before a checkout).

Write ordering as for repack: a lease in the local store (``ledger.leases``), the new pack
durable, then one transaction inserts its row and repoints the chunk rows that still name the
remote pack; the lease goes once that transaction has ended. Payloads are copied as they are
(encoding and delta base unchanged), so nothing is re-encoded and every read is verified against
the chunk id as before. A chunk some other process localized meanwhile keeps its new row.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timezone
from typing import cast

from sqlalchemy import Table, bindparam, update
from sqlalchemy.orm import Session, sessionmaker

from ckptrepo.chunks.pack import pack_key
from ckptrepo.db import catalog
from ckptrepo.db.engine import Sessions, insert_tuples, write_transaction
from ckptrepo.db.models import Chunk, Pack
from ckptrepo.ledger.leases import Lease
from ckptrepo.locations import ChunkLocation
from ckptrepo.remote.tiered import TieredBackend
from ckptrepo.remote.transfer import Meter, closure, copy

_CHUNKS = cast(Table, Chunk.__table__)


def missing(backend: TieredBackend, locs: Collection[ChunkLocation]) -> list[ChunkLocation]:
    """The locations among ``locs`` whose pack the local store lacks."""
    local: dict[str, bool] = {}
    out = []
    for loc in locs:
        here = local.get(loc.pack_id)
        if here is None:
            here = local[loc.pack_id] = backend.is_local(pack_key(loc.pack_id))
        if not here:
            out.append(loc)
    return out


def localize(sessions: sessionmaker[Session], reading: Sessions, backend: TieredBackend, chunk_ids: Collection[str],
             pack_target: int, meter: Meter) -> int:
    """Copy the chunks of ``chunk_ids`` (and their delta bases) that only the remote holds into
    the local store; returns how many chunks were copied."""
    with reading() as s:
        found = closure(chunk_ids, lambda ids: catalog.chunks_by_id(s, sorted(ids)))
    todo = missing(backend, list(found.values()))
    if not todo:
        return 0
    lease = Lease(backend.local, "fetch")
    lease.take()
    try:
        packs = copy(backend, todo, backend.local, pack_target, meter)
        old = {loc.chunk_id: loc.pack_id for loc in todo}
        now = datetime.now(timezone.utc)
        with write_transaction(sessions) as s:
            insert_tuples(s.connection(), Pack, ("id", "size", "n_chunks", "deferred", "created_at"),
                          sorted((pid, size, len(entries), False, now) for pid, size, entries in packs), ignore=True)
            # A copy built from a whole remote pack is that pack, byte for byte: now held here.
            s.execute(update(Pack).where(Pack.id.in_([pid for pid, _, _ in packs])).values(remote=None))
            params = [{"b_id": loc.chunk_id, "b_old": old[loc.chunk_id], "b_pack": loc.pack_id,
                       "b_offset": loc.offset} for _, _, entries in packs for loc in entries]
            s.connection().execute(
                update(_CHUNKS).where(_CHUNKS.c.id == bindparam("b_id"), _CHUNKS.c.pack_id == bindparam("b_old"))
                .values(pack_id=bindparam("b_pack"), offset=bindparam("b_offset")), params)
    finally:
        lease.release()
    for pid, _, _ in packs:
        backend.is_local(pack_key(pid))
    return len(todo)
