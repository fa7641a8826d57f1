"""Garbage collection: remove what no ref reaches, then the packs and files nothing needs.

What is live (``liveness``): every commit reachable from a ref (branches, tags,
``conflicts/`` branches) through edges of any kind (parent, merge, transfer); the tensors of
live commits that are not pruned; their chunks, and transitively the delta bases of those
chunks; every pack holding a live chunk. Everything else is garbage, but for the rows of a
pruned reachable commit: it stays a lineage node (commit row, edges, metrics, entries, and its
tensors' rows with their statistics); only the chunk lists of the tensors no live commit names
go (``catalog.drop_chunk_lists``), and the chunks nothing live needs with them. A kept chunk's
delta base is kept, even if only pruned commits used it otherwise: nothing is re-encoded, so
every live chunk decodes as before.

Order (the write-ordering invariant run backwards):

1. One write transaction indexes the pending layouts (``db.pending``: until then a commit's
   tensors and new chunks have no rows, and its packs look empty), then deletes the rows of
   unreachable commits (metrics, annotations, entries, edges, commit), then tensors no reachable commit
   names, the chunk lists of tensors only pruned commits name, chunks no live tensor or live
   delta needs, and packs left without chunk rows. On SQLite
   the transaction takes the write lock first, so commits of other processes wait for it or
   it waits for them.
2. After it commits, the pack objects whose rows went are deleted from the store, and the
   manifests of the commits deleted (``ledger.manifest``). A crash in between leaves
   unreferenced packs and manifests, which the next run deletes.
3. Store objects no row names (packs and manifests of interrupted or in-flight commits) and
   temporary files in the store's local staging folder are deleted once older than the
   grace period, unless a live lease protects them (below). Candidates are listed first,
   the leases read second, and each batch's rows rechecked, stat-ed and deleted last
   (``_Sweep``), so a writer has no window between two of those steps.

Writers in flight: a commit (every rank of a distributed one), a repack batch and the
write-ahead put their packs, manifest and staging files before the transaction that names
them. Each takes a lease in the store first and releases it once that transaction has
committed or failed (``ledger.leases``). An unreferenced object whose store mtime is at or
after a live lease's own (minus a few seconds) is kept whatever ``grace`` is, so
``gc --grace 0`` beside running writers loses no acknowledged commit (a lease's own put, which
no lease covers, writes its staged file again if gc removed it: ``storage.local``). Stale leases (a dead
process on this host, or older than the ``LEASE_TTL`` knob) protect nothing and are deleted.
No object younger than ``grace`` seconds is deleted either. Its age is looked at again right
before the deletion, because pack ids are content hashes and a commit may have just written
the same pack again. A commit in another process that deduplicated against chunks this run
removes fails at its transaction (foreign keys) and leaves nothing behind; it then writes them
again and records again (``ingest.writer``), from the state it has staged.

Symbolic links: the staging folder is walked by folder descriptor without following any link,
the folder itself included; a link met there is neither followed nor removed, only counted
(``links_skipped``) and logged. Store keys come from ``Backend.list``, which lists no key
through a link (``storage.local``).

Chunks are never rewritten here: a pack that holds live and dead chunks is kept whole, and
the report says how many bytes such packs hold for dead chunks (``repack`` with
``compact_below`` moves their live chunks into new packs).

A pack that ``repack`` *retired* (moved its last chunk row away; ``packs.retired_at``) is
deleted only once ``retired_at`` is older than the grace period, whatever the age of the
file: a reader that looked up a chunk's old location just before the repack still finds it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError as DbIntegrityError
from sqlalchemy.orm import Session, sessionmaker

from ckptrepo import faults
from ckptrepo.chunks.pack import pack_key
from ckptrepo.db import catalog, integers, pending
from ckptrepo.db.engine import write_transaction
from ckptrepo.db.models import (
    Annotation,
    Chunk,
    Commit,
    Edge,
    Entry,
    JournalKey,
    Metric,
    Pack,
    RepoMeta,
    Tensor,
    TensorChunk,
)
from ckptrepo.errors import CkptError, ConcurrentChange, DamagedCommits, UsageError
from ckptrepo.ids import short
from ckptrepo.ledger import journal, leases, manifest
from ckptrepo.maintenance import DEFAULT_GRACE_S, liveness
from ckptrepo.storage import Backend, local_staging
from ckptrepo.storage.local import walk_files
from ckptrepo.types import GcReport

_PACK_KEY = re.compile(r"packs/([0-9a-f]{2})/([0-9a-f]{64})\.pack")
_BATCH = 2000
log = logging.getLogger("ckptrepo")


def _batches(ids: Sequence[Any]) -> Iterable[Sequence[Any]]:
    for i in range(0, len(ids), _BATCH):
        yield ids[i : i + _BATCH]


class _Plan:
    """What one run removes from the database, computed inside its write transaction."""

    def __init__(self, s: Session, cutoff: float) -> None:
        live = liveness.Live()
        self.commits: list[str] = list(s.scalars(select(Commit.id).where(Commit.id.not_in(live.reachable))))
        # Tensors and chunks by key: the rows that refer to them hold keys (schema 0010).
        self.tensors: list[int] = list(s.scalars(select(Tensor.key).where(Tensor.key.not_in(live.reachable_tensors))))
        # Tensors only pruned commits name: their rows (statistics) stay, their chunk lists go.
        self.stripped: list[int] = list(s.scalars(live.pruned_tensors()))
        needed = live.needed()
        dead = select(Chunk.key, Chunk.pack_id, Chunk.length, Chunk.depth).where(
            Chunk.key.not_in(select(needed.c.key))
        )
        rows = [(int(r[0]), str(r[1]), int(r[2]), int(r[3])) for r in s.execute(dead)]
        # Deltas before their bases: each batch deletes no chunk that a later batch's rows still name.
        rows.sort(key=lambda r: -r[3])
        self.chunks: list[int] = [r[0] for r in rows]
        dead_in_pack = Counter(r[1] for r in rows)
        dead_bytes_in_pack: Counter[str] = Counter()
        for r in rows:
            dead_bytes_in_pack[r[1]] += int(r[2])
        # Packs before their chunk counts: a pack a concurrent commit adds in between (where the
        # database does not serialize writers) is then not a candidate, rather than one that
        # looks empty.
        sizes = {str(r[0]): int(r[1]) for r in s.execute(select(Pack.id, Pack.size))}
        # Retired by a repack less than the grace period ago: readers may still hold its locations.
        recent = datetime.fromtimestamp(cutoff, timezone.utc)
        young = {str(r[0]): int(r[1]) for r in s.execute(
            select(Pack.id, Pack.size).where(Pack.retired_at.is_not(None), Pack.retired_at > recent))}
        per_pack = select(Chunk.pack_id, func.count()).group_by(Chunk.pack_id)
        rows_in_pack = {str(r[0]): int(r[1]) for r in s.execute(per_pack)}
        self.packs: list[str] = sorted(
            p for p in sizes if rows_in_pack.get(p, 0) == dead_in_pack.get(p, 0) and p not in young)
        self.young_retired = len(young)
        self.young_retired_bytes = sum(young.values())
        gone = set(self.packs)
        partly = [p for p in dead_in_pack if p not in gone]
        self.partial_packs = len(partly)
        self.dead_bytes_in_partial_packs = sum(dead_bytes_in_pack[p] for p in partly)

    def apply(self, s: Session) -> None:
        for ids in _batches(self.commits):
            s.execute(delete(Metric).where(Metric.commit_id.in_(ids)))
            s.execute(delete(Annotation).where(Annotation.commit_id.in_(ids)))
            s.execute(delete(Entry).where(Entry.commit_id.in_(ids)))
            s.execute(delete(Edge).where(Edge.child_id.in_(ids)))
        for ids in _batches(self.commits):
            s.execute(delete(Commit).where(Commit.id.in_(ids)))
        for keys in _batches(self.tensors):
            s.execute(delete(TensorChunk).where(TensorChunk.tensor_key.in_(keys)))
            s.execute(delete(Tensor).where(Tensor.key.in_(keys)))
        catalog.drop_chunk_lists(s, self.stripped)  # before their chunks go
        for keys in _batches(self.chunks):
            s.execute(delete(Chunk).where(Chunk.key.in_(keys)))
        for ids in _batches(self.packs):
            s.execute(delete(Pack).where(Pack.id.in_(ids)))
        liveness.require_unused(s, self.stripped)


class _Sweep:
    """Deletes store objects and staging files that no row names: never one younger than the
    cutoff, nor one a live lease may own (``ledger.leases``), nor anything through a symbolic link.

    Its order leaves a writer no window: ``list_candidates``, then ``protect`` (read the
    leases), then per batch recheck the rows, stat and delete. A candidate was put before the
    listing, so its writer's lease (put before it) was there when the leases were read, unless
    released, which happens only once its transaction has committed (a row names the object:
    the recheck keeps it) or failed (it is garbage).
    """

    def __init__(self, backend: Backend, cutoff: float, dry_run: bool) -> None:
        self.backend = backend
        self.cutoff = cutoff
        self.dry_run = dry_run
        self.deleted = 0
        self.deleted_bytes = 0
        self.kept_young = 0
        self.kept_young_bytes = 0
        self.kept_leased = 0
        self.kept_leased_bytes = 0
        self.stale_leases = 0
        self.links: list[str] = []  # symbolic links met in the staging folder, left alone
        self.leases = leases.Leases()
        self._seen: set[str] = set()
        self._packs: list[tuple[str, str]] = []
        self._manifests: list[tuple[str, str]] = []
        self._journal: list[str] = []
        self._staged: set[tuple[str, int]] = set()  # staging files listed: (relative path, inode)

    def list_candidates(self) -> None:
        """List the candidates: pack objects, manifests and staging files (before ``protect``)."""
        for key in self.backend.list("packs/"):
            match = _PACK_KEY.fullmatch(key)
            if match is not None and match.group(2).startswith(match.group(1)):
                self._packs.append((match.group(2), key))
        self._manifests = list(manifest.stored(self.backend))
        self._journal = [k for k in self.backend.list(journal.PREFIX) if journal.time_of(k) is not None]
        staging = local_staging(self.backend)
        if staging is not None:
            self._staged = {(rel, st.st_ino) for _, _, rel, st in walk_files(staging, self.links)}
        if self.links:
            shown = ", ".join(self.links[:3]) + (f" and {len(self.links) - 3} more" if len(self.links) > 3 else "")
            log.warning("gc does not follow or remove symbolic links in the store's staging folder: %s", shown)

    def protect(self) -> None:
        """Read the leases (after ``list_candidates``); delete the stale ones."""
        self.leases = leases.read(self.backend)
        self.stale_leases = len(self.leases.stale)
        if not self.dry_run:
            leases.release(self.backend, [f.key for f in self.leases.stale])

    def delete(self, key: str) -> None:
        if key in self._seen:
            return
        self._seen.add(key)
        try:
            size, mtime = self.backend.size(key), self.backend.mtime(key)
        except CkptError:
            return  # gone already (another gc, or never fully put)
        if mtime > self.cutoff:
            self.kept_young += 1
            self.kept_young_bytes += size
            return
        if self.leases.protects(mtime):
            self.kept_leased += 1
            self.kept_leased_bytes += size
            return
        if not self.dry_run:
            self.backend.delete(key)
        self.deleted += 1
        self.deleted_bytes += size

    def unreferenced_packs(self, s_factory: sessionmaker[Session]) -> None:
        """Delete listed pack objects that no ``packs`` row names (rechecked just before each batch)."""
        for chunk in _batches(self._packs):
            with s_factory() as s:
                named = set(s.scalars(select(Pack.id).where(Pack.id.in_([pid for pid, _ in chunk]))))
            for pid, key in chunk:
                if pid not in named:
                    self.delete(key)

    def unreferenced_manifests(self, s_factory: sessionmaker[Session]) -> None:
        """Delete listed manifests (``ledger.manifest``) of commits no ``commits`` row names (a
        commit interrupted before its transaction; rechecked just before each batch)."""
        for chunk in _batches(self._manifests):
            with s_factory() as s:
                named = set(s.scalars(select(Commit.id).where(Commit.id.in_([cid for cid, _ in chunk]))))
            for cid, key in chunk:
                if cid not in named:
                    self.delete(key)

    def unrecorded_journal(self, s_factory: sessionmaker[Session]) -> int:
        """Delete listed journal entries (``ledger.journal``) no transaction recorded
        (``journal_keys``): a change interrupted between its entry and its transaction. Entries
        from before the database recorded keys (``repo_meta.journal_keys_from``) are kept."""
        with s_factory() as s:
            since = int(s.scalar(select(RepoMeta.value).where(RepoMeta.key == "journal_keys_from")) or 0)
        before = self.deleted
        for chunk in _batches([k for k in self._journal if (journal.time_of(k) or 0) >= since]):
            with s_factory() as s:
                recorded = set(s.scalars(select(JournalKey.key).where(JournalKey.key.in_(chunk))))
            for key in chunk:
                if key not in recorded:
                    self.delete(key)
        return self.deleted - before

    def staging_files(self) -> tuple[int, int]:
        """Delete listed temporary files of the store's local staging folder that are older than
        the cutoff and no live lease may own; a symbolic link is neither followed nor removed."""
        staging = local_staging(self.backend)
        count = size = 0
        if staging is None or not self._staged:
            return 0, 0
        for dir_fd, name, rel, st in walk_files(staging, []):
            if (rel, st.st_ino) not in self._staged or st.st_mtime > self.cutoff:
                continue  # written since it was listed, or young
            if self.leases.protects_local(st.st_mtime):
                self.kept_leased += 1
                self.kept_leased_bytes += st.st_size
                continue
            if not self.dry_run:
                # Relative to the folder's descriptor: a folder swapped for a link meanwhile is not followed.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=dir_fd)
            count += 1
            size += st.st_size
        return count, size


def refuse_damaged(s: Session, what: str) -> None:
    """Raise DamagedCommits when a commit is damaged and not pruned (``commits.damage``): what a
    damaged commit still needs is not known (its manifest, or some of its chunks, are gone), so
    nothing may be freed until the damage is repaired or accepted (pruned)."""
    rows = list(s.execute(select(Commit.id).where(Commit.damage.is_not(None), Commit.pruned.is_(False))
                          .order_by(Commit.id).limit(3)))
    if rows:
        count = s.scalar(select(func.count()).select_from(Commit).where(
            Commit.damage.is_not(None), Commit.pruned.is_(False)))
        raise DamagedCommits(count=count, examples=", ".join(short(r[0]) for r in rows), what=what)


def collect(sessions: sessionmaker[Session], backend: Backend, *, grace: float = DEFAULT_GRACE_S,
            dry_run: bool = False) -> GcReport:
    """Remove everything no ref reaches; see the module docstring for the order and guarantees.

    ``dry_run`` computes the same report and changes nothing but indexing the pending layouts
    (``db.pending``), which every run does first in its transaction. Raises ConcurrentChange when a
    commit of another process inserted rows that name what this run was deleting (nothing
    is changed then; run gc again).
    """
    if isinstance(grace, int | float) and grace < 0:
        raise UsageError(f"grace period {grace} s is negative", hint="Pass --grace 0 or more seconds.")
    grace = integers.seconds("the grace period", grace)
    started = time.perf_counter()
    cutoff = time.time() - grace
    try:
        with write_transaction(sessions) as s:
            refuse_damaged(s, "gc")
            # Pending layouts first (``db.pending``): until indexed, a commit's tensors and new
            # chunks have no rows, and its packs look empty.
            pending.index_in(s)
            plan = _Plan(s, cutoff)
            if not dry_run:
                plan.apply(s)
                faults.point("gc.before_commit")
    except DbIntegrityError as exc:
        raise ConcurrentChange(what="gc", other="commit", detail=str(exc.orig).splitlines()[0]) from exc
    faults.point("gc.after_commit")
    if not dry_run:  # their rows are gone: their manifests go too, else a rebuild brings them back
        manifest.discard(backend, plan.commits)
    sweep = _Sweep(backend, cutoff, dry_run)
    # Candidates first, leases second (``_Sweep``): every object a writer put under a lease that
    # was released before this read is named by a row by now, or is garbage.
    sweep.list_candidates()
    sweep.protect()
    # Step 2: only now, with no row naming them, may the objects go.
    for pid in plan.packs:
        sweep.delete(pack_key(pid))
    removed_with_rows, removed_bytes_with_rows = sweep.deleted, sweep.deleted_bytes
    sweep.unreferenced_packs(sessions)
    unreferenced_packs = sweep.deleted - removed_with_rows
    sweep.unreferenced_manifests(sessions)
    unrecorded = sweep.unrecorded_journal(sessions)
    temp_files, temp_bytes = sweep.staging_files()
    return GcReport(
        dry_run=dry_run,
        grace_s=grace,
        commits_removed=len(plan.commits),
        tensors_removed=len(plan.tensors),
        chunks_removed=len(plan.chunks),
        packs_removed=removed_with_rows,
        unreferenced_packs_removed=unreferenced_packs,
        temporary_files_removed=temp_files,
        bytes_freed=sweep.deleted_bytes + temp_bytes,
        pack_bytes_freed=removed_bytes_with_rows,
        young_objects_kept=sweep.kept_young + plan.young_retired,
        young_bytes_kept=sweep.kept_young_bytes + plan.young_retired_bytes,
        partial_packs=plan.partial_packs,
        dead_bytes_in_partial_packs=plan.dead_bytes_in_partial_packs,
        seconds=time.perf_counter() - started,
        pruned_tensors_dropped=len(plan.stripped),
        leased_objects_kept=sweep.kept_leased,
        leased_bytes_kept=sweep.kept_leased_bytes,
        live_leases=len(sweep.leases.live),
        stale_leases_removed=sweep.stale_leases,
        links_skipped=len(sweep.links),
        journal_entries_removed=unrecorded,
    )
