"""The coordinator's half of a distributed commit: the ranks' shares made into one commit's contents.

Each rank's ``Share`` holds the packs it made durable and what it ingested of each source
(``Ingested``): a whole tensor, or a piece of one (a shard, or a byte range of a replicated
tensor split across ranks). ``merge`` assembles every tensor's row from its pieces (checking
that they tile it exactly once: a partial checkpoint is refused, never recorded), and sums the
figures.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ckptrepo import dtypes
from ckptrepo.chunks.store import SealedPack
from ckptrepo.errors import FormatError
from ckptrepo.ids import tensor_id
from ckptrepo.ingest.pipeline import Ingested, IngestResult
from ckptrepo.ingest.stats import combine, merged
from ckptrepo.rows import TensorRow


@dataclass
class Share:
    """What one rank wrote for a distributed commit: its durable packs (with the standalone sizes
    of delta chunks), the chunks new to the store, one record per source, figures, and the
    non-tensor values it holds (DCP's BYTE_IO items, as the bytes DCP serialised)."""

    rank: int
    packs: list[SealedPack] = field(default_factory=list)
    alone_lengths: dict[str, int] = field(default_factory=dict)
    new_chunk_ids: set[str] = field(default_factory=set)
    records: list[Ingested] = field(default_factory=list)
    values: dict[str, bytes] = field(default_factory=dict)
    new_bytes: int = 0
    stored_bytes: int = 0
    deferred: bool = False

    @classmethod
    def of(cls, rank: int, result: IngestResult) -> Share:
        return cls(rank, result.packs, dict(result.alone_lengths), set(result.new_chunk_ids), result.tensors,
                   {}, result.new_bytes, result.stored_bytes, result.deferred)


def merge(shares: Sequence[Share], chunk_size: int) -> IngestResult:
    """One ingest result for the whole commit: a record per tensor (named as the ranks named its
    pieces), every rank's packs. FormatError when the pieces of a tensor disagree on its dtype
    or shape, overlap, or leave part of it uncovered."""
    pieces: dict[str, list[Ingested]] = defaultdict(list)
    out = IngestResult(tensors=[], packs=[])
    for share in shares:
        for record in share.records:
            pieces[record.name].append(record)
        out.packs.extend(share.packs)
        out.alone_lengths.update(share.alone_lengths)
        out.new_chunk_ids |= share.new_chunk_ids
        out.new_bytes += share.new_bytes
        out.stored_bytes += share.stored_bytes
        out.deferred = out.deferred or share.deferred
    for name, records in pieces.items():
        record = records[0] if len(records) == 1 and records[0].box is None else _assemble(name, records, chunk_size)
        out.tensors.append(record)
        out.logical_bytes += record.row.nbytes
        out.nonfinite += record.row.stats["nan_count"] + record.row.stats["inf_count"]
    return out


def _assemble(name: str, records: list[Ingested], chunk_size: int) -> Ingested:
    first = records[0].row
    if any(r.row.dtype != first.dtype or r.row.shape != first.shape or r.box is None for r in records):
        raise FormatError(detail=f"the ranks' pieces of tensor {name!r} disagree on its dtype or shape")
    shape = first.shape
    itemsize = dtypes.dtype(first.dtype).itemsize
    nbytes = math.prod(shape) * itemsize
    boxes: list[list[list[int]]] | None = None
    if all(r.start is not None for r in records):
        ordered = sorted(_distinct(records), key=lambda r: (r.start or 0, r.row.nbytes))
        at = 0
        for r in ordered:
            if r.start != at:
                raise FormatError(detail=f"tensor {name!r}: bytes {at}..{r.start} are "
                                         f"{'in two pieces' if (r.start or 0) < at else 'in no piece'}")
            at += r.row.nbytes
        if at != nbytes:
            raise FormatError(detail=f"tensor {name!r}: its pieces hold {at} of its {nbytes} bytes")
    elif all(r.start is None for r in records):
        ordered = sorted(_distinct(records), key=lambda r: tuple(r.box[0]) if r.box else ())
        boxes = [[list(r.box[0]), list(r.box[1])] for r in ordered if r.box is not None]
        _check_tiling(name, shape, boxes)
    else:
        raise FormatError(detail=f"tensor {name!r}: some shards are ranges of its bytes and some are not")
    chunk_ids = [x for r in ordered for x in r.row.chunk_ids]
    total = merged([r.moments for r in ordered])
    row = TensorRow(tensor_id=tensor_id(first.dtype, shape, chunk_size, chunk_ids, boxes), dtype=first.dtype,
                    shape=shape, nbytes=nbytes, chunk_size=chunk_size, chunk_ids=chunk_ids, boxes=boxes,
                    stats=combine([total], math.prod(shape)))
    return Ingested(name=name, row=row, moments=total)


def _distinct(records: list[Ingested]) -> list[Ingested]:
    """The records, each piece once (identical copies of one shard written by two ranks: same
    place, same chunks)."""
    seen: dict[Any, Ingested] = {}
    for r in records:
        seen.setdefault((r.start, r.box, tuple(r.row.chunk_ids)), r)
    return list(seen.values())


def _check_tiling(name: str, shape: list[int], boxes: list[list[list[int]]]) -> None:
    """Boxes inside the tensor, pairwise disjoint, together as many elements as the tensor."""
    for offsets, sizes in boxes:
        if any(o < 0 or z < 0 or o + z > d for o, z, d in zip(offsets, sizes, shape, strict=True)):
            raise FormatError(detail=f"tensor {name!r}: shard at {offsets} of {sizes} lies outside {shape}")
    for i, (oa, za) in enumerate(boxes):
        for ob, zb in boxes[i + 1:]:
            if all(max(a, b) < min(a + x, b + y) for a, x, b, y in zip(oa, za, ob, zb, strict=True)):
                raise FormatError(detail=f"tensor {name!r}: shards at {oa} and {ob} overlap")
    if sum(math.prod(z) for _, z in boxes) != math.prod(shape):
        raise FormatError(detail=f"tensor {name!r}: its shards do not cover it (a partial checkpoint)")
