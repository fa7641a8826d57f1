"""The remote half of the ``Repo`` facade (``repository.Repo`` inherits it): remotes, push,
fetch, pull and clone (``ckptrepo.remote``; docs/design.md, "Remotes"). Each call validates its
arguments, opens the remote, delegates, and returns a typed result (``types.PushResult``,
``FetchResult``, ``PullResult``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptrepo import types as t
from ckptrepo.db import catalog, refs
from ckptrepo.db.engine import write_transaction
from ckptrepo.db.models import Ref
from ckptrepo.errors import NotFastForward, UnknownRef, UsageError
from ckptrepo.ids import short
from ckptrepo.lineage import revparse
from ckptrepo.reads import Reads
from ckptrepo.remote import config as remote_config
from ckptrepo.remote import index
from ckptrepo.remote.stores import normalize, open_remote
from ckptrepo.remote.transfer import Meter

if TYPE_CHECKING:
    from sqlalchemy.orm import Session
    from torch.distributed import ProcessGroup
    from typing_extensions import Self, Unpack

    from ckptrepo.chunks.store import OtherCopy
    from ckptrepo.config import RepoConfig
    from ckptrepo.handle import CommitHandle
    from ckptrepo.ingest.writer import WriterOptions
    from ckptrepo.locations import ChunkLocation
    from ckptrepo.remote.replicate import Replicator
    from ckptrepo.remote.stores import RemoteStore

DEFAULT_REMOTE = "origin"
_BACKLOG_FRESH_S = 1.0  # how long a backlog found under the limit lets commits pass unlooked


class Sync(Reads):
    """Remotes and the calls that move commits between this repository and them."""

    fetched: t.FetchResult | None  # the fetch that made a clone (``clone``)
    _replicator: Replicator | None  # the background push to the replica remote (Repo.__init__)
    _stores: dict[str, tuple[str, RemoteStore]]  # open remotes by name, with the URL they were opened at
    _stores_lock: threading.Lock
    _backlog_ok_until: float

    if TYPE_CHECKING:  # Repo's
        def __init__(self, repo_dir: Path, config: RepoConfig, **options: Unpack[WriterOptions]) -> None: ...
        def _check_writable(self, what: str) -> None: ...
        def _settle(self) -> None: ...
        def _own_store(self) -> None: ...
        def close(self) -> None: ...

    def _start_remotes(self) -> None:
        """The open remotes' cache and the replicator (``Repo.__init__``)."""
        self._stores, self._stores_lock = {}, threading.Lock()
        self._backlog_ok_until = 0.0  # until when a backlog under the limit is trusted (``_check_backlog``)
        self._replicator = self._make_replicator()
        if self._read_only is None:
            self._record_replica()

    @classmethod
    def clone(cls, url: str, path: str | Path, *, data: str = "lazy", remote: str = "origin",
              db_url: str | None = None, **options: Unpack[WriterOptions]) -> Self:
        """A new repository at ``path`` holding the lineage of the remote at ``url`` (a folder, a
        repository folder, or ``s3://BUCKET/PREFIX``): every commit its branches and tags reach,
        with ``remote`` (default ``origin``) as its remote, remote-tracking refs, and a local branch
        for the remote's default one (``main``, else the first), which becomes the current branch.
        ``data="lazy"``: tensor bytes are read from the remote at their first read and kept;
        ``"full"``: all downloaded now. The clone has the remote's repository id and settings. The
        fetch that made it is ``repo.fetched``. RepositoryExists when ``path`` holds one;
        UsageError when ``url`` holds no repository. ``db_url``: the clone's database (default its
        SQLite file)."""
        from ckptrepo import folder
        from ckptrepo.config import RepoConfig
        from ckptrepo.remote.clone import settings_of

        if data not in ("lazy", "full"):
            raise UsageError(f"clone data {data!r} is neither 'lazy' nor 'full'")
        remote_config.check_name(remote)
        info, settings = settings_of(url, remote)
        target = folder.repo_dir_of(path).parent
        there = Path(info.url) if "://" not in info.url else None
        if there is not None and (target == there or there in target.parents):
            raise UsageError(f"cannot clone {info.url} into itself ({target})",
                             hint="Give another folder: a clone beside the remote, not inside it.")
        repo_dir = folder.create(path, RepoConfig.of(**settings, db_url=db_url))
        remote_config.add(repo_dir, info)
        repo = cls(repo_dir, RepoConfig.load(repo_dir), **options)
        try:
            repo.fetched = repo.fetch(remote, data=data == "full")
            heads = {r.name.removeprefix(f"{remote}/"): r.commit_id for r in repo._remote_refs(remote)}
            if heads:
                branch = refs.DEFAULT_BRANCH if refs.DEFAULT_BRANCH in heads else sorted(heads)[0]
                repo._fast_forward(branch, None, heads[branch])
                refs.write_head(repo.repo_dir, branch)
        except BaseException:
            repo.close()
            raise
        return repo

    # -- the list of remotes -------------------------------------------------------------------

    @property
    def remotes(self) -> list[t.RemoteInfo]:
        """This repository's remotes, by name (``.ckpt/remotes.json``)."""
        self._check_open()
        return [r for _, r in sorted(remote_config.load(self.repo_dir).items())]

    def add_remote(self, name: str, url: str, *, replicate: bool = False) -> t.RemoteInfo:
        """Add remote ``name`` at ``url`` (a folder, or ``s3://BUCKET/PREFIX[?endpoint_url=...]``);
        nothing is read or written there until a push or fetch. RemoteExists when the name is
        taken; UsageError for a name or URL that cannot be one."""
        self._check_writable("add a remote")
        remote_config.check_name(name)
        info = t.RemoteInfo(name=name, url=normalize(url), replicate=replicate)
        if replicate and self._replicator is not None:
            raise UsageError(f"remote {self._replicator.remote!r} replicates this repository already",
                             hint="One remote replicates: remove it first, or add this one without --replicate.")
        remote_config.add(self.repo_dir, info)
        if replicate:
            self._replicator = self._make_replicator()
            self._record_replica()
        return info

    def remove_remote(self, name: str) -> t.RemoteInfo:
        """Remove remote ``name`` and its remote-tracking refs (nothing on the remote changes);
        UnknownRemote when there is none. A lazy clone's remote cannot be removed while commits
        still need bytes only it holds (``fetch(data=...)`` them first)."""
        self._check_writable("remove a remote")
        remote_config.get(remote_config.load(self.repo_dir), name)  # UnknownRemote
        if self._served_by(name):
            raise UsageError(f"remote {name!r} holds tensor bytes this repository has not fetched",
                             hint=f"Fetch them first (`ckpt fetch {name} --all-data`), then remove it.")
        with write_transaction(self._sessions) as s:
            s.query(Ref).filter(Ref.kind == "remote", Ref.name.startswith(f"{name}/")).delete(
                synchronize_session=False)
            index.forget(s, name)
        if self._replicator is not None and self._replicator.remote == name:
            self._replicator.close()
            self._replicator = None
        info = remote_config.remove(self.repo_dir, name)
        return info

    def _remote_refs(self, name: str) -> list[t.RefInfo]:
        """The remote-tracking refs of remote ``name`` (``name/BRANCH``), by name."""
        with self._sessions() as s:
            return [r for r in refs.listing(s, "remote") if r.name.startswith(f"{name}/")]

    def remote_branches(self) -> list[t.RefInfo]:
        """Every remote-tracking ref (``origin/main``: where the remote's branch was at the last
        fetch or push), by name."""
        self._check_open()
        with self._sessions() as s:
            return refs.listing(s, "remote")

    # -- tiers: background replication ---------------------------------------------------------

    def _replicate_job_commit(self, handle: CommitHandle, group: ProcessGroup) -> None:
        """Replicate a commit of every rank of ``group`` once it lands: by the coordinator; over
        node-local stores every rank uploads its node's packs and the coordinator publishes once
        all are there (``_replicate``)."""
        replicator = self._replicator
        if replicator is None:
            return
        import torch.distributed as dist

        from ckptrepo.remote.tiered import TieredBackend

        coordinator = dist.get_rank(group) == 0
        if coordinator or (isinstance(self._backend, TieredBackend) and self._backend.node_local):
            replicator.publishes = coordinator
            handle.add_done_callback(lambda commit: replicator.after_commit(commit.id))


    def _make_replicator(self) -> Replicator | None:
        """The replicator for the remote marked ``replicate`` (None: there is none, or this
        repository is read-only). At most one remote replicates."""
        from ckptrepo.remote.replicate import Replicator

        chosen = sorted((r for r in remote_config.load(self.repo_dir).values() if r.replicate), key=lambda r: r.name)
        if not chosen or self._read_only is not None:
            return None
        if len(chosen) > 1:  # only an edited remotes.json has two; the repository must still open
            import logging

            logging.getLogger("ckptrepo").warning(
                "remotes %s are all marked to replicate; only %r does (`ckpt remote remove` the others and add them "
                "again without --replicate)", ", ".join(r.name for r in chosen), chosen[0].name)
        name = chosen[0].name
        replicator = Replicator(name, lambda: self._replicate(name), lambda cid: self._remote_holds(name, cid))
        return replicator

    def _record_replica(self) -> None:
        """Keep the database's record of the replica remote (``db.tiers.replica``, which retention
        reads in its own transaction) equal to ``remotes.json``'s."""
        from ckptrepo.db import tiers

        name = self._replicator.remote if self._replicator is not None else None
        with self._sessions() as s:
            recorded = tiers.replica(s)
        if recorded != name:
            with write_transaction(self._sessions) as s:
                tiers.set_replica(s, name)

    def _replicate(self, name: str) -> None:
        """One round of background replication: every branch and tag, without reading the remote's
        other packs first (``remote.push`` ``refresh``). Over a node-local store
        (``CKPT_NODE_STORE``), first this node's own packs the remote lacks, whole; then, by the
        process that publishes (a job's coordinator), the commits, once every node's packs are
        there (``ReplicaWaiting`` until then)."""
        from ckptrepo.remote.tiered import TieredBackend

        backend, replicator = self._backend, self._replicator
        node = isinstance(backend, TieredBackend) and backend.node_local
        if node:
            self._upload_node_packs(name)
            if replicator is not None and not replicator.publishes:
                return
        with self._sessions() as s:
            names = self._all_refs(s)
        if names:
            self._push(name, names, refresh=False, waiting=node)

    def _upload_node_packs(self, name: str) -> int:
        """Upload, whole, the packs of this node's store that rows name and the remote lacks (as
        far as this repository knows); returns how many."""
        from sqlalchemy import select

        from ckptrepo.chunks.pack import read_index
        from ckptrepo.db.models import Pack, RemotePack
        from ckptrepo.remote.index import PACK_KEY, record_pushed
        from ckptrepo.remote.tiered import TieredBackend
        from ckptrepo.remote.transfer import copy_whole

        backend = self._backend
        assert isinstance(backend, TieredBackend)
        here = {m.group(2): (key, size) for key, size in backend.local.list_sized("packs/")
                if (m := PACK_KEY.fullmatch(key)) is not None}
        if not here:
            return 0
        with self._sessions() as s:
            ids = sorted(here)
            named = set(s.scalars(select(Pack.id).where(Pack.id.in_(ids), Pack.remote.is_(None))))
            held = set(s.scalars(select(RemotePack.pack_id).where(RemotePack.remote == name,
                                                                 RemotePack.pack_id.in_(ids))))
        todo = {pid: read_index(backend.local, here[pid][0], pack_id=pid, size=here[pid][1])
                for pid in sorted(named - held)}
        if not todo:
            return 0
        from ckptrepo.remote.push import prepare

        _, store = self._remote(name)
        prepare(store.backend, store, self._repo_id(), self.config)
        packs = copy_whole(backend.local, todo, store.backend, Meter())
        with write_transaction(self._sessions) as s:
            record_pushed(s, name, packs)
        return len(packs)

    def _remote_holds(self, name: str, commit_id: str) -> bool:
        from ckptrepo.db import tiers

        with self._sessions() as s:
            return tiers.holds(s, name, commit_id) if commit_id else True

    @property
    def replica(self) -> str | None:
        """The remote commits replicate to in the background (None: none does)."""
        return self._replicator.remote if self._replicator is not None else None

    def wait_replicated(self, rev: str | None = None, *, timeout: float | None = None) -> str:
        """Block until the replica remote holds commit ``rev`` (default: the current branch's head);
        returns its id. After ``timeout`` seconds, the last replication error is raised (the
        remote unreachable: the commit stays on the local tier and is pushed when it is back).
        UsageError when no remote replicates."""
        self._check_open()
        replicator = self._replicator
        if replicator is None:
            raise UsageError("no remote replicates this repository",
                             hint="`ckpt remote add NAME URL --replicate`, or Repo.init(..., replicate_to=URL).")
        self._own_commits_landed()
        cid = self.resolve(rev if rev is not None else self.head)
        replicator.wait(cid, timeout)
        return cid

    def replication(self) -> t.ReplicationStatus | None:
        """The replication backlog and each branch's recovery point (``types.ReplicationStatus``),
        or None when no remote replicates."""
        from ckptrepo.db import tiers

        self._check_open()
        replicator = self._replicator
        if replicator is None:
            return None
        with self._reading() as s:
            commits, nbytes = tiers.backlog(s, replicator.remote)
            points = tiers.recovery_points(s, replicator.remote)
        error = replicator.last_error
        return t.ReplicationStatus(remote=replicator.remote, backlog_commits=commits, backlog_bytes=nbytes,
                                   points=tuple(points), last_error=None if error is None else str(error))

    def _check_backlog(self) -> None:
        """Refuse a commit while the backlog exceeds ``CKPT_REPLICATION_BACKLOG`` (nonzero). On the
        caller's thread: a backlog found under the limit is trusted for ``_BACKLOG_FRESH_S`` (one
        walk of the lineage per second at most, not one per commit); one over it is looked at
        again at every commit."""
        from ckptrepo import knobs
        from ckptrepo.db import tiers
        from ckptrepo.errors import ReplicationBacklog

        replicator = self._replicator
        limit = knobs.get_int("REPLICATION_BACKLOG")
        if replicator is None or limit <= 0 or time.monotonic() < self._backlog_ok_until:
            return
        with self._sessions() as s:
            commits, nbytes = tiers.backlog(s, replicator.remote)
        if nbytes <= limit:
            self._backlog_ok_until = time.monotonic() + _BACKLOG_FRESH_S
        else:
            replicator.kick()
            raise ReplicationBacklog(commits=commits, nbytes=nbytes, remote=replicator.remote, limit=limit)

    def _served_by(self, name: str) -> bool:
        """Whether chunks this repository records are in remote ``name``'s packs only."""
        from sqlalchemy import exists, select

        from ckptrepo.db.models import Chunk, Pack

        with self._sessions() as s:
            return bool(s.scalar(select(exists().where(Pack.remote == name, Chunk.pack_id == Pack.id))))

    def _remote(self, name: str | None) -> tuple[t.RemoteInfo, RemoteStore]:
        """Remote ``name`` (default: ``origin``, or the only one) and its store, opened once per
        ``Repo`` (an S3 client costs a tenth of a second to make) and kept until ``close``."""
        remotes = remote_config.load(self.repo_dir)
        if name is None:
            name = DEFAULT_REMOTE if DEFAULT_REMOTE in remotes or len(remotes) != 1 else next(iter(remotes))
        info = remote_config.get(remotes, name)
        with self._stores_lock:
            cached = self._stores.get(info.name)
            if cached is None or cached[0] != info.url:
                if cached is not None:
                    cached[1].close()
                cached = self._stores[info.name] = (info.url, open_remote(info.url))
        return info, cached[1]

    def _close_remotes(self) -> None:
        """Release the remotes' stores (``Repo.close``)."""
        with self._stores_lock:
            stores, self._stores = list(self._stores.values()), {}
        for _, store in stores:
            store.close()

    def _fast_forward(self, branch: str, old: str | None, new: str) -> None:
        """Move ``branch`` from ``old`` to ``new`` (a pull), journalled; RefConflict when it moved
        meanwhile."""
        from datetime import datetime, timezone

        from ckptrepo.errors import RefConflict
        from ckptrepo.ledger import journal

        self._check_writable("move a branch")
        self._own_store()
        with journal.entry(self._backend, {"op": "ref", "kind": "branch", "name": branch, "to": new,
                                           "from": old}) as key, write_transaction(self._sessions) as s:
            catalog.record_journal_key(s, key)
            actual = refs.move_branch(s, branch, new, old, datetime.now(timezone.utc))
            if actual is not None:
                raise RefConflict(branch=branch, actual=actual[:10] or "deleted", expected=(old or "absent")[:10])

    def _repo_id(self) -> str:
        """This repository's id (its database's; the settings' for one made before)."""
        from ckptrepo.db.models import RepoMeta

        with self._sessions() as s:
            found = s.get(RepoMeta, "repo_id")
        return found.value if found is not None else self.config.repo_id

    # -- moving commits ------------------------------------------------------------------------

    def push(self, remote: str | None = None, refs_: Sequence[str] | None = None, *, all: bool = False,
             force: bool = False) -> t.PushResult:
        """Send branches and tags (``refs_``: names; default the current branch; ``all``: every
        branch and tag) with every commit they reach to ``remote`` (default ``origin``, or the only
        remote). Uploads only the chunks the remote lacks, packed anew, then the manifests, then
        moves each remote ref by compare-and-swap (``remote.push``). PushRejected when a branch
        would not fast-forward or moved on the remote meanwhile (``force``: replace it anyway);
        RemoteNotBare for a working repository's store."""
        self._check_writable("push")
        self._settle()
        with self._sessions() as s:
            if all:
                names = self._all_refs(s)
            else:
                names = []
                for ref in refs_ or [self.head]:
                    row = s.get(Ref, ("branch", ref)) or s.get(Ref, ("tag", ref))
                    if row is None:
                        raise UnknownRef(kind="branch or tag", name=ref)
                    names.append((row.kind, row.name, row.commit_id))
        return self._push(remote, names, force=force)

    @staticmethod
    def _all_refs(s: Session) -> list[tuple[str, str, str]]:
        return [(kind, r.name, r.commit_id) for kind in ("branch", "tag") for r in refs.listing(s, kind)
                if not r.name.startswith("conflicts/")]

    def _push(self, remote: str | None, names: Sequence[tuple[str, str, str]], *, force: bool = False,
              refresh: bool = True, waiting: bool = False) -> t.PushResult:
        from ckptrepo.remote.push import Target, push

        targets = [Target(kind, name, cid) for kind, name, cid in names]
        info, store = self._remote(remote)
        started, meter = time.perf_counter(), Meter()
        done = push(self._sessions, self._reading, self._backend, store, info.name, self._repo_id(),
                    self.config, targets, force=force, meter=meter, refresh=refresh, waiting=waiting)
        return t.PushResult(remote=info.name, commits=done.commits, packs=done.packs, chunks=done.chunks,
                            bytes_uploaded=meter.bytes_written, refs=tuple(done.refs),
                            seconds=time.perf_counter() - started, annotations=done.annotations)

    def fetch(self, remote: str | None = None, *, data: Sequence[str] | bool = False) -> t.FetchResult:
        """Bring the commits of ``remote``'s branches and tags that this repository lacks (their
        manifests, checked) and set remote-tracking refs ``REMOTE/BRANCH`` (``remote.fetch``);
        tensor bytes stay on the remote until first read (then they are kept here), unless
        ``data`` names revisions whose bytes to download now (``True``: every commit's)."""
        from ckptrepo.remote.fetch import fetch

        self._check_writable("fetch")
        self._settle()
        info, store = self._remote(remote)
        started, meter = time.perf_counter(), Meter()
        done = fetch(self._sessions, self._reading, self._backend, store, info.name, self._repo_id(), meter)
        self._keep_relocated(done.relocated_here, meter)
        chunks = self._keep_revs(None if data is True else list(data), meter) if data else 0
        return t.FetchResult(remote=info.name, commits=done.commits, packs_indexed=done.packs_indexed,
                             bytes_downloaded=meter.bytes_read, refs=tuple(done.refs), pruned=done.pruned,
                             data_chunks=chunks, data_bytes=meter.bytes_written,
                             seconds=time.perf_counter() - started, skipped=tuple(done.problems),
                             annotations=done.annotations)

    def pull(self, remote: str | None = None, branch: str | None = None) -> t.PullResult:
        """``fetch``, then fast-forward ``branch`` (default: the current one) to ``REMOTE/BRANCH``.
        NotFastForward when the two have diverged (the branch is not moved)."""
        got = self.fetch(remote)
        branch = branch or self.head
        upstream = f"{got.remote}/{branch}"
        with self._sessions() as s:
            theirs = s.get(Ref, ("remote", upstream))
            if theirs is None:
                raise UnknownRef(kind="remote-tracking ref", name=upstream)
            mine = refs.branch_head(s, branch)
            target = theirs.commit_id
            if mine is not None and mine != target:
                if mine in set(self.ancestors(target)):
                    pass
                elif target in set(self.ancestors(mine)):
                    return t.PullResult(fetch=got, branch=branch, old=mine, new=mine)
                else:
                    raise NotFastForward(branch=branch, local=short(mine), upstream=upstream, remote=short(target))
        if mine != target:
            self._fast_forward(branch, mine, target)
        return t.PullResult(fetch=got, branch=branch, old=mine, new=target)

    def _keep_relocated(self, chunk_ids: Collection[str], meter: Meter) -> None:
        """Chunks this store held whose rows a fetch moved to the remote's shallower copies
        (``remote.fetch``): copied here again, so that what was local stays local."""
        from ckptrepo.remote.localize import localize
        from ckptrepo.remote.tiered import TieredBackend

        if chunk_ids and isinstance(self._backend, TieredBackend) and self._backend.remote_names():
            localize(self._sessions, self._reading, self._backend, set(chunk_ids), self.config.pack_target, meter)

    def _keep_revs(self, revs: Sequence[str] | None, meter: Meter) -> int:
        """Download the tensor bytes of ``revs`` (None: of every commit) that only a remote holds."""
        from ckptrepo.remote.localize import localize
        from ckptrepo.remote.tiered import TieredBackend

        if not isinstance(self._backend, TieredBackend) or not self._backend.remote_names():
            return 0
        wanted: set[str] = set()
        from sqlalchemy import select

        from ckptrepo.db.models import Commit

        with self._reading() as s:
            ids = [revparse.resolve(s, rev) for rev in revs] if revs is not None else list(s.scalars(
                select(Commit.id).where(Commit.pruned.is_(False), Commit.damage.is_(None))))
            for start in range(0, len(ids), 50):
                for lists in catalog.chunk_lists_of(s, ids[start : start + 50]).values():
                    wanted.update(lists)
        return localize(self._sessions, self._reading, self._backend, wanted, self.config.pack_target, meter)

    def _chunk_fallback(self, loc: ChunkLocation) -> OtherCopy | None:
        """A remote's copy of chunk ``loc`` (the first remote that holds one), for a read whose
        own copy is missing or damaged: a replica restores what the local tier lost."""
        from ckptrepo.remote.tiered import RemoteCopy, TieredBackend

        backend = self._backend
        if not isinstance(backend, TieredBackend) or not backend.remote_names():
            return None
        with self._sessions() as s:
            holders = [name for name in backend.remote_names() if index.held(s, name, [loc.chunk_id])]
        if not holders:
            return None
        name = holders[0]

        def lookup(ids: Collection[str]) -> dict[str, ChunkLocation]:
            with self._sessions() as s:
                return index.locations(s, name, ids)

        return RemoteCopy(backend.remote_store(name), lookup)

    def _keep_commits(self, revs: Collection[str]) -> None:
        from ckptrepo.remote.tiered import TieredBackend

        if not isinstance(self._backend, TieredBackend) or self._read_only is not None \
                or not self._backend.remote_names():
            return
        wanted: set[str] = set()
        with self._reading() as s:
            ids = [revparse.resolve(s, rev) for rev in revs]
            for lists in catalog.chunk_lists_of(s, ids).values():
                wanted.update(lists)
        self._keep(wanted)

    def _keep(self, chunk_ids: set[str]) -> bool:
        """Before a read: keep here the chunks of ``chunk_ids`` only a remote holds (a lazy clone
        that may write; a read-only one reads them through the remote); True when some were."""
        from ckptrepo.remote.localize import localize
        from ckptrepo.remote.tiered import TieredBackend

        if isinstance(self._backend, TieredBackend) and self._read_only is None and chunk_ids \
                and self._backend.remote_names():
            return localize(self._sessions, self._reading, self._backend, chunk_ids, self.config.pack_target,
                            Meter()) > 0
        return False


    def _follow_refresh(self, ref: str) -> Callable[[], None] | None:
        """A remote-tracking ref ``REMOTE/BRANCH`` (no local branch of that name) is fetched before
        each look of a follower (``Reads.follow``); a lazy clone then reads the changed chunks'
        payloads from the remote as it applies them, without keeping them here."""
        remote, sep, _ = ref.partition("/")
        if not sep or remote not in remote_config.load(self.repo_dir):
            return None
        with self._sessions() as s:
            if refs.branch_head(s, ref) is not None:
                return None
        return lambda: self._fetch_refs(remote)

    def _fetch_refs(self, remote: str) -> None:
        """The commits and refs of ``remote`` (``fetch`` without results or data)."""
        from ckptrepo.remote.fetch import fetch

        self._check_writable("fetch")
        info, store = self._remote(remote)
        meter = Meter()
        done = fetch(self._sessions, self._reading, self._backend, store, info.name, self._repo_id(), meter)
        self._keep_relocated(done.relocated_here, meter)

def remote_packs_of(repo_dir: Path) -> tuple[list[Any], list[str]]:
    """The packs of the repository's remotes, for a rebuild (``maintenance.rebuild``): a lazy
    clone's commits read their bytes there. A remote that cannot be read is reported."""
    from ckptrepo.errors import CkptError
    from ckptrepo.remote import config as remote_config
    from ckptrepo.remote.index import scan_remote
    from ckptrepo.remote.stores import open_remote

    packs: list[Any] = []
    problems: list[str] = []
    for info in sorted(remote_config.load(repo_dir).values(), key=lambda r: (not r.lazy, r.name)):
        try:
            store = open_remote(info.url)
            try:
                got, why = scan_remote(store.backend, info.name)
            finally:
                store.close()
        except CkptError as exc:
            problems.append(f"remote {info.name}: {exc}")
            continue
        packs += got
        problems += why
    return packs, problems
