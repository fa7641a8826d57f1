"""What a stored tensor is: the one value type ingest, the catalog, the manifests and restore share.

A ``TensorRow`` is a row of the catalog's ``tensors`` table with its ordered chunk ids, a tensor
record of a commit's manifest and what a read of the tensor starts from, at once. Ingest makes
one per tensor, the catalog inserts it (``db.catalog.record_layout``, or later from a pending
layout: ``db.pending``) and gives it back (``db.catalog.tensors_of``), a commit's manifest
writes it and a rebuild reads it back (``ledger.manifest``), restore reads the tensor it
describes (``chunks.tensors``). Each converts at its own edge, field by field: ORM and SQL rows
in ``db``, JSON in ``ledger.manifest`` and ``db.pending``; in between it is passed as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The keys of ``TensorRow.stats``: the statistics ingest takes of every tensor (``ingest.stats.combine``),
# the catalog's columns and a manifest record's statistics alike.
STAT_KEYS = ("numel", "mean", "std", "min", "max", "l2_norm", "abs_max", "nan_count", "inf_count")


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorRow:
    """One stored tensor. Its id (``ids.tensor_id``) hashes ``dtype``, ``shape``, ``chunk_size``,
    ``chunk_ids`` and ``boxes``, so equal ids mean equal rows (but for ``stats``: a later commit
    of the same bytes may have summed them in another order).

    ``nbytes``: the bytes its chunks hold together (its shape's elements times the dtype's size).
    ``chunk_ids``: its chunks in order, which hold its row-major bytes (``boxes`` None), or each
    box's own row-major bytes in turn (``boxes``: ``[[offsets, sizes], ...]``, the shards of a
    distributed commit that are not one range of those bytes each: ``models.Tensor.boxes``);
    empty for a tensor whose chunk list gc dropped (only pruned commits name it). ``stats``:
    ``STAT_KEYS`` (None where not meaningful). Lists and dicts are never changed once the row is
    made.
    """

    tensor_id: str
    dtype: str
    shape: list[int]
    nbytes: int
    chunk_size: int
    chunk_ids: list[str]
    boxes: list[list[list[int]]] | None = None
    stats: dict[str, Any]
