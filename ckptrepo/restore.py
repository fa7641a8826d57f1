"""Reading tensors back: chunk locations -> decoded, verified bytes -> torch tensors.

Every tensor is allocated once at its final size and its chunks are decoded straight
into their slices by worker threads (``ChunkReader`` verifies each chunk's BLAKE3 on
the way). Callers get tensors that share no memory with any cache.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Executor

import torch

from ckptrepo import state as st
from ckptrepo.chunks.store import ChunkLocation, ChunkReader
from ckptrepo.db.models import Chunk, Tensor
from ckptrepo.errors import IntegrityError


def location(chunk: Chunk) -> ChunkLocation:
    """The chunk layer's view of a chunk-index row."""
    return ChunkLocation(
        chunk_id=chunk.id, pack_id=chunk.pack_id, offset=chunk.offset, length=chunk.length,
        raw_length=chunk.raw_length, encoding=chunk.encoding, depth=chunk.depth, base_id=chunk.base_id,
    )


def _workers(pool: Executor) -> int:
    return int(getattr(pool, "_max_workers", 2))


def _read_run(reader: ChunkReader, run: list[tuple[str, ChunkLocation, memoryview]], commit_id: str,
              bases: Mapping[str, ChunkLocation]) -> None:
    for name, loc, out in run:
        try:
            reader.read_into(loc, out, bases)
        except IntegrityError as exc:
            detail = exc.fields.get("detail", exc.message)
            raise IntegrityError(detail=f"tensor {name!r} of commit {commit_id[:10]}: {detail}") from exc


def read_tensors(
    reader: ChunkReader,
    pool: Executor,
    items: Sequence[tuple[str, Tensor, list[Chunk]]],
    *,
    commit_id: str,
) -> dict[str, torch.Tensor]:
    """Materialise ``(name, tensor row, ordered chunk rows)`` items as tensors by name.

    Raises IntegrityError naming the commit and tensor when a chunk is missing, fails
    its hash check (a delta chunk's too when its base is damaged), or the chunks do not
    add up to the tensor's size.
    """
    buffers: dict[str, torch.Tensor] = {}
    work: list[tuple[str, ChunkLocation, memoryview]] = []
    for name, row, chunks in items:
        if sum(c.raw_length for c in chunks) != row.nbytes or len(chunks) != row.n_chunks:
            raise IntegrityError(detail=f"tensor {name!r} of commit {commit_id[:10]} has missing chunks")
        buf = torch.empty(row.nbytes, dtype=torch.uint8)
        buffers[name] = buf
        view = buf.numpy().data if row.nbytes else memoryview(bytearray())
        offset = 0
        for chunk in chunks:
            work.append((name, location(chunk), view[offset : offset + chunk.raw_length]))
            offset += chunk.raw_length
    # A few jobs per worker, each a run of chunks: per-chunk futures would cost the GIL more
    # than the decoding they schedule.
    bases = reader.bases_for(loc for _, loc, _ in work)  # delta chains' bases, one query per chain level
    per_job = max(1, -(-len(work) // (4 * _workers(pool))))
    jobs = [pool.submit(_read_run, reader, work[i : i + per_job], commit_id, bases)
            for i in range(0, len(work), per_job)]
    for job in jobs:
        job.result()
    return {
        name: st.tensor_from_bytes(buffers[name], row.dtype, list(row.shape)) for name, row, _ in items
    }
