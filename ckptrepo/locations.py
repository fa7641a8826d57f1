"""Where a chunk's bytes live: the one value type the chunk store, the packs and the catalog share.

A ``ChunkLocation`` is a row of the catalog's chunk index and an entry of a pack's own index
(``chunks.pack``) at once: the chunk's id (BLAKE3 of its decoded bytes), its pack, the byte
range of its encoded payload there, how to decode it (``encoding``, and for a delta its
``base_id`` and chain ``depth``) and, for a delta chunk, what it would take standalone
(``alone_length``, which the catalog keeps for ``stats``). ``chunks`` and ``db`` both import
this module and never each other.
"""

from __future__ import annotations

from typing import NamedTuple


class ChunkLocation(NamedTuple):
    """One stored chunk: identity, place, decoding. ``pack_id`` is empty only inside a pack
    being written (its id is known once its index is)."""

    chunk_id: str
    pack_id: str
    offset: int
    length: int
    raw_length: int
    encoding: int
    depth: int = 0
    base_id: str | None = None
    alone_length: int | None = None

    def in_pack(self, pack_id: str) -> ChunkLocation:
        """This location inside pack ``pack_id``."""
        return self._replace(pack_id=pack_id)
