"""Rebuild the database from the store alone: packs, commit manifests and the journal.

What comes from where (docs/design.md, "The store as the source of truth"):

- ``packs`` and the chunk index: every pack's footer (``chunks.pack``). A chunk found in
  several packs (a repack's old and new pack, both still stored) is indexed at its
  shallowest encoding; a delta whose base is stored nowhere is left out (reported).
- commits, edges, metrics, tensors and entries: every commit's manifest (``ledger.manifest``),
  checked against its id, recorded parents first through the same ``catalog.record_commit``
  a commit uses (so first-parent lines and tensor runs are derived as they were). A tensor
  whose chunks are gone (a pruned commit's, after ``gc``) gets its row and statistics without
  chunks, and its commit is marked pruned. A manifest whose parent has none is skipped, with
  its descendants (reported).
- ``pruned`` marks and the retention setting: the journal (``ledger.journal``).
- refs: replayed from the commits' own branch moves (each applies by compare-and-swap when
  the branch is at the head it expected, in time order, a move that waited for its predecessor
  applying as soon as that one has) and the journal's ref changes (applied as they were
  written). A commit whose move never applies and that no ref reaches is kept on
  ``conflicts/<branch>/<short id>``, as a commit that lost its compare-and-swap is.

Atomic: everything is inserted in one transaction. On SQLite the database is built as a new
file beside the old one and renamed into place, the old one (if any) kept as
``db.sqlite.before-rebuild-<time>``; on PostgreSQL the schema is created (and, with
``replace``, the old one dropped) inside that transaction. A crash or failure part-way leaves
the database as it was, and running the rebuild again completes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, exists, select, update
from sqlalchemy.orm import Session

from ckptrepo import faults
from ckptrepo.atomic import fsync_dir
from ckptrepo.chunks.pack import read_index
from ckptrepo.config import RepoConfig
from ckptrepo.db import catalog, migrate
from ckptrepo.db.engine import database_url, insert_tuples, make_engine
from ckptrepo.db.models import Commit, Pack, Ref, RepoMeta, Tensor, TensorChunk
from ckptrepo.errors import CkptError, RepositoryExists
from ckptrepo.ids import short
from ckptrepo.ledger import journal, manifest
from ckptrepo.locations import ChunkLocation
from ckptrepo.storage.base import Backend
from ckptrepo.types import RebuildReport

_PACK_KEY = re.compile(r"packs/([0-9a-f]{2})/([0-9a-f]{64})\.pack")
_RAW = 0  # codecs.Encoding.RAW
_READERS = 8  # store reads in flight (an object store's latency, not the CPU, bounds them)


@dataclass
class _Store:
    """What the store holds, read before anything is written."""

    packs: list[tuple[str, int, int, bool, datetime]] = field(default_factory=list)
    chunks: dict[str, ChunkLocation] = field(default_factory=dict)
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    manifest_bytes: int = 0
    journal: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _read_store(backend: Backend, *, compression: bool) -> _Store:
    found = _Store()
    pack_keys = [(m.group(2), key) for key in backend.list("packs/")
                 if (m := _PACK_KEY.fullmatch(key)) is not None and m.group(2).startswith(m.group(1))]

    def one_pack(item: tuple[str, str]) -> tuple[str, int, float, list[ChunkLocation]] | str:
        pid, key = item
        try:
            return pid, backend.size(key), backend.mtime(key), read_index(backend, key, pack_id=pid)
        except CkptError as exc:
            return f"pack {pid}: {exc}"

    def one_manifest(cid: str) -> tuple[dict[str, Any], int] | str:
        key = manifest.key_of(cid)
        try:
            data = backend.get(key)
            return manifest.read_bytes(data, cid, key=key), len(data)
        except CkptError as exc:
            return f"manifest of {short(cid)}: {exc}"

    with ThreadPoolExecutor(_READERS, thread_name_prefix="ckpt-rebuild") as pool:
        for got in pool.map(one_pack, pack_keys):
            if isinstance(got, str):
                found.skipped.append(got)
                continue
            pid, size, mtime, entries = got
            deferred = compression and bool(entries) and all(e.encoding == _RAW for e in entries)
            found.packs.append((pid, size, len(entries), deferred, datetime.fromtimestamp(mtime, timezone.utc)))
            for loc in entries:
                have = found.chunks.get(loc.chunk_id)
                if have is None or loc.depth < have.depth:
                    found.chunks[loc.chunk_id] = loc
        for got_m in pool.map(one_manifest, list(manifest.stored_ids(backend))):
            if isinstance(got_m, str):
                found.skipped.append(got_m)
                continue
            body, size = got_m
            found.manifests[body["id"]] = body
            found.manifest_bytes += size
    found.journal = [entry for _, entry in journal.entries(backend)]
    return found


def _decodable(chunks: dict[str, ChunkLocation], skipped: list[str]) -> list[ChunkLocation]:
    """The chunks whose delta chain ends in a stored chunk."""
    ok: dict[str, bool] = {}

    def check(cid: str) -> bool:
        chain: list[str] = []
        at: str | None = cid
        while at is not None and at not in ok:
            loc = chunks.get(at)
            if loc is None or at in chain:
                break
            chain.append(at)
            at = loc.base_id
        good = at is None or ok.get(at, False)
        for x in chain:
            ok[x] = good
        return ok.get(cid, False)

    out = [loc for cid, loc in chunks.items() if check(cid)]
    if len(out) < len(chunks):
        skipped.append(f"{len(chunks) - len(out)} chunk(s) whose delta base is stored nowhere")
    return out


def _in_order(manifests: dict[str, dict[str, Any]], skipped: list[str]) -> list[dict[str, Any]]:
    """The manifests parents first; those with a parent that has none are left out."""
    done: set[str] = set()
    order: list[dict[str, Any]] = []
    waiting: dict[str, list[str]] = {}
    missing: dict[str, int] = {}
    for cid, body in manifests.items():
        parents = {e[0] for e in body["edges"]}
        missing[cid] = len(parents)
        for p in parents:
            waiting.setdefault(p, []).append(cid)
    ready = sorted((cid for cid, n in missing.items() if n == 0), key=lambda c: manifests[c]["commit"]["created_at"])
    while ready:
        cid = ready.pop()
        done.add(cid)
        order.append(manifests[cid])
        for child in waiting.get(cid, ()):
            missing[child] -= 1
            if missing[child] == 0:
                ready.append(child)
    for cid in sorted(set(manifests) - done):
        absent = sorted({e[0] for e in manifests[cid]["edges"]} - manifests.keys())
        why = f"its parent {short(absent[0])} has no manifest" if absent else "an ancestor was skipped"
        skipped.append(f"commit {short(cid)}: {why}")
    return order


def _commit_row(body: Mapping[str, Any]) -> dict[str, Any]:
    row = {"id": body["id"], **body["commit"]}
    row["created_at"] = datetime.fromisoformat(row["created_at"])
    return row


def _record_commits(s: Session, order: list[dict[str, Any]], stored: set[str]) -> set[str]:
    """Insert every commit of ``order`` (parents first); returns the ids of those with a tensor
    whose chunks are not all stored."""
    layouts: dict[str, catalog.CommitLayout] = {}
    children: dict[str, int] = {}
    for body in order:
        for e in body["edges"]:
            children[e[0]] = children.get(e[0], 0) + 1
    dataless_commits: set[str] = set()
    for body in order:
        tensors, dataless = [], []
        for tid, rec in body["tensors"].items():
            ids = manifest.chunk_ids(rec)
            tensors.append(catalog.TensorRow(tid, rec[0], rec[1], rec[2], rec[3], ids, rec[5], rec[4]))
            if not stored.issuperset(ids):
                dataless.append(tid)
        edges = [catalog.EdgeRow(p, kind, pos, mapping) for p, kind, pos, mapping in body["edges"]]
        first = catalog.first_parent_of(edges)
        row = _commit_row(body)
        layouts[body["id"]] = catalog.record_commit(
            s, packs=[], chunks=[], tensors=tensors, commit=row, entries=body["entries"], edges=edges,
            metrics=body["metrics"], now=row["created_at"], parent=layouts.get(first) if first else None,
            dataless=dataless)
        if dataless:
            dataless_commits.add(body["id"])
        for e in body["edges"]:  # a parent's layout is kept until its last child is recorded
            children[e[0]] -= 1
            if children[e[0]] == 0 and e[0] in layouts:
                del layouts[e[0]]
        faults.point("rebuild.after_commit")
    return dataless_commits


@dataclass(frozen=True)
class _Move:
    at: float
    expected: str | None
    target: str


def replay_refs(manifests: Mapping[str, Mapping[str, Any]], entries: Iterable[Mapping[str, Any]]
                ) -> tuple[dict[tuple[str, str], str], list[str]]:
    """The refs ``{(kind, name): commit id}`` that the commits' branch moves and the journal's ref
    changes leave, and the commits whose move never applied.

    Per ref, the journal's changes (forced: branch create, reset, delete; tags) apply in time
    order. From each value the ref takes, it follows the commits' moves that expected that value
    (compare-and-swap). Of several moves from one value, which one the database took shows in
    what came after: the move whose own successors reach the latest time is taken (the others
    ended there: they lost, like a rolled-back transaction), ties to the later move. Timestamps
    only order the forced changes against the moves, so another host's clock being behind does
    not reorder a chain of moves."""
    moves: dict[tuple[str, str], list[_Move]] = {}
    forced: dict[tuple[str, str], list[tuple[float, str | None]]] = {}
    for cid, body in manifests.items():
        move = body["move"]
        moves.setdefault(("branch", move["branch"]), []).append(_Move(move["at"], move["from"], cid))
    for entry in entries:
        if entry.get("op") == "ref":
            forced.setdefault((entry["kind"], entry["name"]), []).append((entry["at"], entry["to"]))
    refs: dict[tuple[str, str], str] = {}
    lost: list[str] = []
    for ref in sorted(moves.keys() | forced.keys()):
        current, unused = _follow(moves.get(ref, []), sorted(forced.get(ref, []), key=lambda f: f[0]))
        if current is not None:
            refs[ref] = current
        lost.extend(m.target for m in unused)
    return refs, lost


def _follow(moves: list[_Move], forced: list[tuple[float, str | None]]) -> tuple[str | None, list[_Move]]:
    by_expected: dict[str | None, list[_Move]] = {}
    for m in moves:
        by_expected.setdefault(m.expected, []).append(m)
    latest: dict[str, float] = {}

    def reach(m: _Move) -> float:  # the latest time among m and the moves after it (iterative DFS)
        stack = [(m, False)]
        while stack:
            node, done = stack.pop()
            if node.target in latest:
                continue
            after = by_expected.get(node.target, [])
            if done:
                latest[node.target] = max([node.at, *(latest[a.target] for a in after)])
                continue
            stack.append((node, True))
            stack.extend((a, False) for a in after if a.target not in latest)
        return latest[m.target]

    used: set[str] = set()
    current: str | None = None
    for until, value in [*forced, (float("inf"), None)]:
        while True:
            options = [m for m in by_expected.get(current, []) if m.target not in used and m.at <= until]
            if not options:
                break
            best = max(options, key=lambda m: (reach(m), m.at, m.target))
            used.add(best.target)
            current = best.target
        if until != float("inf"):
            current = value
    return current, [m for m in moves if m.target not in used]


def _reachable(manifests: Mapping[str, Mapping[str, Any]], heads: Iterable[str]) -> set[str]:
    seen: set[str] = set()
    todo = [h for h in heads if h in manifests]
    while todo:
        cid = todo.pop()
        if cid in seen:
            continue
        seen.add(cid)
        todo.extend(e[0] for e in manifests[cid]["edges"] if e[0] in manifests)
    return seen


def _write(s: Session, found: _Store, order: list[dict[str, Any]]) -> tuple[int, int, int, int, int, int]:
    conn = s.connection()
    insert_tuples(conn, Pack, ("id", "size", "n_chunks", "deferred", "created_at"), sorted(found.packs))
    chunks = _decodable(found.chunks, found.skipped)
    catalog.insert_chunks(s, chunks)
    dataless = _record_commits(s, order, {c.chunk_id for c in chunks})
    # Tensors recorded without their chunks get what gc leaves of them (``catalog.drop_chunk_lists``).
    catalog.drop_chunk_lists(s, list(s.scalars(select(Tensor.key).where(
        Tensor.n_chunks > 0, ~exists().where(TensorChunk.tensor_key == Tensor.key)))))
    recorded = {body["id"]: body for body in order}
    marked = {cid for e in found.journal if e.get("op") == "prune" for cid in e.get("commits", ())}
    pruned = sorted((marked & recorded.keys()) | dataless)
    for start in range(0, len(pruned), 500):
        s.execute(update(Commit).where(Commit.id.in_(pruned[start : start + 500])).values(pruned=True))
    refs, lost = replay_refs(recorded, found.journal)
    refs = {ref: cid for ref, cid in refs.items() if cid in recorded}
    reached = _reachable(recorded, refs.values())
    conflicts = 0
    for cid in lost:
        if cid not in reached:
            refs[("branch", f"conflicts/{recorded[cid]['move']['branch']}/{short(cid)}")] = cid
            conflicts += 1
    now = datetime.now(timezone.utc)
    insert_tuples(conn, Ref, ("kind", "name", "commit_id", "updated_at"),
                  sorted((kind, name, cid, now) for (kind, name), cid in refs.items()))
    settings = [e for e in found.journal if e.get("op") == "retention"]
    if settings and settings[-1].get("rules") is not None:
        insert_tuples(conn, RepoMeta, ("key", "value"), [("retention", json.dumps(settings[-1]["rules"]))])
    branches = sum(1 for kind, _ in refs if kind == "branch")
    return len(chunks), len(order), len(pruned), branches, len(refs) - branches, conflicts


def _remove_sqlite(path: Path) -> None:
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        p.unlink(missing_ok=True)


def rebuild(repo_dir: Path, config: RepoConfig, backend: Backend, *, replace: bool = False) -> RebuildReport:
    """Recreate the database of the repository in ``repo_dir`` from its store (``backend``);
    see the module docstring. RepositoryExists when its database holds a repository already,
    unless ``replace`` (SQLite: the old file is kept beside the new one)."""
    started = time.perf_counter()
    url = database_url(config.db_url, repo_dir)
    sqlite = url.startswith("sqlite")
    target = building = Path()
    if sqlite:
        target, building = _file_of(url)
        if target.exists() and _holds_repository(url) and not replace:
            raise RepositoryExists(path=str(target), hint="Pass --replace (replace=True) to rebuild over it; "
                                   "the old file is kept beside the new one.")
        _remove_sqlite(building)  # left by a rebuild that did not finish
        url = database_url(f"sqlite:///{building}", repo_dir)
    where = str(target) if sqlite else _safe(url)
    found = _read_store(backend, compression=config.compression)
    order = _in_order(found.manifests, found.skipped)
    meta = {"repo_id": config.repo_id, "format_version": str(config.format_version)}
    engine = make_engine(url)
    try:
        with migrate.building(engine, meta, replace=replace and not sqlite) as conn, Session(bind=conn) as s:
            counts = _write(s, found, order)
            faults.point("rebuild.before_commit")
    finally:
        engine.dispose()
    moved_aside = None
    if sqlite:
        if target.exists():
            aside = target.with_name(f"{target.name}.before-rebuild-{time.strftime('%Y%m%dT%H%M%S')}")
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.rename(f"{target}{suffix}", f"{aside}{suffix}")
            moved_aside = str(aside)
        # The new file is whole (its one transaction committed, synchronous=FULL): the rename
        # makes it the database, and the folder's fsync makes the rename durable.
        os.replace(building, target)
        fsync_dir(target.parent)
    chunks, commits, pruned, branches, tags, conflicts = counts
    return RebuildReport(
        database=where, packs=len(found.packs), chunks=chunks,
        commits=commits, pruned=pruned, branches=branches, tags=tags, conflicts=conflicts,
        journal_entries=len(found.journal), manifest_bytes=found.manifest_bytes, skipped=tuple(found.skipped),
        moved_aside=moved_aside, seconds=time.perf_counter() - started)


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

