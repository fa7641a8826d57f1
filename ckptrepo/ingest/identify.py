"""The ids a commit would give tensors, computed by hashing alone: nothing is looked up or stored.

A tensor's id hashes its dtype, shape, the repository's chunk size and its chunks' ids
(``ids.tensor_id``), the chunks cut as a commit cuts a whole tensor (``chunker.spans_of``) and
each named by the BLAKE3 of its bytes. So equal ids here and in ``Repo.tensors`` mean equal dtype,
shape and bytes, without reading the stored copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor

from ckptrepo import dtypes
from ckptrepo.chunks.chunker import spans_of
from ckptrepo.ids import hash_bytes, tensor_id
from ckptrepo.ingest.sources import Source


def tensor_ids(sources: Sequence[Source], chunk_size: int, pool: Executor) -> dict[str, str]:
    """Entry name -> the id a commit with ``chunk_size`` would give each whole tensor of ``sources``
    (``box`` None); the chunks are hashed on ``pool``."""
    cuts = [spans_of(len(src.data), dtypes.dtype(src.dtype).itemsize, chunk_size) for src in sources]
    pieces = [src.data[offset:offset + length] for src, spans in zip(sources, cuts, strict=True)
              for offset, length in spans]
    chunk_ids = iter(list(pool.map(hash_bytes, pieces)))
    return {src.name: tensor_id(src.dtype, list(src.shape), chunk_size, [next(chunk_ids) for _ in spans])
            for src, spans in zip(sources, cuts, strict=True)}
