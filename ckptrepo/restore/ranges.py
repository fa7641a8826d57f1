"""Reading part of a tensor: only the chunks a region of it needs (resharding loads).

A region is a box of the tensor, ``offsets`` and ``lengths`` per dimension, as DCP's load plan
asks for one. For a tensor stored in its row-major order the region lies within the rows
``[offsets[0], offsets[0] + lengths[0])``, one range of bytes: the chunks overlapping it are
decoded (verified, on the worker pool) into one buffer, and the region is a view of it. A
tensor stored as boxes (``models.Tensor.boxes``) is read box by box, only the boxes the
region meets, each one range of the stream. A shard of an FSDP model on N ranks thus reads
about 1/N of each tensor's chunks, whatever world size wrote it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import Executor

import torch

from ckptrepo import state as st
from ckptrepo.chunks.store import ChunkReader
from ckptrepo.db.models import Tensor
from ckptrepo.errors import IntegrityError, UsageError
from ckptrepo.locations import ChunkLocation
from ckptrepo.restore.tensors import read_runs


def read_region(reader: ChunkReader, pool: Executor, row: Tensor, chunks: list[ChunkLocation],
                offsets: Sequence[int], lengths: Sequence[int], *, name: str, commit_id: str) -> torch.Tensor:
    """The region ``[offsets, offsets + lengths)`` of the tensor ``row`` (its ordered chunk
    locations ``chunks``), reading only the chunks it overlaps; every chunk read is verified.
    UsageError when the region is not inside the tensor."""
    shape = [int(d) for d in row.shape]
    if len(offsets) != len(shape) or len(lengths) != len(shape) or any(
            o < 0 or n < 0 or o + n > d for o, n, d in zip(offsets, lengths, shape, strict=True)):
        raise UsageError(f"region {list(offsets)}+{list(lengths)} is not inside tensor {name!r} of shape {shape}")
    dtype = st.dtype_from_name(row.dtype)
    if row.boxes is None:
        return _from_stream(reader, pool, row, chunks, shape, dtype, offsets, lengths, name, commit_id)
    out = torch.empty(list(lengths), dtype=dtype)
    itemsize = out.element_size()
    pos = 0
    for box_offsets, box_sizes in row.boxes:
        n = math.prod(box_sizes) * itemsize
        lo = [max(a, b) for a, b in zip(offsets, box_offsets, strict=True)]
        hi = [min(a + la, b + lb) for a, la, b, lb in zip(offsets, lengths, box_offsets, box_sizes, strict=True)]
        if all(x < y for x, y in zip(lo, hi, strict=True)) or (n == 0 and not shape):
            box = _from_stream(reader, pool, row, chunks, box_sizes, dtype, [0] * len(box_sizes), box_sizes,
                               name, commit_id, base=pos)
            src = tuple(slice(x - b, y - b) for x, y, b in zip(lo, hi, box_offsets, strict=True))
            dst = tuple(slice(x - o, y - o) for x, y, o in zip(lo, hi, offsets, strict=True))
            st.bit_view(out)[dst] = st.bit_view(box)[src]
        pos += n
    return out


def _from_stream(reader: ChunkReader, pool: Executor, row: Tensor, chunks: list[ChunkLocation], shape: list[int],
                 dtype: torch.dtype, offsets: Sequence[int], lengths: Sequence[int], name: str, commit_id: str,
                 base: int = 0) -> torch.Tensor:
    """The region of a row-major block of ``shape`` whose bytes start at byte ``base`` of the
    tensor's stored stream: the chunks holding its rows, decoded into one buffer."""
    itemsize = dtype.itemsize
    row_bytes = math.prod(shape[1:]) * itemsize if shape else itemsize
    first, last = (offsets[0], offsets[0] + lengths[0]) if shape else (0, 1)
    begin, end = base + first * row_bytes, base + last * row_bytes
    if end == begin:
        return torch.empty(list(lengths), dtype=dtype)
    starts, pos = [], 0
    for loc in chunks:
        starts.append(pos)
        pos += loc.raw_length
    if pos != row.nbytes:
        raise IntegrityError(detail=f"tensor {name!r} of commit {commit_id[:10]} has missing chunks")
    wanted = [i for i, (at, loc) in enumerate(zip(starts, chunks, strict=True))
              if at < end and at + loc.raw_length > begin]
    lo = starts[wanted[0]]
    buf = torch.empty(starts[wanted[-1]] + chunks[wanted[-1]].raw_length - lo, dtype=torch.uint8)
    view = buf.numpy().data
    read_runs(reader, pool, [(name, chunks[i], view[starts[i] - lo : starts[i] - lo + chunks[i].raw_length])
                             for i in wanted], commit_id=commit_id)
    rows = st.tensor_from_bytes(buf[begin - lo : end - lo], st.dtype_name(dtype), [last - first, *shape[1:]])
    if not shape:
        return rows.reshape([])
    return rows[(slice(None), *(slice(o, o + n) for o, n in zip(offsets[1:], lengths[1:], strict=True)))]
