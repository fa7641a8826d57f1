"""Decoded chunks kept between commits, to serve as delta bases without a store read.

A commit's delta base for a chunk is usually the same chunk position of the previous
commit on the branch — exactly the chunks the previous ingest just hashed. Keeping
their bytes saves decoding them (down their delta chains) from the store. The cache is
bounded by a byte budget (knob ``DELTA_CACHE``, 0: off): chunks are admitted
in ingest order while there is room and never evicted by newer ones within a commit, so
a state larger than the budget still gets hits on its first ``budget`` bytes instead of
none (plain LRU over a sequential scan would keep only chunks nobody asks for next).

Off by default, by measurement: with keyframe bases (the default) a base is one standalone
chunk, cheap to decode from the store, and a 128 MiB cache saved ~3% of ingest CPU while
adding its size to the peak memory of training-loop commits. With ``delta_base="parent"``
a base is a chain, and the cache saves decoding it.
"""

from __future__ import annotations

import threading


class BaseCache:
    """Thread-safe map of chunk id -> decoded bytes, within a byte budget, in two generations.

    ``put`` adds to the current generation (the commit being ingested); ``get`` looks in
    both; ``rotate`` (after a commit) drops the older generation, so memory holds at most
    the bases of the commit in flight plus the chunks it produced.
    """

    def __init__(self, budget: int) -> None:
        self.budget = max(0, budget)
        self._lock = threading.Lock()
        self._old: dict[str, bytes] = {}
        self._new: dict[str, bytes] = {}
        self._new_bytes = 0

    def get(self, chunk_id: str) -> bytes | None:
        with self._lock:
            found = self._new.get(chunk_id)
            return found if found is not None else self._old.get(chunk_id)

    def put(self, chunk_id: str, data: memoryview | bytes) -> None:
        """Keep a copy of ``data`` under ``chunk_id`` if the budget allows."""
        size = len(data)
        with self._lock:
            if chunk_id in self._new or self._new_bytes + size > self.budget:
                return
            self._new_bytes += size  # reserve, then copy without the lock
        copy = bytes(data)
        with self._lock:
            self._new[chunk_id] = copy

    def rotate(self) -> None:
        """Start a new generation: chunks of the commit just ingested become the bases."""
        with self._lock:
            self._old, self._new, self._new_bytes = self._new, {}, 0

    def clear(self) -> None:
        with self._lock:
            self._old, self._new, self._new_bytes = {}, {}, 0

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._old.values()) + sum(len(v) for v in self._new.values())
