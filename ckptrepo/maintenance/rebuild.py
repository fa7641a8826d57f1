"""Rebuild the database from the store alone: packs, commit manifests and the journal.

What comes from where (docs/design.md, "The store as the source of truth"); every object is
checked as it is read (``maintenance.scan``) and nothing that fails a check is used:

- ``packs`` and the chunk index: every pack's footer (``chunks.pack``). A chunk found in
  several packs (a repack's old and new pack, both still stored) is indexed at its
  shallowest encoding; a delta whose base is stored nowhere is left out (reported). Rows go in
  bases first, by the delta chains themselves (``catalog.insert_chunks``).
- commits, edges, metrics, tensors and entries: every commit's manifest, checked through the
  manifest chain (``ledger.manifest``: checksum, commit id, every tensor id recomputed),
  recorded parents first through the same ``catalog.record_commit`` a commit uses (so
  first-parent lines and tensor runs are derived as they were).
- **damage**: a commit whose manifest is missing or refused keeps its place in the lineage as a
  *damaged* node (``commits.damage``: no metadata, no tensors), so its descendants are rebuilt
  on top of it instead of being dropped; when the database being replaced still has the commit,
  its record is taken from there instead (``recovered``). A commit with a tensor whose chunks
  are not all stored (or add up to another size than its record) is damaged too, unless the
  journal says it was pruned (then gc dropped them: it is pruned). Damaged commits cannot be
  read (``CommitDamaged``), ``verify`` fails on them, and ``gc`` refuses to run while one is
  not pruned, so nothing they may still need is deleted.
- ``pruned`` marks, the retention setting and annotations (results attached to commits after
  the fact, in the order they were written; ``db.notes``): the journal
  (``ledger.journal``); the keys of its entries go to ``journal_keys``.
- refs: replayed (``maintenance.replay``) from the commits' own branch moves and the journal's
  ref changes. A commit whose move never applies and that no ref reaches is kept on
  ``conflicts/<branch>/<short id>``, as a commit that lost its compare-and-swap is; a ref whose
  commit has no manifest points at that commit's damaged node.

The store must be this repository's (``ledger.identity``; a store with no identity, or a
damaged one, is read as it is, the latter reported). The report lists everything skipped and
counts the damaged commits; the CLI exits non-zero when either is not empty (``RebuildReport.ok``).

Atomic: everything is inserted in one transaction. On SQLite the database is built as a new
file beside the old one and renamed into place, the old one (if any) kept as
``db.sqlite.before-rebuild-<time>``; on PostgreSQL the schema is created (and, with
``replace``, the old one dropped) inside that transaction. A crash or failure part-way leaves
the database as it was, and running the rebuild again completes it.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, delete, exists, select, update
from sqlalchemy.orm import Session, sessionmaker

from ckptrepo import faults
from ckptrepo.atomic import atomic_build
from ckptrepo.config import RepoConfig
from ckptrepo.db import catalog, migrate, notes, pending
from ckptrepo.db.engine import database_url, insert_tuples, make_engine
from ckptrepo.db.models import Commit, JournalKey, Pack, Ref, RepoMeta, Tensor, TensorChunk
from ckptrepo.errors import IntegrityError, RepositoryExists, StoreInUse
from ckptrepo.ids import short
from ckptrepo.ledger import identity, manifest
from ckptrepo.locations import ChunkLocation
from ckptrepo.maintenance import backfill, scan
from ckptrepo.maintenance.replay import replay_refs
from ckptrepo.rows import TensorRow
from ckptrepo.storage.base import Backend
from ckptrepo.types import RebuildReport

_MISSING = "its manifest is missing from the store"
_SQLITE_COMPANIONS = ("-wal", "-shm")  # a SQLite database's log and the log's index


@dataclass
class _Plan:
    """The commits to record (bodies of manifests, parents first; damaged nodes included), the
    refs to set, and why each damaged commit is."""

    order: list[dict[str, Any]] = field(default_factory=list)
    refs: dict[tuple[str, str], str] = field(default_factory=dict)
    conflicts: int = 0
    damaged: dict[str, str] = field(default_factory=dict)


def placeholder(cid: str, created_at: datetime) -> dict[str, Any]:
    """The body recorded for a commit whose manifest is lost: a lineage node with nothing else."""
    row: dict[str, Any] = dict.fromkeys(manifest.COMMIT_FIELDS)
    row.update(message="", created_at=created_at.isoformat(), author="", host="", skeleton={}, n_tensors=0,
               logical_bytes=0, new_bytes=0, stored_bytes=0, stall_s=0.0, wait_s=0.0, persist_s=0.0, nonfinite=0)
    return {"id": cid, "commit": row, "edges": [], "metrics": {}, "entries": {}, "tensors": {}, "move": None}


def _plan(found: scan.Scan) -> _Plan:
    plan = _Plan(damaged=dict(found.lost))
    bodies = dict(found.manifests)
    entries = [e for _, e in found.journal]
    # Every commit something names but whose manifest is gone or refused becomes a damaged node,
    # so that nothing that descends from it, a move expects or a ref points at is dropped.
    named = ({e[0] for b in bodies.values() for e in b["edges"]} | set(found.lost)
             | {b["move"]["from"] for b in bodies.values() if b["move"]["from"] is not None}
             | {e["to"] for e in entries if e["op"] == "ref" and e["to"] is not None})
    children: dict[str, list[str]] = {}
    expected_on: dict[str, list[tuple[str, float]]] = {}
    for b in bodies.values():
        for e in b["edges"]:
            children.setdefault(e[0], []).append(b["commit"]["created_at"])
        move = b["move"]
        if move["from"] is not None and move["from"] not in bodies:  # its own move is lost with its manifest
            expected_on.setdefault(move["from"], []).append((move["branch"], move["at"]))
    now = datetime.now(timezone.utc)
    for cid in sorted(named - bodies.keys()):
        plan.damaged.setdefault(cid, _MISSING)
        when = min((datetime.fromisoformat(t) for t in children.get(cid, ())), default=now)
        bodies[cid] = placeholder(cid, when)
    plan.order = in_order(bodies, found.skipped, plan.damaged)
    recorded = {b["id"] for b in plan.order}
    real = {cid: b for cid, b in bodies.items() if b["move"] is not None}
    refs, lost = replay_refs(real, entries, expected_on)
    plan.refs = {ref: cid for ref, cid in refs.items() if cid in recorded}
    reached = _reachable(bodies, plan.refs.values())
    for cid in lost:
        if cid not in reached and cid in recorded and cid in real:
            plan.refs[("branch", f"conflicts/{bodies[cid]['move']['branch']}/{short(cid)}")] = cid
            plan.conflicts += 1
    return plan


def in_order(bodies: dict[str, dict[str, Any]], skipped: list[str], damaged: dict[str, str]) -> list[dict[str, Any]]:
    """The bodies parents first (a parent without a body is recorded already: a rebuild gives
    every parent one, ``_plan`` adds damaged nodes). None is left out but commits on a cycle of
    edges, which only crafted manifests can make."""
    order: list[dict[str, Any]] = []
    waiting: dict[str, list[str]] = {}
    missing: dict[str, int] = {}
    for cid, body in bodies.items():
        parents = {e[0] for e in body["edges"] if e[0] in bodies}  # others are recorded already (a fetch)
        missing[cid] = len(parents)
        for p in parents:
            waiting.setdefault(p, []).append(cid)
    ready = sorted((cid for cid, n in missing.items() if n == 0), key=lambda c: bodies[c]["commit"]["created_at"])
    while ready:
        cid = ready.pop()
        order.append(bodies[cid])
        for child in waiting.get(cid, ()):
            missing[child] -= 1
            if missing[child] == 0:
                ready.append(child)
    done = {b["id"] for b in order}
    for cid in sorted(set(bodies) - done):
        skipped.append(f"commit {short(cid)}: its edges form a cycle")
        damaged.pop(cid, None)
    return order


def _commit_row(body: Mapping[str, Any]) -> dict[str, Any]:
    row = {"id": body["id"], **body["commit"]}
    row["created_at"] = datetime.fromisoformat(row["created_at"])
    return row


def _missing_data(entries: Mapping[str, str], rows: Mapping[str, TensorRow], sizes: Mapping[str, int]) -> str | None:
    """Why the commit of ``entries`` (the ``rows`` of its tensors by id) cannot be read from the
    chunks stored (``sizes``: raw length by chunk id), or None when every tensor's chunks are
    stored and add up to its size."""
    for name, tid in sorted(entries.items()):
        row = rows[tid]
        gone = sum(1 for c in row.chunk_ids if c not in sizes)
        if gone:
            return f"{gone} of the {len(row.chunk_ids)} chunks of tensor {name!r} are missing from the store"
        total = sum(sizes[c] for c in row.chunk_ids)
        if total != row.nbytes:
            return f"the chunks of tensor {name!r} add up to {total} bytes, its manifest records {row.nbytes}"
    return None


def record_bodies(s: Session, order: list[dict[str, Any]], sizes: Mapping[str, int]) -> dict[str, str]:
    """Insert every commit of ``order`` (manifest bodies, parents first; a parent outside ``order``
    must be recorded already); returns why each commit whose data is not all stored cannot be
    read, by id (their tensors without all chunks are recorded without). ``sizes``: the raw
    length of every chunk stored, by id (``fetch`` records commits the same way)."""
    layouts: dict[str, catalog.CommitLayout] = {}
    children: dict[str, int] = {}
    for body in order:
        for e in body["edges"]:
            children[e[0]] = children.get(e[0], 0) + 1
    unreadable: dict[str, str] = {}
    for body in order:
        tensors = manifest.tensor_rows(body)
        dataless = [tid for tid, t in tensors.items() if not all(c in sizes for c in t.chunk_ids)]
        edges = [catalog.EdgeRow(p, kind, pos, mapping) for p, kind, pos, mapping in body["edges"]]
        first = catalog.first_parent_of(edges)
        row = _commit_row(body)
        layouts[body["id"]] = catalog.record_commit(
            s, packs=[], chunks=[], tensors=tensors.values(), commit=row, entries=body["entries"], edges=edges,
            metrics=body["metrics"], now=row["created_at"],
            parent=(layouts.get(first) or catalog.commit_layout(s, first)) if first else None,
            dataless=dataless)
        why = _missing_data(body["entries"], tensors, sizes)
        if why is not None:
            unreadable[body["id"]] = why
        for e in body["edges"]:  # a parent's layout is kept until its last child is recorded
            children[e[0]] -= 1
            if children[e[0]] == 0 and e[0] in layouts:
                del layouts[e[0]]
        faults.point("rebuild.after_commit")
    return unreadable


def _reachable(bodies: Mapping[str, Mapping[str, Any]], heads: Iterable[str]) -> set[str]:
    seen: set[str] = set()
    todo = [h for h in heads if h in bodies]
    while todo:
        cid = todo.pop()
        if cid in seen:
            continue
        seen.add(cid)
        todo.extend(e[0] for e in bodies[cid]["edges"] if e[0] in bodies)
    return seen


@dataclass(frozen=True)
class _Counts:
    chunks: int
    commits: int
    pruned: int
    damaged: int
    branches: int
    tags: int


def _write(s: Session, found: scan.Scan, plan: _Plan) -> _Counts:
    conn = s.connection()
    insert_tuples(conn, Pack, ("id", "size", "n_chunks", "deferred", "created_at"), sorted(found.packs))
    insert_tuples(conn, Pack, ("id", "size", "n_chunks", "deferred", "created_at", "remote"),
                  sorted(found.remote_packs))
    chunks = scan.decodable(found.chunks, found.skipped)
    catalog.insert_chunks(s, chunks)
    unreadable = record_bodies(s, plan.order, {c.chunk_id: c.raw_length for c in chunks})
    # Tensors recorded without their chunks get what gc leaves of them (``catalog.drop_chunk_lists``).
    catalog.drop_chunk_lists(s, list(s.scalars(select(Tensor.key).where(
        Tensor.n_chunks > 0, ~exists().where(TensorChunk.tensor_key == Tensor.key)))))
    recorded = {body["id"] for body in plan.order}
    marked = {cid for _, e in found.journal if e["op"] == "prune" for cid in e["commits"]} & recorded
    # Data gone from a commit the journal pruned is what gc frees; from any other, it is damage.
    damaged = {**{cid: why for cid, why in unreadable.items() if cid not in marked},
               **{cid: why for cid, why in plan.damaged.items() if cid in recorded}}
    pruned = sorted(marked)
    for start in range(0, len(pruned), 500):
        s.execute(update(Commit).where(Commit.id.in_(pruned[start : start + 500])).values(pruned=True))
    for cid, why in sorted(damaged.items()):
        s.execute(update(Commit).where(Commit.id == cid).values(damage=why))
    now = datetime.now(timezone.utc)
    insert_tuples(conn, Ref, ("kind", "name", "commit_id", "updated_at"),
                  sorted((kind, name, cid, now) for (kind, name), cid in plan.refs.items()))
    for key, e in found.journal:  # results attached later, in the order they were written
        if e["op"] == "annotate" and e["commit"] in recorded:
            notes.record(s, e["commit"], e["metrics"], e.get("note"), e.get("source"),
                               datetime.fromtimestamp(e["at"], timezone.utc), key, strict=False)
    insert_tuples(conn, JournalKey, ("key",), sorted((key,) for key, _ in found.journal))
    s.execute(delete(RepoMeta).where(RepoMeta.key == "journal_keys_from"))  # every entry is recorded
    settings = [e for _, e in found.journal if e["op"] == "retention"]
    if settings and settings[-1].get("rules") is not None:
        insert_tuples(conn, RepoMeta, ("key", "value"), [("retention", json.dumps(settings[-1]["rules"]))])
    branches = sum(1 for kind, _ in plan.refs if kind == "branch")
    return _Counts(len(chunks), len(plan.order), len(pruned), len(damaged), branches, len(plan.refs) - branches)


def _recover(url: str, found: scan.Scan) -> list[str]:
    """Take the record of every commit whose manifest is missing or refused from the database at
    ``url`` (the one being replaced), when it has the commit and the record passes the manifest
    checks; returns the ids recovered. A database that cannot be read recovers nothing."""
    engine: Engine | None = None
    recovered: list[str] = []
    try:
        engine = make_engine(url)
        sessions = sessionmaker(bind=engine)
        with pending.reading(sessions, defers=engine.dialect.name == "sqlite") as s:
            ids = [cid for cid in s.scalars(select(Commit.id).where(Commit.damage.is_(None)))
                   if cid not in found.manifests]
            for cid in ids:
                body = backfill.manifest_of(s, cid)
                with contextlib.suppress(Exception):  # a record that fails the checks is not used
                    body = manifest.read_bytes(manifest.encode(body), cid)
                    found.manifests[cid] = body
                    found.lost.pop(cid, None)
                    recovered.append(cid)
    except Exception as exc:  # the old database is damaged or of another schema: nothing to recover
        found.skipped.append(f"the database being replaced could not be read to recover commits: {exc}")
    finally:
        if engine is not None:
            engine.dispose()
    return recovered


def rebuild(repo_dir: Path, config: RepoConfig, backend: Backend, *, replace: bool = False,
            remote_packs: Callable[[], tuple[list[tuple[str, str, int, list[ChunkLocation]]], list[str]]]
            | None = None) -> RebuildReport:
    """Recreate the database of the repository in ``repo_dir`` from its store (``backend``);
    see the module docstring. RepositoryExists when its database holds a repository already,
    unless ``replace`` (SQLite: the old file is kept beside the new one); StoreInUse when the
    store belongs to another repository. ``remote_packs``: the packs of the repository's remotes
    (``(remote, pack id, size, index entries)``, and what could not be read), whose chunks the
    store lacks: a lazy clone's commits read them through their remote."""
    started = time.perf_counter()
    damage: list[str] = []
    try:
        owner = identity.read(backend)
    except IntegrityError as exc:  # a damaged identity names nobody: rebuild, and say so
        owner = None
        damage.append(exc.message)
    if owner is not None and owner != config.repo_id:
        raise StoreInUse(url=backend.url, found=owner, expected=config.repo_id)
    url = old_url = database_url(config.db_url, repo_dir)
    sqlite = url.startswith("sqlite")
    target = Path()
    aside = None
    publish: contextlib.AbstractContextManager[Path | None] = contextlib.nullcontext()
    if sqlite:
        target, building = _file_of(url)
        had_repository = target.exists() and _holds_repository(url)  # connecting would create the file
        if had_repository and not replace:
            raise RepositoryExists(path=str(target), hint="Pass --replace (replace=True) to rebuild over it; "
                                   "the old file is kept beside the new one.")
        if target.exists():
            aside = target.with_name(f"{target.name}.before-rebuild-{time.strftime('%Y%m%dT%H%M%S')}")
        # The new file is built beside the old one (what a rebuild that did not finish left there
        # is removed first), whole once its one transaction commits (synchronous=FULL); then
        # the old one and its log move aside and a rename makes the new one the database.
        publish = atomic_build(target, temporary=building, aside=aside, companions=_SQLITE_COMPANIONS)
    else:
        had_repository = _holds_repository(url)
    where = str(target) if sqlite else _safe(url)
    with publish as built:
        if built is not None:
            url = database_url(f"sqlite:///{built}", repo_dir)
        found = scan.scan(backend, compression=config.compression)
        found.skipped[:0] = damage
        if remote_packs is not None:
            scan.add_remote_packs(found, *remote_packs())
        recovered: list[str] = []
        if had_repository and replace:
            recovered = _recover(old_url, found)
        plan = _plan(found)
        meta = {"repo_id": config.repo_id, "format_version": str(config.format_version)}
        if owner is not None:
            meta[identity.CLAIMED] = "1"
        engine = make_engine(url)
        try:
            with migrate.building(engine, meta, replace=replace and not sqlite) as conn, Session(bind=conn) as s:
                counts = _write(s, found, plan)
                faults.point("rebuild.before_commit")
        finally:
            engine.dispose()
    moved_aside = None if aside is None else str(aside)
    return RebuildReport(
        database=where, packs=len(found.packs), chunks=counts.chunks,
        commits=counts.commits, pruned=counts.pruned, branches=counts.branches, tags=counts.tags,
        conflicts=plan.conflicts, journal_entries=len(found.journal), manifest_bytes=found.manifest_bytes,
        skipped=tuple(found.skipped), moved_aside=moved_aside, seconds=time.perf_counter() - started,
        damaged=counts.damaged, recovered=len(recovered))


def _file_of(url: str) -> tuple[Path, Path]:
    from sqlalchemy.engine import make_url

    target = Path(str(make_url(url).database)).absolute()
    return target, target.with_name(f"{target.name}.rebuilding")


def _holds_repository(url: str) -> bool:
    """Whether the database at ``url`` opens and names a repository (a damaged file does not)."""
    engine: Engine | None = None
    try:
        engine = make_engine(url)
        with engine.connect() as conn:
            return conn.exec_driver_sql("SELECT value FROM repo_meta WHERE key = 'repo_id'").scalar() is not None
    except Exception:  # unreadable or not a database: nothing to keep from
        return False
    finally:
        if engine is not None:
            engine.dispose()


def _safe(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)

