"""Reading part of a tensor: only the chunks a region of it needs (resharding loads).

A region is a box of the tensor, ``offsets`` and ``lengths`` per dimension, as DCP's load plan
asks for one. For a tensor stored in its row-major order the region lies within the rows
``[offsets[0], offsets[0] + lengths[0])``, one range of bytes: the chunks overlapping it are
decoded (verified, on the worker pool) into one buffer, and the region is a view of it. A
tensor stored as boxes (``rows.TensorRow.boxes``) is read box by box, only the boxes the
region meets, each one range of the stream. A shard of an FSDP model on N ranks thus reads
about 1/N of each tensor's chunks, whatever world size wrote it.

Given a target (``out``) whose region is one range of the stored stream (whole rows of a
tensor stored row-major) and which is a contiguous CPU tensor of the stored dtype, the chunks
inside the range are decoded straight into the target's memory and only the two edge chunks
through a buffer: a resharding load then costs one decode per byte, not a decode and a copy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import Executor

import torch

from ckptrepo import state as st
from ckptrepo.chunks.store import ChunkReader
from ckptrepo.chunks.tensors import read_runs
from ckptrepo.errors import IntegrityError, UsageError
from ckptrepo.locations import ChunkLocation
from ckptrepo.rows import TensorRow


def read_region(reader: ChunkReader, pool: Executor, row: TensorRow, chunks: list[ChunkLocation],
                offsets: Sequence[int], lengths: Sequence[int], *, name: str, commit_id: str,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """The region ``[offsets, offsets + lengths)`` of the tensor ``row`` (its ordered chunk
    locations ``chunks``), reading only the chunks it overlaps; every chunk read is verified.
    ``out``: a tensor of the region's shape to read into instead, returned (its dtype converted
    as ``copy_`` converts). UsageError when the region is not inside the tensor or ``out`` has
    another shape."""
    shape = [int(d) for d in row.shape]
    if len(offsets) != len(shape) or len(lengths) != len(shape) or any(
            o < 0 or n < 0 or o + n > d for o, n, d in zip(offsets, lengths, shape, strict=True)):
        raise UsageError(f"region {list(offsets)}+{list(lengths)} is not inside tensor {name!r} of shape {shape}")
    if out is not None and list(out.shape) != [int(n) for n in lengths]:
        raise UsageError(f"{name}: the region {list(lengths)} does not fit a target of shape {list(out.shape)}")
    dtype = st.dtype_from_name(row.dtype)
    if out is not None:
        if row.boxes is None and _direct(out, dtype, shape, offsets, lengths):
            _into(reader, pool, row, chunks, shape, offsets, lengths, out, name, commit_id)
        else:
            out.copy_(read_region(reader, pool, row, chunks, offsets, lengths, name=name, commit_id=commit_id))
        return out
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


def _direct(out: torch.Tensor, dtype: torch.dtype, shape: list[int], offsets: Sequence[int],
            lengths: Sequence[int]) -> bool:
    """Whether the region can be decoded straight into ``out``: whole rows of the tensor (one
    range of its row-major bytes), into a contiguous CPU tensor of the stored dtype (bools
    excluded: their bytes are checked on the way, ``state.tensor_from_bytes``)."""
    return (out.device.type == "cpu" and out.dtype == dtype and dtype != torch.bool and out.is_contiguous()
            and out.numel() > 0 and len(shape) > 0 and not (out.is_conj() or out.is_neg())
            and all(o == 0 for o in offsets[1:]) and list(lengths[1:]) == shape[1:])


def _spans(row: TensorRow, chunks: list[ChunkLocation], name: str, commit_id: str) -> list[int]:
    """Each chunk's start in the tensor's stored stream (IntegrityError when they do not add up)."""
    starts, pos = [], 0
    for loc in chunks:
        starts.append(pos)
        pos += loc.raw_length
    if pos != row.nbytes:
        raise IntegrityError(detail=f"tensor {name!r} of commit {commit_id[:10]} has missing chunks")
    return starts


def _into(reader: ChunkReader, pool: Executor, row: TensorRow, chunks: list[ChunkLocation], shape: list[int],
          offsets: Sequence[int], lengths: Sequence[int], out: torch.Tensor, name: str, commit_id: str) -> None:
    """Decode the rows ``[offsets[0], offsets[0] + lengths[0])`` into ``out`` (``_direct``): the
    chunks inside them straight into its memory, the edge chunks through buffers."""
    row_bytes = math.prod(shape[1:]) * out.element_size()
    begin, end = offsets[0] * row_bytes, (offsets[0] + lengths[0]) * row_bytes
    target = out.detach().reshape(-1).view(torch.uint8).numpy().data
    work: list[tuple[str, ChunkLocation, memoryview]] = []
    edges: list[tuple[memoryview, int]] = []  # (buffer, the stream offset of its first byte)
    for at, loc in zip(_spans(row, chunks, name, commit_id), chunks, strict=True):
        stop = at + loc.raw_length
        if stop <= begin or at >= end:
            continue
        if at >= begin and stop <= end:
            work.append((name, loc, target[at - begin : stop - begin]))
        else:
            buf = memoryview(bytearray(loc.raw_length))
            work.append((name, loc, buf))
            edges.append((buf, at))
    read_runs(reader, pool, work, commit_id=commit_id)
    for buf, at in edges:
        lo, hi = max(at, begin), min(at + len(buf), end)
        target[lo - begin : hi - begin] = buf[lo - at : hi - at]


def _from_stream(reader: ChunkReader, pool: Executor, row: TensorRow, chunks: list[ChunkLocation], shape: list[int],
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
    starts = _spans(row, chunks, name, commit_id)
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
