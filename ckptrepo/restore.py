"""Reading tensors back: chunk locations -> decoded, verified bytes -> torch tensors.

Every tensor is allocated once at its final size and its chunks are decoded straight
into their slices by worker threads (``ChunkReader`` verifies each chunk's BLAKE3 on
the way). Callers get tensors that share no memory with any cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor, Future

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


def read_tensors(
    reader: ChunkReader,
    pool: Executor,
    items: Sequence[tuple[str, Tensor, list[Chunk]]],
    *,
    commit_id: str,
) -> dict[str, torch.Tensor]:
    """Materialise ``(name, tensor row, ordered chunk rows)`` items as tensors by name.

    Raises IntegrityError naming the commit and tensor when a chunk is missing, fails
    its hash check, or the chunks do not add up to the tensor's size.
    """
    buffers: dict[str, torch.Tensor] = {}
    jobs: list[tuple[str, Future[None]]] = []
    for name, row, chunks in items:
        if sum(c.raw_length for c in chunks) != row.nbytes or len(chunks) != row.n_chunks:
            raise IntegrityError(detail=f"tensor {name!r} of commit {commit_id[:10]} has missing chunks")
        buf = torch.empty(row.nbytes, dtype=torch.uint8)
        buffers[name] = buf
        view = buf.numpy().data if row.nbytes else memoryview(b"")
        offset = 0
        for chunk in chunks:
            out = view[offset : offset + chunk.raw_length]
            jobs.append((name, pool.submit(reader.read_into, location(chunk), out)))
            offset += chunk.raw_length
    for name, job in jobs:
        try:
            job.result()
        except IntegrityError as exc:
            raise IntegrityError(
                detail=f"tensor {name!r} of commit {commit_id[:10]}: {exc.fields.get('detail', exc.message)}"
            ) from exc
    return {
        name: st.tensor_from_bytes(buffers[name], row.dtype, list(row.shape)) for name, row, _ in items
    }
