"""Where a tensor's bytes are cut into chunks.

Cuts are fixed and element-aligned from the tensor's first byte, so an unchanged region of
a changed tensor yields the same chunks as before (exact dedup), and a child's chunk sits
at the same offset as its parent's (what delta coding pairs up).
"""

from __future__ import annotations

from ckptrepo.errors import UsageError


def chunk_step(itemsize: int, chunk_size: int) -> int:
    """The chunk length actually used: ``chunk_size`` rounded down to whole elements, at least one."""
    if itemsize < 1:
        raise UsageError(f"itemsize {itemsize} must be at least 1")
    if chunk_size < 1:
        raise UsageError(f"chunk size {chunk_size} must be at least 1")
    return max(itemsize, chunk_size - chunk_size % itemsize)


def chunk_spans(nbytes: int, itemsize: int, chunk_size: int) -> list[tuple[int, int]]:
    """(offset, length) cuts of a tensor's bytes.

    Fixed cuts from offset 0, each a multiple of ``itemsize`` (``chunk_size`` rounded down
    to a multiple of ``itemsize``, at least one element); a tensor of ``<= chunk_size``
    bytes is one chunk; an empty tensor (``nbytes == 0``) is ONE chunk of length 0, so
    every tensor has at least one chunk. ``nbytes`` must be a multiple of ``itemsize``.
    """
    step = chunk_step(itemsize, chunk_size)
    if nbytes < 0 or nbytes % itemsize:
        raise UsageError(f"{nbytes} bytes is not a whole number of {itemsize}-byte elements")
    if nbytes == 0:
        return [(0, 0)]
    return [(offset, min(step, nbytes - offset)) for offset in range(0, nbytes, step)]


def spans_of(nbytes: int, itemsize: int, chunk_size: int) -> list[tuple[int, int]]:
    """``chunk_spans`` of a tensor's bytes without the checks (the caller has a tensor): most
    tensors are one chunk, which this gives without the call (a commit cuts every tensor)."""
    if 0 < nbytes <= chunk_size - chunk_size % itemsize:
        return [(0, nbytes)]
    return chunk_spans(nbytes, itemsize, chunk_size)


def grid_spans(nbytes: int, start: int, itemsize: int, chunk_size: int) -> list[tuple[int, int]]:
    """(offset, length) cuts of a piece of a tensor's bytes that begins at byte ``start`` of the
    tensor: at the tensor's own fixed grid (multiples of ``chunk_step``), so every chunk of the
    piece but the first and last is the chunk the whole tensor has there, and those two are the
    parts of a grid chunk the piece holds. An empty piece has no chunks. ``start`` and
    ``nbytes`` must be whole elements."""
    step = chunk_step(itemsize, chunk_size)
    if start < 0 or start % itemsize or nbytes < 0 or nbytes % itemsize:
        raise UsageError(f"a piece of {nbytes} bytes at byte {start} is not whole {itemsize}-byte elements")
    spans: list[tuple[int, int]] = []
    offset = 0
    while offset < nbytes:
        length = min(nbytes - offset, step - (start + offset) % step)
        spans.append((offset, length))
        offset += length
    return spans
