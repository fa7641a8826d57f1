"""Fetch: bring a remote's new commits into this repository, as remote-tracking refs.

Order (nothing is visible before the last step):

1. The remote's heads: its ref objects (``remote.refs``), or for the store of a working
   repository its refs replayed from its manifests and journal (``maintenance.replay``).
2. The manifests of the commits those heads reach that this repository lacks, walking parents,
   each checked through the manifest chain (``ledger.manifest``); a commit whose manifest is
   missing or refused becomes a damaged lineage node, as in a rebuild.
3. The remote's bundles not read before (``remote.bundles``: the pack indexes and manifests of
   a push in one object), then the footers of the packs no bundle described (``remote.index``).
4. The manifests are stored in this repository's store, verbatim (durable before the
   transaction, as a commit's own are: a rebuild from the local store finds them).
5. One transaction: the rows of the chunks this repository lacks, pointing at the remote's packs
   (read through the remote until fetched: ``remote.tiered``), the commits parents first, the
   remote's prune marks on the commits fetched, the remote-tracking refs (``REMOTE/BRANCH``, kind
   ``remote``; a branch deleted on the remote loses its ref) and the remote's tags that do not
   exist here.
6. The remote's annotations this repository lacks, on the commits it has (``remote.notes``).

Only commits a remote ref reaches are fetched: objects of a push whose ref move was refused stay
invisible. Tensor bytes are not downloaded (``Repo.fetch(data=...)`` and a full clone fetch them).
"""

from __future__ import annotations

from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, cast

from sqlalchemy import Table, delete, select, update
from sqlalchemy.orm import Session, sessionmaker

from ckptrepo import faults
from ckptrepo.db import catalog
from ckptrepo.db.engine import Sessions, insert_tuples, present_values, write_transaction
from ckptrepo.db.models import Commit, Pack, Ref, RemotePack
from ckptrepo.db.refs import check_ref_name, reachable_from
from ckptrepo.errors import CkptError, InvalidRefName, StoreInUse
from ckptrepo.ledger import identity, journal, manifest
from ckptrepo.ledger.leases import Lease
from ckptrepo.locations import ChunkLocation
from ckptrepo.maintenance.rebuild import in_order, placeholder, record_bodies
from ckptrepo.maintenance.replay import replay_refs
from ckptrepo.remote import index, notes, refs
from ckptrepo.remote.stores import RemoteStore
from ckptrepo.remote.transfer import Meter, closure
from ckptrepo.storage.base import Backend
from ckptrepo.types import RefUpdate

_COMMITS = cast(Table, Commit.__table__)
_READERS = 16  # manifests in flight
_MISSING = "its manifest is missing from the remote"


@dataclass
class Fetched:
    """What a fetch did, for ``FetchResult``."""

    commits: int = 0
    packs_indexed: int = 0
    refs: list[RefUpdate] = field(default_factory=list)
    pruned: int = 0
    annotations: int = 0
    problems: list[str] = field(default_factory=list)
    new_ids: list[str] = field(default_factory=list)
    # Chunks this store held whose rows moved to the remote's shallower copies: the caller keeps
    # them here again (``localize``), so that what was local stays local.
    relocated_here: list[str] = field(default_factory=list)


class CountingBackend:
    """Reads of ``backend`` counted in ``meter`` (for what a fetch downloaded); every other call
    goes to ``backend`` as it is."""

    def __init__(self, backend: Backend, meter: Meter) -> None:
        self._b, self._m = backend, meter
        self.url = backend.url

    def __getattr__(self, name: str) -> Any:
        return getattr(self._b, name)

    def get(self, key: str) -> bytes:
        data = self._b.get(key)
        self._m.read(len(data))
        return data

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        data = self._b.get_range(key, offset, length)
        self._m.read(len(data))
        return data

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        self._b.read_into(key, offset, out)
        self._m.read(out.nbytes)

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        got = self._b.read_versioned(key)
        if got is not None:
            self._m.read(len(got[0]))
        return got


def remote_heads(store: RemoteStore, backend: Backend, damaged: dict[tuple[str, str], str]
                 ) -> tuple[dict[tuple[str, str], str], dict[str, dict[str, Any]]]:
    """The remote's refs ``{(kind, name): commit id}``, and the manifests read to find them (the
    store of a working repository: all of them, by id). A damaged ref object is left out, and
    put in ``damaged`` with why."""
    if not store.working and refs.is_remote(backend):
        return refs.heads(refs.read_all(backend, damaged)), {}
    bodies: dict[str, dict[str, Any]] = {}
    for cid in manifest.stored_ids(backend):
        try:
            body = manifest.read(backend, cid)
            check_ref_name(body["move"]["branch"], "branch")
            bodies[cid] = body
        except (CkptError, InvalidRefName):
            continue
    entries = [e for _, e in journal.read(backend).entries if e["op"] != "ref" or _valid_ref(e)]
    found, _ = replay_refs(bodies, entries)
    return found, bodies


def _valid_ref(entry: dict[str, Any]) -> bool:
    try:
        check_ref_name(entry["name"], entry["kind"])
        return True
    except InvalidRefName:
        return False


def _known(s: Session, ids: Collection[str]) -> set[str]:
    return present_values(s.connection(), _COMMITS.c.id, sorted(ids))


def _walk(reading: Sessions, backend: Backend, heads: Collection[str], cached: dict[str, dict[str, Any]],
          problems: list[str]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The manifests of every commit ``heads`` reach that this repository lacks (checked), and the
    commits among them whose manifest is missing or refused, with why."""
    bodies: dict[str, dict[str, Any]] = {}
    lost: dict[str, str] = {}
    with reading() as s:
        frontier = set(heads) - _known(s, heads)

    def one(cid: str, listed: tuple[str, int] | None = None) -> dict[str, Any] | str:
        if cid in cached:
            return cached[cid]
        try:
            if listed is None:
                body = manifest.read(backend, cid)
            else:  # key and size from a listing: one request
                key, size = listed
                if size > manifest.MAX_BYTES:
                    return f"manifest {key} is larger than {manifest.MAX_BYTES} bytes"
                body = manifest.read_bytes(backend.get(key), cid, key=key)
            check_ref_name(body["move"]["branch"], "branch")
            if body["commit"]["branch"] is not None:
                check_ref_name(body["commit"]["branch"], "branch")
            return body
        except InvalidRefName as exc:
            return f"its branch name is refused: {exc}"
        except CkptError as exc:
            return str(exc)

    with ThreadPoolExecutor(_READERS, thread_name_prefix="ckpt-fetch") as pool:
        rounds = 0
        while frontier:
            rounds += 1
            if rounds == 2:
                # More than one generation is new: read every manifest the remote lists that this
                # repository lacks at once (a chain read parent by parent costs a round trip each).
                # Those no head reaches (a refused push's) are read but never recorded.
                keys: dict[str, tuple[str, int]] = {}
                for key, size in backend.list_sized(manifest.PREFIX):
                    cid = manifest.commit_of_key(key)
                    if cid is not None and cid not in cached and (cid not in keys or key == manifest.key_of(cid)):
                        keys[cid] = (key, size)
                with reading() as s:
                    todo = sorted(set(keys) - _known(s, keys))
                got_all = pool.map(one, todo, [keys[c] for c in todo])
                cached = {**cached, **{c: b for c, b in zip(todo, got_all, strict=True) if not isinstance(b, str)}}
            batch = sorted(frontier)
            parents: set[str] = set()
            for cid, got in zip(batch, pool.map(one, batch), strict=True):
                if isinstance(got, str):
                    lost[cid] = _MISSING if "no object" in got else f"its manifest on the remote is damaged ({got})"
                    problems.append(f"commit {cid[:10]}: {got}")
                    continue
                bodies[cid] = got
                parents.update(e[0] for e in got["edges"])
            parents -= bodies.keys() | lost.keys()
            with reading() as s:
                frontier = parents - _known(s, parents)
    return bodies, lost




def fetch(sessions: sessionmaker[Session], reading: Sessions, local: Backend, store: RemoteStore, name: str,
          repo_id: str, meter: Meter) -> Fetched:
    """Fetch remote ``name`` (``store``) into the repository of ``sessions`` (module docstring)."""
    backend = cast(Backend, CountingBackend(store.backend, meter))
    owner = identity.read(backend)
    if owner is not None and owner != repo_id:
        raise StoreInUse(url=backend.url, found=owner, expected=repo_id)
    out = Fetched()
    bad_refs: dict[tuple[str, str], str] = {}
    heads, cached = remote_heads(store, backend, bad_refs)
    out.problems.extend(bad_refs.values())
    in_bundles, bundle_packs, problems = index.read_bundles(sessions, backend, name)  # a few objects per push
    out.problems.extend(problems)
    cached = {**in_bundles, **cached}
    bodies, lost = _walk(reading, backend, set(heads.values()), cached, out.problems)
    read, problems = index.refresh(sessions, backend, name)  # the footers of packs no bundle described
    out.packs_indexed = read + bundle_packs
    out.problems.extend(problems)
    # Lost commits become damaged nodes (their children are kept), dated by their oldest child.
    damaged: dict[str, str] = dict(lost)
    for cid in lost:
        times = [datetime.fromisoformat(b["commit"]["created_at"]) for b in bodies.values()
                 if any(e[0] == cid for e in b["edges"])]
        bodies[cid] = placeholder(cid, min(times, default=datetime.now(timezone.utc)))
    skipped: list[str] = []
    order = in_order(bodies, skipped, damaged)
    out.problems.extend(skipped)
    wanted = {c for b in order for t in manifest.tensor_rows(b).values() for c in t.chunk_ids}
    entries = notes.read_entries(reading, backend, out.problems)  # prune marks and annotations
    with reading() as s:
        have = catalog.chunks_by_id(s, sorted(wanted))
        moved: list[ChunkLocation] = []  # rows here to move to the remote's shallower copies

        def lookup(ids: Collection[str]) -> dict[str, ChunkLocation]:
            there = index.locations(s, name, ids)
            here = {**{c: have[c] for c in ids if c in have},
                    **catalog.chunks_by_id(s, sorted(c for c in there if c not in have))}  # bases met on the way
            remote_held = _remote_packs(s, {loc.pack_id for loc in here.values()})
            shallower = [c for c, loc in there.items() if c in here and _shallower(loc, here[c])]
            moved.extend(there[c] for c in shallower)
            out.relocated_here.extend(c for c in shallower if here[c].pack_id not in remote_held)
            return {c: loc for c, loc in there.items() if c not in here or c in shallower}

        fetched = closure([c for c in wanted if c not in have], lookup)
        sizes = {**{c: loc.raw_length for c, loc in have.items()}, **{c: loc.raw_length for c, loc in fetched.items()}}
        pack_ids = sorted({loc.pack_id for loc in fetched.values()})
        pack_rows = {r.pack_id: r for r in s.scalars(select(RemotePack).where(
            RemotePack.remote == name, RemotePack.pack_id.in_(pack_ids)))} if pack_ids else {}
    # 4. Manifests into the local store, verbatim, before the transaction names them; a lease in
    # the local store from before them until the transaction ended (a gc meanwhile keeps them).
    lease = Lease(local, "fetch")
    lease.take()
    mark_key: str | None = None
    try:
        with ThreadPoolExecutor(_READERS, thread_name_prefix="ckpt-fetch") as pool:
            list(pool.map(lambda b: manifest.write(local, b), [b for b in order if b["id"] not in lost]))
        pruned = {cid for _, e, _ in entries if e["op"] == "prune" for cid in e["commits"]}
        ids = [b["id"] for b in order]
        marked = sorted(pruned & set(ids))
        now = datetime.now(timezone.utc)
        # The remote's prune marks on what is fetched go to this store's journal too (a rebuild).
        mark_key = journal.append(local, {"op": "prune", "commits": marked}) if marked else None
        with write_transaction(sessions) as s:
            conn = s.connection()
            present = set(s.scalars(select(Pack.id).where(Pack.id.in_(pack_ids)))) if pack_ids else set()
            insert_tuples(conn, Pack, ("id", "size", "n_chunks", "deferred", "created_at", "remote"),
                          sorted((p, pack_rows[p].size, pack_rows[p].n_chunks, False, now, name)
                                 for p in pack_ids if p not in present and p in pack_rows))
            catalog.insert_chunks(s, [loc for loc in fetched.values()
                                      if loc.pack_id in pack_rows or loc.pack_id in present])
            catalog.relocate_chunks(s, [loc for loc in moved if loc.pack_id in pack_rows or loc.pack_id in present],
                                    now)
            unreadable = record_bodies(s, order, sizes)
            if mark_key is not None:
                catalog.record_journal_key(s, mark_key)
            for cid in marked:
                s.execute(update(Commit).where(Commit.id == cid).values(pruned=True))
            for cid, why in {**{c: w for c, w in unreadable.items() if c not in pruned}, **damaged}.items():
                if cid in ids:
                    s.execute(update(Commit).where(Commit.id == cid).values(damage=why))
            out.refs = _update_refs(s, name, heads, now, keep={branch for kind, branch in bad_refs if kind == "branch"})
            index.record_commits(s, name, ids)
            index.record_commits(s, name, heads.values())
            faults.point("fetch.before_commit")
    except BaseException:
        journal.discard(local, mark_key)  # the change did not happen
        raise
    finally:
        lease.release()
    faults.point("fetch.after_commit")
    out.commits, out.pruned, out.new_ids = len(order), len(marked), ids
    out.annotations = notes.fetch(sessions, reading, local, entries)
    return out


def _remote_packs(s: Session, pack_ids: Collection[str]) -> set[str]:
    """Those of ``pack_ids`` that only a remote holds (``packs.remote``)."""
    out: set[str] = set()
    ids = sorted(pack_ids)
    for start in range(0, len(ids), 500):
        out.update(s.scalars(select(Pack.id).where(Pack.id.in_(ids[start : start + 500]), Pack.remote.is_not(None))))
    return out


def _shallower(there: ChunkLocation, here: ChunkLocation) -> bool:
    """Whether a chunk this repository names at ``here`` should be named at the remote's copy
    ``there`` instead: a shallower one (a base the publisher stored again standalone,
    ``ingest.pipeline``), so that the deltas fetched against it keep chains within the bound."""
    return there.depth < here.depth and there.pack_id != here.pack_id


def _update_refs(s: Session, name: str, heads: dict[tuple[str, str], str], now: datetime,
                 keep: set[str]) -> list[RefUpdate]:
    """Set ``name/BRANCH`` for every remote branch (deleting those the remote no longer has, but
    ``keep``: branches whose ref object could not be read) and create the remote's tags that do
    not exist here (a local tag of the same name is kept)."""
    moved: list[RefUpdate] = []
    prefix = f"{name}/"
    mine = {r.name: r for r in s.scalars(select(Ref).where(Ref.kind == "remote", Ref.name.startswith(prefix)))}
    wanted = {f"{prefix}{branch}": cid for (kind, branch), cid in heads.items() if kind == "branch"}
    for ref_name, cid in sorted(wanted.items()):
        old = mine.get(ref_name)
        if old is None:
            s.add(Ref(kind="remote", name=ref_name, commit_id=cid, updated_at=now))
            moved.append(RefUpdate("remote", ref_name, None, cid))
        elif old.commit_id != cid:
            reach = reachable_from(cid)
            ahead = s.scalar(select(reach.c.id).where(reach.c.id == old.commit_id)) is not None
            moved.append(RefUpdate("remote", ref_name, old.commit_id, cid, forced=not ahead))
            old.commit_id, old.updated_at = cid, now
    for ref_name in sorted(mine.keys() - wanted.keys() - {f"{prefix}{b}" for b in keep}):
        moved.append(RefUpdate("remote", ref_name, mine[ref_name].commit_id, None))
        s.execute(delete(Ref).where(Ref.kind == "remote", Ref.name == ref_name))
    tags = {r for r in s.scalars(select(Ref.name).where(Ref.kind == "tag"))}
    for (kind, tag), cid in sorted(heads.items()):
        if kind == "tag" and tag not in tags:
            s.add(Ref(kind="tag", name=tag, commit_id=cid, updated_at=now))
            moved.append(RefUpdate("tag", tag, None, cid))
    s.flush()
    return moved
