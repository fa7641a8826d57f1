"""What data is live, as queries: shared by ``gc`` (what it deletes) and ``prune`` (what a gc
would then free).

A commit is *reachable* when a ref reaches it through edges of any kind; *kept* when it is
reachable and not pruned (``commits.pruned``). Live tensors are those kept commits name; live
chunks are their chunks and, transitively, those chunks' delta bases. So a chunk a live chunk
is a delta against stays, whoever else used it: nothing is ever re-encoded to free space.
A tensor that only pruned (reachable) commits name is *pruned data*: its row and statistics stay
for the lineage, its chunk list goes (``catalog.drop_chunk_lists``), and its chunks with it
unless something live needs them.

Functions take the caller's session (gc's write transaction, prune's) and build their queries
from one ``Live`` (one recursive walk of the refs per statement).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import CTE, Select, func, select
from sqlalchemy.orm import Session

from ckptrepo.db.models import Chunk, Commit, Entry, Pack, Tensor, TensorChunk
from ckptrepo.db.refs import live_commits
from ckptrepo.errors import ConcurrentChange

_IN_BATCH = 500


def closure(seed: Select[Any], name: str) -> CTE:
    """Recursive CTE (``key``) of the chunk keys ``seed`` selects (one column) and, transitively,
    the keys of their delta bases."""
    found = seed.cte(name, recursive=True)
    return found.union(select(Chunk.base_key.label("key")).where(Chunk.key == found.c.key,
                                                                  Chunk.base_key.is_not(None)))


class Live:
    """The queries of one liveness computation (see the module docstring)."""

    def __init__(self) -> None:
        walk = live_commits()
        self.reachable: Select[Any] = select(walk.c.id)
        """Ids of the commits some ref reaches."""
        self.kept: Select[Any] = select(Commit.id).where(Commit.id.in_(self.reachable), Commit.pruned.is_(False))
        """Ids of the reachable commits that are not pruned."""
        self.reachable_tensors: Select[Any] = select(Entry.tensor_key).where(Entry.commit_id.in_(self.reachable))
        self.live_tensors: Select[Any] = select(Entry.tensor_key).where(Entry.commit_id.in_(self.kept))

    def needed(self) -> CTE:
        """Recursive CTE (``key``) of the live chunks."""
        seed = select(TensorChunk.chunk_key.label("key")).where(TensorChunk.tensor_key.in_(self.live_tensors))
        return closure(seed, "live_chunks")

    def pruned_tensors(self) -> Select[Any]:
        """Keys of the tensors only pruned reachable commits name that still have a chunk list."""
        return select(Tensor.key).where(Tensor.key.in_(self.reachable_tensors), Tensor.key.not_in(self.live_tensors),
                                        Tensor.lead_key > 0)


class Freeable(NamedTuple):
    """What a gc would free of the data only pruned commits use: chunks and their stored
    bytes; of their packs, those that would go whole (every chunk row dead) and their size."""

    chunks: int = 0
    bytes: int = 0
    packs: int = 0
    pack_bytes: int = 0


def freeable(s: Session) -> Freeable:
    """What the next gc frees because of pruned commits (chunks nothing live needs that a pruned
    reachable commit's tensors use, with their delta bases), read in the caller's snapshot.
    A pack counts as going whole when all its chunk rows are dead, for whatever reason; packs
    younger than gc's grace period or retired recently wait for a later run."""
    live = Live()
    needed = live.needed()
    seed = select(TensorChunk.chunk_key.label("key")).where(TensorChunk.tensor_key.in_(live.pruned_tensors()))
    theirs = closure(seed, "pruned_chunks")
    dead = select(Chunk.pack_id, Chunk.length, Chunk.key.in_(select(theirs.c.key))).where(
        Chunk.key.not_in(select(needed.c.key)))
    dead_in_pack: Counter[str] = Counter()
    mine: Counter[str] = Counter()
    total = 0
    for pack_id, length, pruned in s.execute(dead):
        dead_in_pack[pack_id] += 1
        if pruned:
            mine[pack_id] += 1
            total += int(length)
    if not mine:
        return Freeable()
    touched = sorted(mine)
    whole: list[str] = []
    for start in range(0, len(touched), _IN_BATCH):
        batch = touched[start : start + _IN_BATCH]
        counts = s.execute(select(Chunk.pack_id, func.count()).where(Chunk.pack_id.in_(batch)).group_by(Chunk.pack_id))
        whole.extend(pid for pid, n in counts if int(n) == dead_in_pack[pid])
    sizes = 0
    for start in range(0, len(whole), _IN_BATCH):
        sizes += int(s.scalar(select(func.coalesce(func.sum(Pack.size), 0))
                              .where(Pack.id.in_(whole[start : start + _IN_BATCH]))) or 0)
    return Freeable(sum(mine.values()), total, len(whole), sizes)


def require_unused(s: Session, stripped: Sequence[int]) -> None:
    """ConcurrentChange when a commit that is not pruned names one of the tensors whose chunk
    lists this transaction dropped: a commit of another process recorded it meanwhile (on
    PostgreSQL, which does not serialize the two transactions; this statement sees it)."""
    for start in range(0, len(stripped), _IN_BATCH):
        used = s.execute(select(Entry.commit_id).join(Commit, Commit.id == Entry.commit_id)
                         .where(Entry.tensor_key.in_(stripped[start : start + _IN_BATCH]),
                                Commit.pruned.is_(False)).limit(1)).first()
        if used is not None:
            raise ConcurrentChange(what="gc", other="commit",
                                   detail=f"commit {used[0][:10]} uses data only pruned commits used before")
