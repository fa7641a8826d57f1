"""Where a shard's bytes lie in its tensor's row-major order (no torch).

A shard is a box of the global tensor: ``offsets`` and ``sizes`` per dimension. It is one range
of the tensor's row-major bytes exactly when every dimension after the first it does not span
whole is spanned whole and every dimension before it has size 1 in the box (a row shard, or any
shard of a 1-D tensor). Such a shard is stored as that range, cut on the tensor's own chunk
grid (``chunker.grid_spans``), so the same tensor committed from any world size has the same
chunks but those straddling shard edges. Any other shard (a column shard) is stored as a box,
cut on its own grid: it deduplicates against the same box of another commit, not against
another layout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def is_range(shape: Sequence[int], offsets: Sequence[int], sizes: Sequence[int]) -> bool:
    """Whether the box ``offsets, sizes`` of a tensor of ``shape`` is one range of its row-major
    order (an empty box counts as one)."""
    if any(z == 0 for z in sizes):
        return True
    partial = [i for i, (d, z) in enumerate(zip(shape, sizes, strict=True)) if z != d]
    if not partial:
        return True
    first = partial[0]
    return all(sizes[i] == 1 for i in range(first)) and all(sizes[i] == shape[i] for i in range(first + 1, len(shape)))


def range_start(shape: Sequence[int], offsets: Sequence[int], itemsize: int) -> int:
    """The byte of the tensor's row-major order where element ``offsets`` lies."""
    position, stride = 0, 1
    for d, o in zip(reversed(shape), reversed(offsets), strict=True):
        position += o * stride
        stride *= d
    return position * itemsize


def grid_split(nbytes: int, parts: int, step: int) -> list[tuple[int, int]]:
    """``nbytes`` cut into at most ``parts`` consecutive ranges ``(start, end)`` of whole grid
    steps (the last may end short), as equal as whole steps allow; empty ranges left out."""
    steps = math.ceil(nbytes / step) if nbytes else 0
    out = []
    for i in range(parts):
        lo, hi = steps * i // parts * step, min(nbytes, steps * (i + 1) // parts * step)
        if hi > lo:
            out.append((lo, hi))
    return out
