"""What reading a commit back needs from the catalog, read in one snapshot."""

from __future__ import annotations

from typing import Any

from ckptrepo.db import catalog
from ckptrepo.db.engine import Sessions
from ckptrepo.db.models import Commit
from ckptrepo.entries import is_file_entry
from ckptrepo.errors import CommitDamaged
from ckptrepo.ids import short
from ckptrepo.lineage import nearest, revparse
from ckptrepo.locations import ChunkLocation
from ckptrepo.rows import TensorRow


def layout_of(reading: Sessions, rev: str, names: list[str] | None = None, *,
              files: bool = False) -> tuple[str, Any, dict[str, tuple[TensorRow, list[ChunkLocation]]]]:
    """``(commit id, skeleton, {entry name: (tensor row, ordered chunk locations)})`` of the commit
    ``rev`` names, for all its entries or those ``names`` it has; its files' entries
    (``entries.is_file_entry``) only with ``files``, so that what reads tensors never meets a
    file (a checkout, load_tensor, the DCP reader, merges, exports). ``reading``: sessions whose
    snapshot holds no pending layout (``db.pending.reading``). UnknownRevision for a bad ``rev``;
    CommitPruned for a pruned commit (from the moment it is marked, before gc drops its data),
    CommitDamaged for a damaged one that is not: every read of a commit's state (checkout,
    export, load_tensor, DCP loads) comes here."""
    with reading() as s:
        cid = revparse.resolve(s, rev)
        row = s.get(Commit, cid)
        assert row is not None  # resolve found it in this snapshot
        if row.pruned:
            nearest.refuse(s, cid)
        if row.damage is not None:
            raise CommitDamaged(commit=short(cid), why=row.damage)
        if names is not None and not files:
            names = [n for n in names if not is_file_entry(n)]
        items = catalog.tensors_of(s, cid, names)
    if not files:
        items = {n: item for n, item in items.items() if not is_file_entry(n)}
    return cid, row.skeleton, items
