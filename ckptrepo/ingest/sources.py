"""What phase 2 ingests: named tensors as raw bytes, with no torch object in sight.

A ``Source`` is one tensor of a commit: its entry name, stored dtype name, shape and its
values' C-order bytes (a flat ``'B'`` memoryview that the caller keeps unchanged until the
commit is durable: a staging slot's view, a memory-mapped file's, or a blocking commit's own
tensor). Torch tensors become sources through ``from_tensors``; a safetensors file's entries
are sources already (``formats.safetensors_file``), so such a file is committed without
importing torch.

A ``LazySource`` is a whole tensor whose bytes do not exist yet: ``ingest`` asks for them when
it reaches that tensor and lets go of them once its chunks are in packs, so a commit of
computed tensors (``explore.merging``: a weight-space merge) holds about one tensor's bytes
at a time, not the state's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ckptrepo.entries import escape, flat_skeleton

if TYPE_CHECKING:
    import torch

    from ckptrepo.formats.readbuffer import ReadBuffer
    from ckptrepo.ingest.stats import Moments

# What a producer knows of one chunk of its bytes: (offset, length, chunk id, moments).
Digest = tuple[int, int, str, "Moments"]


class Source(NamedTuple):
    """One tensor, or one piece of a tensor, to ingest: entry name, stored dtype name
    (``"float32"``), the tensor's (global) shape and the bytes of this source.

    A whole tensor (``box`` None) is cut at the repository's chunk size from its first byte. A
    piece (one rank's shard of a distributed tensor) has ``box``, ``(offsets, sizes)`` of the
    global tensor, and ``start``: the byte of the tensor's row-major order where ``data``
    begins when the box is one range of that order (it is then cut on the tensor's grid,
    ``chunker.grid_spans``), None when it is not (a column shard: it is cut on its own grid and
    stored as a box, ``models.Tensor.boxes``).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: memoryview
    box: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    start: int | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape) if self.box is None else math.prod(self.box[1])


class LazySource(NamedTuple):
    """One whole tensor whose bytes ``produce()`` makes on demand: entry name, stored dtype name,
    shape, and a callable returning its C-order bytes (a flat ``'B'`` memoryview of exactly
    ``nbytes``). ``ingest`` calls it once it reaches the tensor, on its own thread, and drops
    the view once every chunk of it is in a pack (or found stored), before it asks the next
    lazy source. A commit that writes again (a concurrent gc removed what it shared) calls it
    again: it must return the same bytes each time.

    ``digests``, when given, is called right after ``produce()`` and may return what a producer
    that went over the bytes anyway (a merge, chunk by chunk) already knows of them: each chunk's
    ``(offset, length, chunk id, moments)``. The ingest takes them instead of hashing the bytes
    again when their cuts are exactly its own (``chunker.spans_of`` at its chunk size), and hashes
    as usual otherwise or for None."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    produce: Callable[[], memoryview]
    digests: Callable[[], list[Digest] | None] | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def from_tensors(tensors: Mapping[str, torch.Tensor]) -> list[Source]:
    """Sources over ``tensors`` (entry name -> tensor), in order: aliased for contiguous CPU
    tensors, copied once otherwise (``state.tensors_bytes``)."""
    from ckptrepo import state as st

    views = st.tensors_bytes(tensors.values())
    return [Source(name, st.dtype_name(t.dtype), tuple(t.shape), view)
            for (name, t), view in zip(tensors.items(), views, strict=True)]


def from_safetensors(path: Path, buffer: ReadBuffer) -> tuple[Any, list[Source]] | None:
    """The skeleton and sources of a plain safetensors file (a flat dict of tensors, as
    ``formats.read_state`` reads it), read whole into ``buffer`` (direct I/O where the filesystem
    allows: no page-cache copy, no page faults while hashing; the sources are views of it, valid
    until its next read), without torch; None for any other input (another suffix, a folder, a
    file carrying a ckptrepo skeleton), which the caller reads as a state of tensors.
    InvalidInput (naming the file) when it is damaged."""
    from ckptrepo.formats.safetensors_file import read_flat

    if path.suffix.lower() != ".safetensors" or not path.is_file():
        return None
    flat = read_flat(path, buffer=buffer)
    if flat.skeleton is not None:
        return None
    sources = [Source(escape(x.name), x.dtype, tuple(x.shape), x.data) for x in flat.tensors]
    return flat_skeleton([x.name for x in flat.tensors]), sources
