"""``verify``: check the database against the pack store, trusting neither and changing nothing.

What is checked:

- every ``packs`` row: its object is in the store with the recorded size, its index reads
  back (header, trailer, index hash), holds as many chunks as the row says, and the pack
  hashes to its own id;
- every ``chunks`` row: its pack has a row, its ``base_key`` (if any) names a chunk row, and
  that pack's own index holds the chunk id at the same offset with the same length, raw
  length, encoding, depth and base (the id of the chunk ``base_key`` names), inside the
  payload area;
- every ref names an existing commit; every commit's parents exist, its entry count is
  the one recorded, its entries' tensor keys name existing tensors, and each of those
  tensors has ``tensor_chunks`` seq 0..n-1 whose chunk keys name existing chunks whose raw
  lengths add up to its bytes, but for a tensor whose chunk list gc dropped because only pruned
  commits name it (``catalog.drop_chunk_lists``): it must have none, and no commit that is not
  pruned may name it;
- the store: an object no ``packs`` row names is an *unreferenced pack*, a manifest of no
  commit an *unreferenced manifest*, a file left in a store's local staging folder a
  *temporary file* (warnings: leftovers of interrupted writes that ``gc`` reclaims; a commit
  running concurrently shows up there too); a commit without a manifest is a *missing
  manifest* (a warning: it restores, but a database rebuilt from the store would lack it);
- with ``full=True``: every chunk of every readable pack is read, decoded and checked
  against its id (BLAKE3), through the repository's ``ChunkReader``.

Errors name the commits (and tensor names) that can no longer be restored because of them,
following delta bases; per branch, the report names the newest commit of its first-parent
line that none of them breaks and that is not pruned (``last_good``: what to resume from; with ``full=True``, every
one of its chunks was read and verified). Read-only contract: the database is read in one read transaction (a
snapshot: REPEATABLE READ, read only, on PostgreSQL; SQLite's deferred transaction) before
the store is listed; nothing is written, created or deleted anywhere, not even the staging
folder (``Backend.staging_dir`` would create it, so it is looked up without that), except
that the commits' pending layouts are indexed first (``db.pending``: their rows are what is
checked; the catalog then says what it said, in the tables it checks).
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import blake3
from sqlalchemy import func, select
from sqlalchemy.orm import Session, aliased

from ckptrepo import knobs
from ckptrepo.chunks.pack import ENTRY, HEADER, TRAILER, pack_key, read_index
from ckptrepo.db.models import Chunk, Commit, Edge, Entry, Pack, Ref, Tensor, TensorChunk
from ckptrepo.errors import CkptError
from ckptrepo.ids import short
from ckptrepo.ledger import identity, journal, manifest
from ckptrepo.locations import ChunkLocation
from ckptrepo.maintenance.verify_ledger import LedgerCheck
from ckptrepo.storage import Backend, local_staging
from ckptrepo.storage.local import walk_files
from ckptrepo.types import Problem, VerifyCounts, VerifyReport

if TYPE_CHECKING:
    from ckptrepo.chunks.store import ChunkReader

__all__ = ["Problem", "VerifyCounts", "VerifyReport", "verify"]

_IN_BATCH = 500
_PACK_KEY = re.compile(r"packs/([0-9a-f]{2})/([0-9a-f]{64})\.pack")
_MAX_REASONS = 3
_LEASES = "leases/"


def verify(reading: Callable[[], AbstractContextManager[Session]], backend: Backend, reader: ChunkReader, *,
           full: bool = False) -> VerifyReport:
    """Check the database (sessions from ``reading``: ``db.pending.reading``, so that no pending
    layout is left) and the store ``backend`` against each other, reading chunks through
    ``reader`` when ``full`` (see the module docstring).

    Never raises for what it finds: problems are in the report. Raises only when the
    database or store cannot be read at all (StorageError, database errors).
    """
    started = time.monotonic()
    run = _Run(backend, reader, full)
    ledger = LedgerCheck(backend, full)
    with reading() as s:
        _snapshot(s)
        run.check_lineage(s)
        run.check_tensors(s)
        run.check_packs(s)
        run.resolve_users(s)
        ledger.check(s)
    run.check_store()
    if full:
        run.check_copies()
    ledger.confirm_missing(reading)
    for problem in ledger.problems:
        run.found[problem.kind].append(problem)
    run.counts.update(ledger.counts)
    report = run.report(time.monotonic() - started)
    with reading() as s:
        rows = s.execute(select(Ref.name, Ref.commit_id).where(Ref.kind == "branch").order_by(Ref.name))
        heads = {name: cid for name, cid in rows}
        return replace(report, heads=heads, last_good=_last_good(s, heads, set(report.damaged_commits)))


def _last_good(s: Session, heads: dict[str, str], damaged: set[str]) -> dict[str, str | None]:
    """Per branch, the newest commit of its first-parent line not in ``damaged`` and not pruned
    (None: none is, or the line reaches a commit that is gone)."""
    out: dict[str, str | None] = {}
    for name, head in heads.items():
        current: str | None = head
        row = s.execute(select(Commit.first_parent_id, Commit.pruned).where(Commit.id == current)).first()
        while current is not None and row is not None and (current in damaged or row[1]):
            current = row[0]
            row = s.execute(select(Commit.first_parent_id, Commit.pruned).where(Commit.id == current)).first()
        out[name] = current if row is not None else None
    return out


def _snapshot(s: Session) -> None:
    """Make every read of ``s`` see one consistent state of the database, read-only."""
    if s.get_bind().dialect.name == "postgresql":
        s.connection(execution_options={"isolation_level": "REPEATABLE READ", "postgresql_readonly": True})


def _batches(ids: Sequence[Any]) -> Iterator[Sequence[Any]]:
    for start in range(0, len(ids), _IN_BATCH):
        yield ids[start : start + _IN_BATCH]


@dataclass
class _Pending:
    """A problem whose affected commits are looked up once all problems are known.

    ``chunk_keys``: the ``chunks.key`` of the chunks it concerns.
    """

    kind: str
    subject: str
    detail: str
    chunk_keys: set[int]
    pack_id: str | None = None
    chunk_id: str | None = None


class _BadPack(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail


@dataclass
class _Run:
    """One verify: accumulates counts and problems; owned by the calling thread."""

    backend: Backend
    reader: ChunkReader
    full: bool
    counts: dict[str, Any] = field(default_factory=lambda: defaultdict(int))
    found: dict[str, list[Problem]] = field(default_factory=lambda: defaultdict(list))
    pending: list[_Pending] = field(default_factory=list)
    commit_reasons: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    commit_tensors: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    pack_ids: set[str] = field(default_factory=set)
    commit_ids: set[str] = field(default_factory=set)
    # full: every pack's index entries, the chunk rows' locations by id, and those already read
    copies: dict[str, list[ChunkLocation]] = field(default_factory=dict)
    row_locations: dict[str, ChunkLocation] = field(default_factory=dict)
    verified: set[ChunkLocation] = field(default_factory=set)

    # -- lineage: refs, commits, entries ----------------------------------------------------

    def check_lineage(self, s: Session) -> None:
        for kind, name, target in s.execute(
            select(Ref.kind, Ref.name, Ref.commit_id).outerjoin(Commit, Commit.id == Ref.commit_id)
            .where(Commit.id.is_(None))
        ):
            self.found["broken_ref"].append(Problem(
                "broken_ref", f"{kind} {name}", f"{kind} {name!r} points at {short(target)}, which is not a commit"))
        self.counts["refs"] = int(s.scalar(select(func.count()).select_from(Ref)) or 0)
        self.commit_ids = set(s.scalars(select(Commit.id)))
        self.counts["commits"] = len(self.commit_ids)
        for child, parent, kind in s.execute(
            select(Edge.child_id, Edge.parent_id, Edge.kind).outerjoin(Commit, Commit.id == Edge.parent_id)
            .where(Commit.id.is_(None))
        ):
            self.commit_reasons[child].append(f"its {kind} {short(parent)} is missing")
        entries = func.count(Entry.name)
        for cid, recorded, counted in s.execute(
            select(Commit.id, Commit.n_tensors, entries).outerjoin(Entry, Entry.commit_id == Commit.id)
            .group_by(Commit.id, Commit.n_tensors).having(entries != Commit.n_tensors)
        ):
            self.commit_reasons[cid].append(f"has {counted} tensor entries, its row records {recorded}")
        for cid, name in s.execute(
            select(Entry.commit_id, Entry.name).outerjoin(Tensor, Tensor.key == Entry.tensor_key)
            .where(Tensor.key.is_(None))
        ):
            self.commit_reasons[cid].append(f"tensor {name!r} has no tensor row")
            self.commit_tensors[cid].add(name)

    def check_tensors(self, s: Session) -> None:
        """Each tensor's chunk list is seq 0..n-1 of existing chunks adding up to its bytes."""
        n_links = func.count(TensorChunk.seq)
        n_found = func.count(Chunk.key)
        raw = func.coalesce(func.sum(Chunk.raw_length), 0)
        q = (
            select(Tensor.key, Tensor.id, Tensor.n_chunks, Tensor.nbytes, n_links, n_found, raw,
                   func.min(TensorChunk.seq), func.max(TensorChunk.seq), Tensor.lead_key)
            .outerjoin(TensorChunk, TensorChunk.tensor_key == Tensor.key)
            .outerjoin(Chunk, Chunk.key == TensorChunk.chunk_key)
            # By the primary key alone (the other columns depend on it): SQLite then reads
            # tensors and each one's tensor_chunks range in key order.
            .group_by(Tensor.key)
        )
        bad: dict[int, tuple[str, str]] = {}  # tensor key -> (tensor id, what is wrong)
        dropped: list[int] = []  # chunk lists gc dropped: only pruned commits named them
        for tkey, tid, n_chunks, nbytes, links, found, raw_sum, lo, hi, lead in s.execute(q):
            self.counts["tensors"] += 1
            if lead < 0 and not links:
                dropped.append(tkey)
            elif lead < 0:
                bad[tkey] = tid, f"has {links} chunk links, but gc dropped its chunk list"
            elif links != n_chunks or (links and (lo != 0 or hi != links - 1)):
                bad[tkey] = tid, f"has {links} chunk links (seq {lo}..{hi}), its row records {n_chunks}"
            elif found != links:
                bad[tkey] = tid, f"{links - found} of its {links} chunks have no chunk row"
            elif int(raw_sum) != nbytes:
                bad[tkey] = tid, f"its chunks add up to {raw_sum} bytes, its row records {nbytes}"
        for batch in _batches(dropped):
            # A damaged commit (``commits.damage``) is reported as such: its dropped lists are its damage.
            for cid, name in s.execute(select(Entry.commit_id, Entry.name).join(Commit, Commit.id == Entry.commit_id)
                                       .where(Entry.tensor_key.in_(batch), Commit.pruned.is_(False),
                                              Commit.damage.is_(None))):
                bad_reason = f"tensor {name!r} has no chunks: gc dropped them when only pruned commits named it"
                self.commit_reasons[cid].append(bad_reason)
                self.commit_tensors[cid].add(name)
        # A commit's reasons in the order of its tensors' ids (as before schema 0010), not of their keys.
        for batch in _batches(sorted(bad, key=lambda k: bad[k][0])):
            users = s.execute(
                select(Entry.commit_id, Entry.name, Entry.tensor_key).where(Entry.tensor_key.in_(batch))
            ).all()
            for cid, name, tkey in sorted(users, key=lambda u: (bad[u[2]][0], u[0], u[1])):
                self.commit_reasons[cid].append(f"tensor {name!r} {bad[tkey][1]}")
                self.commit_tensors[cid].add(name)

    # -- packs and chunks -------------------------------------------------------------------

    def check_packs(self, s: Session) -> None:
        for ckey, cid, pid in s.execute(
            select(Chunk.key, Chunk.id, Chunk.pack_id).outerjoin(Pack, Pack.id == Chunk.pack_id)
            .where(Pack.id.is_(None))
        ):
            self.pending.append(_Pending("bad_chunk", cid, f"chunk {short(cid)} names pack {short(pid)}, which has "
                                         "no pack row", {ckey}, pid, cid))
        packs = s.execute(select(Pack.id, Pack.size, Pack.n_chunks).order_by(Pack.id)).all()
        base = aliased(Chunk)
        # Threads start on first use: a structural verify never starts any.
        with ThreadPoolExecutor(max_workers=knobs.workers(), thread_name_prefix="ckpt-verify") as pool:
            for pid, size, n_chunks in packs:
                self.pack_ids.add(pid)
                self.counts["packs"] += 1
                self.counts["pack_bytes"] += size
                # Each chunk row with its delta base's id (the pack index names bases by id).
                rows = [(row, base_id) for row, base_id in s.execute(
                    select(Chunk, base.id).outerjoin(base, base.key == Chunk.base_key).where(Chunk.pack_id == pid))]
                try:
                    index, payload_end = self._read_pack(pid, size, n_chunks)
                except _BadPack as bad:
                    self.pending.append(_Pending(bad.kind, pid, bad.detail, {r.key for r, _ in rows}, pid))
                    continue
                good = self._check_chunks(pid, rows, index, payload_end)
                if self.full:
                    self._read_chunks(pool, good)
                    self.copies[pid] = [loc for locs in index.values() for loc in locs]
                    self.row_locations.update((loc.chunk_id, loc) for _, loc in good)
                    self.verified.update(loc for _, loc in good)

    def _read_pack(self, pid: str, recorded_size: int,
                   recorded_count: int) -> tuple[dict[str, list[ChunkLocation]], int]:
        """The pack's index by chunk id and where its payload area ends; _BadPack if unusable."""
        key = pack_key(pid)
        if not self.backend.exists(key):
            raise _BadPack("missing_pack", f"pack {short(pid)} is not in the store")
        try:
            size = self.backend.size(key)
            if size != recorded_size:
                raise _BadPack("damaged_pack", f"pack {short(pid)} is {size} bytes, the database records "
                                               f"{recorded_size}")
            entries = read_index(self.backend, key, pack_id=pid)
            payload_end = size - len(entries) * ENTRY.size - TRAILER.size
            # The id covers header, index and trailer (pack format): a pack under the wrong name
            # would hand out chunks the database does not expect there.
            named = blake3.blake3(self.backend.get_range(key, 0, HEADER.size)
                                  + self.backend.get_range(key, payload_end, size - payload_end)).hexdigest()
        except CkptError as exc:
            raise _BadPack("damaged_pack", f"pack {short(pid)}: {exc.fields.get('detail', exc.message)}") from exc
        if named != pid:
            raise _BadPack("damaged_pack", f"pack {short(pid)} hashes to {short(named)}, not to its name")
        if len(entries) != recorded_count:
            raise _BadPack("damaged_pack", f"pack {short(pid)} indexes {len(entries)} chunks, the database "
                                           f"records {recorded_count}")
        index: dict[str, list[ChunkLocation]] = defaultdict(list)
        for e in entries:
            index[e.chunk_id].append(e)
        return index, payload_end

    def _check_chunks(self, pid: str, rows: Sequence[tuple[Chunk, str | None]], index: dict[str, list[ChunkLocation]],
                      payload_end: int) -> list[tuple[int, ChunkLocation]]:
        """Compare each chunk row (with its delta base's id) with the pack's index; return the
        keys and locations of those that agree."""
        good: list[tuple[int, ChunkLocation]] = []
        for row, base_id in rows:
            self.counts["chunks"] += 1
            loc = ChunkLocation(row.id, pid, row.offset, row.length, row.raw_length, row.encoding, row.depth,
                                base_id)
            candidates = index.get(row.id, [])
            if row.base_key is not None and base_id is None:
                why = f"its delta base (chunk key {row.base_key}) has no chunk row"
            elif loc in candidates:
                if HEADER.size <= row.offset and row.offset + row.length <= payload_end:
                    good.append((row.key, loc))
                    continue
                why = f"{row.offset}+{row.length} lies outside the payload area"
            elif not candidates:
                why = "the pack's index does not hold it"
            else:
                why = "; ".join(_differences(loc, candidates[0]))
            self.pending.append(_Pending("bad_chunk", row.id, f"chunk {short(row.id)} in pack {short(pid)}: {why}",
                                         {row.key}, pid, row.id))
        return good

    def _read_chunks(self, pool: ThreadPoolExecutor, chunks: list[tuple[int, ChunkLocation]]) -> None:
        locs = [loc for _, loc in chunks]
        for (key, loc), failure in zip(chunks, pool.map(self._read_one, locs), strict=True):
            self.counts["chunks_read"] += 1
            self.counts["bytes_read"] += loc.length
            if failure is not None:
                self.pending.append(_Pending("corrupt_chunk", loc.chunk_id, failure, {key}, loc.pack_id, loc.chunk_id))

    def _read_one(self, loc: ChunkLocation) -> str | None:
        return _read_with(self.reader, loc)

    def resolve_users(self, s: Session) -> None:
        """Turn pending problems into problems naming the commits and tensors they break."""
        for p in self.pending:
            commits, names = _users(s, _with_dependents(s, p.chunk_keys))
            self.found[p.kind].append(Problem(p.kind, p.subject, p.detail, pack_id=p.pack_id, chunk_id=p.chunk_id,
                                              commits=tuple(sorted(commits)), tensors=tuple(sorted(names))))
        self.pending.clear()

    # -- the store --------------------------------------------------------------------------

    def check_store(self) -> None:
        now = time.time()
        for key in self.backend.list(""):
            self.counts["store_objects"] += 1
            if key.startswith((journal.PREFIX, _LEASES)) or key == identity.KEY:
                continue  # checked by ``verify_ledger`` (leases: writers' own, short-lived)
            cid = manifest.commit_of_key(key)
            if cid is not None:
                if cid not in self.commit_ids:
                    self._leftover("unreferenced_manifest", key, "no commit has it; gc reclaims it", now)
                continue
            match = _PACK_KEY.fullmatch(key)
            pid = match.group(2) if match and match.group(2).startswith(match.group(1)) else None
            if pid in self.pack_ids:
                continue
            if pid is None:  # gc deletes only what ckptrepo writes: this stays until someone moves it
                self._leftover("foreign_object", key, "not an object ckptrepo writes (a pack, manifest, journal "
                               "entry, lease or the identity); gc never removes it: move it out of the store", now)
                continue
            if self._unreferenced_pack_damaged(pid, key):
                continue
            self._leftover("unreferenced_pack", key, "no packs row names it; gc reclaims it", now, pack_id=pid)
        staging = local_staging(self.backend)
        if staging is None:
            return
        links: list[str] = []  # walked as gc walks it: through no symbolic link
        for _, name, rel, st in walk_files(staging, links):
            self.found["temporary_file"].append(Problem(
                "temporary_file", str(staging / rel), f"{name}: left by an interrupted write; gc reclaims it",
                size=st.st_size, age_s=now - st.st_mtime))
        for link in links:
            self.found["store_link"].append(Problem(
                "store_link", link, f"{link} is a symbolic link in the store's staging folder; gc neither "
                "follows nor removes it: remove it by hand"))

    def _unreferenced_pack_damaged(self, pid: str, key: str) -> bool:
        """Whether a pack no row names fails its footer or name check (then reported as a damaged
        pack: it is not a leftover of an interrupted write, which is whole, and a rebuild would
        index what it holds). With ``full`` its entries join the copies ``check_copies`` reads."""
        try:
            entries = read_index(self.backend, key, pack_id=pid, named=True)
        except CkptError as exc:
            if not self.backend.exists(key):
                return True  # deleted since listed (a concurrent gc): nothing left to report
            self.found["damaged_pack"].append(Problem(
                "damaged_pack", pid, f"pack {short(pid)} (no packs row names it): "
                f"{exc.fields.get('detail', exc.message)}", pack_id=pid))
            return True
        if self.full:
            self.copies[pid] = entries
        return False

    def check_copies(self) -> None:
        """full: read every chunk copy of every pack that no chunk row points at (a dead chunk of a
        partly live pack, a repack's old copy, a leftover pack's chunks), resolving delta bases by
        id among the rows and every pack's index. A rebuild would index such a copy, so a damaged
        one is an error even though no commit reads it now. A delta whose base is stored nowhere
        cannot be decoded (nor used by a rebuild): counted, not read."""
        known: dict[str, ChunkLocation] = dict(self.row_locations)
        for locs in self.copies.values():
            for loc in locs:
                known.setdefault(loc.chunk_id, loc)

        def lookup(ids: Collection[str]) -> dict[str, ChunkLocation]:
            return {i: known[i] for i in ids if i in known}

        def resolvable(loc: ChunkLocation) -> bool:
            seen: set[str] = set()
            base = loc.base_id
            while base is not None:
                if base in seen or base not in known:
                    return False
                seen.add(base)
                base = known[base].base_id
            return True

        from ckptrepo.chunks.store import ChunkReader  # chunk decoding loads numpy: full verify only

        reader = ChunkReader(self.backend, lookup)
        todo = [loc for locs in self.copies.values() for loc in locs if loc not in self.verified]
        for loc in todo:
            if not resolvable(loc):
                self.counts["unverifiable_chunks"] += 1
                continue
            self.counts["chunks_read"] += 1
            self.counts["bytes_read"] += loc.length
            failure = _read_with(reader, loc)
            if failure is not None:
                self.found["corrupt_chunk"].append(Problem(
                    "corrupt_chunk", loc.chunk_id, f"{failure} (a copy no chunk row uses: a rebuild could index it)",
                    pack_id=loc.pack_id, chunk_id=loc.chunk_id))

    def _leftover(self, kind: str, key: str, what: str, now: float, *, pack_id: str | None = None) -> None:
        try:
            size, age = self.backend.size(key), now - self.backend.mtime(key)
        except CkptError:
            return  # deleted since listed (a concurrent gc): nothing left to report
        self.found[kind].append(Problem(kind, key, f"{key}: {what}", pack_id=pack_id, size=size, age_s=age))

    def report(self, seconds: float) -> VerifyReport:
        for cid, reasons in self.commit_reasons.items():
            more = f"; and {len(reasons) - _MAX_REASONS} more" if len(reasons) > _MAX_REASONS else ""
            self.found["incomplete_commit"].append(Problem(
                "incomplete_commit", cid, f"commit {short(cid)}: " + "; ".join(reasons[:_MAX_REASONS]) + more,
                commits=(cid,), tensors=tuple(sorted(self.commit_tensors.get(cid, ())))))

        def kind(name: str) -> tuple[Problem, ...]:
            return tuple(sorted(self.found.get(name, []), key=lambda p: p.subject))

        return VerifyReport(
            full=self.full,
            checked=VerifyCounts(**self.counts, seconds=seconds),
            missing_packs=kind("missing_pack"),
            damaged_packs=kind("damaged_pack"),
            bad_chunks=kind("bad_chunk"),
            corrupt_chunks=kind("corrupt_chunk"),
            broken_refs=kind("broken_ref"),
            incomplete_commits=kind("incomplete_commit"),
            unreferenced_packs=kind("unreferenced_pack"),
            temporary_files=kind("temporary_file"),
            unreferenced_manifests=kind("unreferenced_manifest"),
            missing_manifests=kind("missing_manifest"),
            damaged_manifests=kind("damaged_manifest"),
            missing_journal_entries=kind("missing_journal_entry"),
            damaged_journal_entries=kind("damaged_journal_entry"),
            marked_damaged=kind("damaged_commit"),
            store_identity=kind("store_identity"),
            unrecorded_journal_entries=kind("unrecorded_journal_entry"),
            outdated_manifests=kind("outdated_manifest"),
            unclaimed_store=kind("unclaimed_store"),
            store_links=kind("store_link"),
            foreign_objects=kind("foreign_object"),
        )


def _read_with(reader: ChunkReader, loc: ChunkLocation) -> str | None:
    """None when the chunk at ``loc`` decodes to its id through ``reader``, else why not."""
    try:
        reader.read(loc)
    except CkptError as exc:
        why = str(exc.fields.get("detail", exc.message))
        why = why.removeprefix(f"chunk {loc.chunk_id} in pack {loc.pack_id}: ")
    except Exception as exc:  # a verifier reports what it cannot decode, whatever the codec raised
        why = f"{type(exc).__name__}: {exc}"
    else:
        return None
    return f"chunk {short(loc.chunk_id)} in pack {short(loc.pack_id)}: {why}"


def _differences(row: ChunkLocation, entry: ChunkLocation) -> list[str]:
    fields_ = ("offset", "length", "raw_length", "encoding", "depth", "base_id")
    return [f"{f} {getattr(row, f)} in the database, {getattr(entry, f)} in the pack index"
            for f in fields_ if getattr(row, f) != getattr(entry, f)]


def _with_dependents(s: Session, chunk_keys: set[int]) -> set[int]:
    """``chunk_keys`` and the key of every chunk stored as a delta against one of them, transitively."""
    closure = set(chunk_keys)
    frontier = sorted(chunk_keys)
    while frontier:
        found: set[int] = set()
        for batch in _batches(frontier):
            found.update(s.scalars(select(Chunk.key).where(Chunk.base_key.in_(batch))))
        frontier = sorted(found - closure)
        closure.update(frontier)
    return closure


def _users(s: Session, chunk_keys: set[int]) -> tuple[set[str], set[str]]:
    """The commits, and the names of their tensors, that use any of the chunks ``chunk_keys``."""
    commits: set[str] = set()
    names: set[str] = set()
    for batch in _batches(sorted(chunk_keys)):
        q = (
            select(Entry.commit_id, Entry.name)
            .join(TensorChunk, TensorChunk.tensor_key == Entry.tensor_key)
            .where(TensorChunk.chunk_key.in_(batch))
            .distinct()
        )
        for cid, name in s.execute(q):
            commits.add(cid)
            names.add(name)
    return commits, names
