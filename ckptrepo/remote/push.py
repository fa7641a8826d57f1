"""Push: send branches and tags, with every commit they reach, to a remote.

Order (``docs/design.md``, "Remotes"): nothing a push uploads is visible on the remote until its
last step, and every step before it is safe to repeat or to abandon:

0. The remote: a store of this repository (its identity, ``ledger.identity``; an empty one is
   claimed and marked a remote, ``remote.refs``), never a working repository's
   (``RemoteNotBare``). A lease is held on it from here to the end (``ledger.leases``).
1. Every ref is checked against the remote's: a branch must fast-forward (the remote's head is
   an ancestor of what is pushed) and a tag must not exist at another commit, unless ``force``.
2. Packs: the chunks the commits to send need (their tensors' and, transitively, the delta bases)
   that the remote does not hold (``remote.index``, refreshed from its footers first), packed
   anew (``remote.transfer``): never whole local packs with other data in them.
3. Manifests of the commits the remote lacks, verbatim; a bundle describing this push's packs and
   manifests in one object (``remote.bundles``; many earlier ones folded in); a journal entry
   with the prune marks of the pruned ones among them; the annotation entries (journal op
   ``annotate``) of every commit the remote will hold that it lacks (``remote.notes``; also when
   no ref moves).
4. Refs, one compare-and-swap each (``remote.refs.swap``), against the version read in step 1: a
   ref that moved meanwhile is refused (``PushRejected``), and what was uploaded for it stays
   invisible (a fetch follows refs only).
5. Here: the remote-tracking refs (``REMOTE/BRANCH``) and the cache of what the remote holds.

Two clones pushing to one remote at once: both may upload the same chunks (harmless: a pack is
named by its content, a manifest by its commit), and each ref lands for one of them only.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from ckptrepo import faults
from ckptrepo.chunks.pack import pack_key
from ckptrepo.config import RepoConfig
from ckptrepo.db import catalog
from ckptrepo.db.engine import Sessions, write_transaction
from ckptrepo.db.models import Chunk, Commit, Pack, Ref
from ckptrepo.db.refs import reachable_from
from ckptrepo.errors import (
    CkptError,
    IntegrityError,
    PushRejected,
    RemoteNotBare,
    ReplicaWaiting,
    StorageError,
    StoreInUse,
)
from ckptrepo.ids import short
from ckptrepo.ledger import identity, journal, manifest
from ckptrepo.ledger.leases import Lease
from ckptrepo.locations import ChunkLocation
from ckptrepo.remote import bundles, index, notes, refs
from ckptrepo.remote.stores import RemoteStore
from ckptrepo.remote.transfer import Meter, closure, copy, copy_whole
from ckptrepo.storage.base import Backend
from ckptrepo.types import RefUpdate

_WRITERS = 16  # manifests in flight
_BATCH = 500
_PACK_OVERHEAD = 128  # header and trailer


@dataclass
class Pushed:
    """What a push did, for ``PushResult``."""

    commits: int = 0
    packs: int = 0
    chunks: int = 0
    annotations: int = 0
    refs: list[RefUpdate] = field(default_factory=list)


@dataclass(frozen=True)
class Target:
    """A ref to push: ``kind`` ``branch`` or ``tag``, its name (the same on the remote) and commit."""

    kind: str
    name: str
    commit_id: str


def prepare(backend: Backend, store: RemoteStore, repo_id: str, config: RepoConfig) -> None:
    """Step 0: refuse a working repository's store or another repository's; claim and mark an
    empty one (``remote.refs``)."""
    if store.working:
        raise RemoteNotBare(url=backend.url)
    owner = identity.read(backend)
    if owner is not None and owner != repo_id:
        raise StoreInUse(url=backend.url, found=owner, expected=repo_id)
    if not refs.is_remote(backend):
        if next(iter(backend.list(manifest.PREFIX)), None) is not None:
            raise RemoteNotBare(url=backend.url)
        identity.claim(backend, repo_id)
        refs.write_marker(backend, repo_id, config)


def _ancestors_of(s: Session, commit_id: str) -> set[str]:
    reach = reachable_from(commit_id)
    return set(s.scalars(select(reach.c.id)))


def _check(s: Session, remote: str, targets: Sequence[Target], current: dict[tuple[str, str], refs.RemoteRef],
           force: bool) -> list[tuple[Target, bool]]:
    """The targets that change the remote, each with whether that is not a fast-forward (only
    with ``force``); PushRejected for one that may not change it (step 1)."""
    todo = []
    for t in targets:
        old = current.get((t.kind, t.name))
        old_id = old.target if old is not None else None
        if old_id == t.commit_id:
            continue
        forced = old_id is not None and (t.kind == "tag" or old_id not in _ancestors_of(s, t.commit_id))
        if forced and not force:
            assert old_id is not None
            if t.kind == "tag":
                raise PushRejected(remote=remote, kind="tag", name=t.name, why=f"it exists at {short(old_id)}")
            raise PushRejected(remote=remote, kind="branch", name=t.name,
                               why=f"it is at {short(old_id)}, which {short(t.commit_id)} does not contain "
                                   "(not a fast-forward)")
        todo.append((t, forced))
    return todo


def _held(s: Session, remote: str, current: dict[tuple[str, str], refs.RemoteRef]) -> set[str]:
    """Commits the remote holds: what this repository recorded it holds, and everything its refs
    reach (a push uploads a ref's commits before it moves the ref, and a remote loses nothing)."""
    held = index.commits_held(s, remote)
    known = {r.target for r in current.values() if r.target is not None}
    for head in sorted(known & _present(s, known)):
        if head not in held:
            held |= _ancestors_of(s, head)
    return held


def _present(s: Session, ids: set[str]) -> set[str]:
    return set(s.scalars(select(Commit.id).where(Commit.id.in_(sorted(ids))))) if ids else set()


def _to_send(s: Session, heads: Sequence[str], held: set[str]) -> list[str]:
    """Every commit ``heads`` reach (all edge kinds) the remote does not hold."""
    found: set[str] = set()
    for head in heads:
        if head in found or head in held:
            continue
        found |= _ancestors_of(s, head)
    return sorted(found - held)


def _chunks_of(reading: Sessions, commit_ids: list[str]) -> set[str]:
    """The chunk ids of every tensor of the commits that are neither pruned nor damaged."""
    wanted: set[str] = set()
    with reading() as s:
        live = []
        for start in range(0, len(commit_ids), _BATCH):
            batch = commit_ids[start : start + _BATCH]
            live += list(s.scalars(select(Commit.id).where(Commit.id.in_(batch), Commit.pruned.is_(False),
                                                           Commit.damage.is_(None))))
        for start in range(0, len(live), 50):
            for chunks in catalog.chunk_lists_of(s, live[start : start + 50]).values():
                wanted.update(chunks)
    return wanted


def _split(reading: Sessions, locs: dict[str, ChunkLocation]) -> tuple[dict[str, list[ChunkLocation]],
                                                                        list[ChunkLocation]]:
    """The chunks to send as whole packs (every chunk row of the pack is to be sent: by pack id)
    and the rest (to pack anew)."""
    by_pack: dict[str, list[ChunkLocation]] = {}
    for loc in locs.values():
        by_pack.setdefault(loc.pack_id, []).append(loc)
    whole: dict[str, list[ChunkLocation]] = {}
    loose: list[ChunkLocation] = []
    with reading() as s:
        for start in range(0, len(by_pack), _BATCH):
            ids = sorted(by_pack)[start : start + _BATCH]
            rows = {pid: n for pid, n in s.execute(select(Chunk.pack_id, func.count()).where(Chunk.pack_id.in_(ids))
                                                    .group_by(Chunk.pack_id))}
            packs = {pid: (n, size) for pid, n, size in s.execute(
                select(Pack.id, Pack.n_chunks, Pack.size).where(Pack.id.in_(ids)))}
            for pid in ids:
                group = by_pack[pid]
                n, size = packs.get(pid, (-1, 0))
                # Whole: every chunk it indexes is to be sent, and its payloads fill it (a
                # write-ahead pack can hold gaps of chunks found stored meanwhile).
                payload = sum(loc.length for loc in group)
                if rows.get(pid) == len(group) == n and size <= payload * 1.05 + _PACK_OVERHEAD + 90 * n:
                    whole[pid] = group
                else:
                    loose.extend(group)
    return whole, loose


def _bundle(sessions: sessionmaker[Session], reading: Sessions, backend: Backend, name: str,
            packs: Sequence[tuple[str, int, list[ChunkLocation]]], sent: Sequence[tuple[str, str, bytes]],
            meter: Meter) -> None:
    """Step 3b: one bundle of the packs and manifests this push stored (``remote.bundles``), with
    the remote's uncovered bundles folded in once there are many."""
    tails = [(pid, size, tail) for pid, size, entries in packs
             if (tail := bundles.tail_of(pid, size, entries)) is not None]
    if not tails and not sent:
        return
    listed = [key for key in backend.list(bundles.PREFIX) if bundles.is_key(key)]
    with reading() as s:
        fold = index.bundles_to_fold(s, name, listed)
    folded, covers = [], []
    for key in fold:
        try:
            folded.append(bundles.read(backend.get(key), key))
            covers.append(key)
        except CkptError:
            continue  # a damaged one stays uncovered: readers report it
    key, size = bundles.write(backend, tails, sent, fold=folded, covers=covers)
    meter.wrote(size)
    with write_transaction(sessions) as s:
        index.record_bundle(s, name, key, covers)


def push(sessions: sessionmaker[Session], reading: Sessions, local: Backend, store: RemoteStore, name: str,
         repo_id: str, config: RepoConfig, targets: Sequence[Target], *, force: bool, meter: Meter,
         refresh: bool = True, waiting: bool = False) -> Pushed:
    """Push ``targets`` to remote ``name`` (``store``) in the order of the module docstring.
    ``refresh``: read the footers of remote packs this repository has not seen first (others'
    pushes); without it (background replication), chunks another writer stored may be sent again.
    ``waiting``: the commits' chunks may be on other nodes' stores (``CKPT_NODE_STORE``), each
    node uploading its own: ReplicaWaiting, before anything is uploaded, while some are neither
    here nor on the remote."""
    backend = store.backend
    prepare(backend, store, repo_id, config)
    out = Pushed()
    lease = Lease(backend, "push")
    lease.take()
    try:
        current = refs.read_all(backend)
        with reading() as s:
            todo = _check(s, name, targets, current, force)
        if not todo:
            _record(sessions, name, [], targets)
            with reading() as s:
                held = _held(s, name, current)
            out.annotations = notes.push(reading, local, backend, held, meter)
            return out
        with reading() as s:
            held = _held(s, name, current)
            send = _to_send(s, [t.commit_id for t, _ in todo], held)
            states: dict[str, tuple[bool, str | None]] = {}
            for start in range(0, len(send), _BATCH):
                states.update((cid, (pruned, damage)) for cid, pruned, damage in s.execute(
                    select(Commit.id, Commit.pruned, Commit.damage).where(Commit.id.in_(send[start : start + _BATCH]))))
        # 2. Packs of the chunks the remote lacks.
        if refresh:
            index.refresh(sessions, backend, name)
        wanted = _chunks_of(reading, send)
        with reading() as s:
            lacking = wanted - index.held(s, name, wanted)
            found = closure(lacking, lambda ids: catalog.chunks_by_id(s, sorted(ids)))
            # A base the remote holds is sent again when the copy here is shallower (a base a
            # commit for followers stored again standalone, ``ingest.pipeline``): chains on the
            # remote stay within the bound the local ones keep.
            there = index.locations(s, name, found.keys() - lacking)
            bases = {c for c, loc in there.items() if loc.depth <= found[c].depth}
            locs = {c: loc for c, loc in found.items() if c not in bases}
        if waiting:  # node-local stores: publish once every node's own upload is on the remote
            elsewhere = sum(1 for loc in locs.values() if not local.exists(pack_key(loc.pack_id)))
            if elsewhere:
                raise ReplicaWaiting(chunks=elsewhere, remote=name)
        whole, loose = _split(reading, locs)
        packs = copy_whole(local, whole, backend, meter) + copy(local, loose, backend, config.pack_target, meter)
        faults.point("push.after_packs")
        with write_transaction(sessions) as s:
            index.record_pushed(s, name, packs)
        out.packs, out.chunks = len(packs), sum(len(e) for _, _, e in packs)
        # 3. Manifests, then the prune marks of those sent.
        def put_manifest(cid: str) -> tuple[str, str, bytes] | None:
            try:
                key = manifest.stored_key(local, cid)
                data = local.get(key)
            except StorageError as exc:
                if states.get(cid, (False, None))[1] is not None:
                    return None  # a damaged commit's manifest is lost here too: its children carry the lineage
                raise IntegrityError(
                    f"commit {short(cid)} has no manifest in this repository's store",
                    hint="Run `ckpt db manifests` to write the missing ones, then push again.") from exc
            backend.put_bytes(key, data)
            meter.wrote(len(data))
            return cid, key, data

        with ThreadPoolExecutor(_WRITERS, thread_name_prefix="ckpt-push") as pool:
            sent = [m for m in pool.map(put_manifest, send) if m is not None]
        _bundle(sessions, reading, backend, name, packs, sent, meter)
        pruned = sorted(cid for cid in send if states.get(cid, (False, None))[0])
        if pruned:
            journal.append(backend, {"op": "prune", "commits": pruned})
        out.commits = len(send)
        out.annotations = notes.push(reading, local, backend, held | set(send), meter)
        faults.point("push.after_manifests")
        # 4. Refs, by compare-and-swap.
        for t, forced in todo:
            old = current.get((t.kind, t.name))
            if not refs.swap(backend, t.kind, t.name, t.commit_id, old, wrote=meter.wrote):
                raise PushRejected(remote=name, kind=t.kind, name=t.name,
                                   why="it moved on the remote meanwhile (another push)",
                                   hint="`ckpt fetch`, then push again; `--force` replaces it. What moved before "
                                        f"it: {', '.join(r.name for r in out.refs) or 'nothing'}.")
            old_id = old.target if old is not None else None
            out.refs.append(RefUpdate(t.kind, t.name, old_id, t.commit_id, forced=forced))
        faults.point("push.after_refs")
    finally:
        lease.release()
    _record(sessions, name, send, [t for t in targets if any(r.name == t.name for r in out.refs)])
    return out


def _record(sessions: sessionmaker[Session], name: str, sent: Sequence[str], targets: Sequence[Target]) -> None:
    """Step 5: what the remote now holds, and its branches as remote-tracking refs."""
    now = datetime.now(timezone.utc)
    with write_transaction(sessions) as s:
        index.record_commits(s, name, [*sent, *(t.commit_id for t in targets)])
        for t in targets:
            if t.kind != "branch":
                continue
            ref_name = f"{name}/{t.name}"
            row = s.get(Ref, ("remote", ref_name))
            if row is None:
                s.add(Ref(kind="remote", name=ref_name, commit_id=t.commit_id, updated_at=now))
            elif row.commit_id != t.commit_id:
                row.commit_id, row.updated_at = t.commit_id, now

