"""The read-only half of the ``Repo`` facade (``repository.Repo`` inherits it): revisions, commits,
states and tensors, lineage queries and analysis, refs and totals. Nothing here writes; reads of
tensor-level tables go through ``_reading`` (pending layouts indexed, ``db.pending``), reads of
tensors wait for this process's own pending commits first (read-your-writes). Those that return
no tensor run without torch."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, sessionmaker

from ckptrepo import types as t
from ckptrepo.config import RepoConfig
from ckptrepo.db import catalog, refs, views
from ckptrepo.db.engine import Sessions
from ckptrepo.entries import is_file_entry
from ckptrepo.errors import ForkedProcess, UnknownFile, UnknownRevision, UnknownTensor, UsageError
from ckptrepo.ids import short
from ckptrepo.lineage import analysis, queries, revparse
from ckptrepo.restore.layout import layout_of
from ckptrepo.storage import Backend
from ckptrepo.types import EDGE_KINDS

if TYPE_CHECKING:  # imported where used: reading the lineage needs neither the engine nor numpy
    import torch
    from torch.distributed import ProcessGroup

    from ckptrepo.chunks.store import ChunkReader, OtherCopy
    from ckptrepo.distributed.reader import CommitReader
    from ckptrepo.ingest.writer import CommitWriter
    from ckptrepo.locations import ChunkLocation
    from ckptrepo.restore.follow import Follower
    from ckptrepo.restore.view import CommitView

DEFAULT_BRANCH = refs.DEFAULT_BRANCH


class Reads:
    """What a ``Repo`` answers without writing. It holds no state of its own: ``Repo.__init__``
    sets the fields below; ``Repo`` adds the commit engine and everything that writes."""

    repo_dir: Path
    config: RepoConfig
    _owner: int  # the process that opened the repository
    _closed: bool
    _sessions: sessionmaker[Session]  # the catalog
    _reading: Sessions  # the catalog with pending layouts indexed (db.pending)
    _backend: Backend  # the store
    _pool: ThreadPoolExecutor
    _read_only: str | None  # why writes are refused (None: they are not)

    @functools.cached_property
    def _reader(self) -> ChunkReader:
        """Reads and verifies chunks (delta bases looked up in the catalog)."""
        from ckptrepo.chunks.store import ChunkReader

        return ChunkReader(self._backend, catalog.locator(self._sessions), fallback=self._chunk_fallback)

    def _chunk_fallback(self, loc: ChunkLocation) -> OtherCopy | None:
        """Another copy of a chunk whose own is missing or damaged (``sync.Sync``: a remote's)."""
        return None

    @property
    def read_only(self) -> bool:
        """Whether writes are refused (``open(read_only=True)``, or a repository this process cannot write)."""
        return self._read_only is not None

    @property
    def head(self) -> str:
        """The current branch: what ``commit`` uses when no branch is given (``main`` until
        ``switch``). It may not exist yet; the next commit on it creates it."""
        return refs.read_head(self.repo_dir)

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("this repository is closed", hint="Open it again with Repo.open(path).")
        if os.getpid() != self._owner:  # its threads, connections and pending commits are the parent's
            raise ForkedProcess(what="repository", owner=self._owner, pid=os.getpid())

    # -- reading ---------------------------------------------------------------------------

    def resolve(self, rev: str) -> str:
        """The full id of the commit ``rev`` names (``main~2``, ``run@step=500``, an id prefix...)."""
        self._check_open()
        with self._sessions() as s:
            return revparse.resolve(s, rev)

    def get_commit(self, rev: str) -> t.Commit:
        """The commit ``rev`` names, with parents, metrics and refs."""
        self._check_open()
        with self._sessions() as s:
            found = views.commits_by_id(s, [revparse.resolve(s, rev)])
        if not found:
            raise UnknownRevision(rev=rev)
        return found[0]

    def log(self, rev: str | None = None, *, where: str | None = None, limit: int | None = None,
            offset: int = 0) -> list[t.Commit]:
        """``rev`` and its ancestors (every commit when None), newest first, optionally filtered by
        a ``where`` expression (``"val_loss < 2.1 and step >= 1000"``) and paged."""
        self._check_open()
        return queries.log(self._sessions, rev, where=where, limit=limit, offset=offset)

    def graph(self, rev: str | None = None) -> t.LineageGraph:
        """The lineage graph (every commit, or ``rev`` and its ancestors): nodes with the fields a
        drawing needs, edges and refs (``LineageGraph``), one lean read for thousands of commits."""
        self._check_open()
        return queries.lineage_graph(self._sessions, rev)

    def commits(self, ids: Collection[str]) -> list[t.Commit]:
        """The commits with these full ids, in the order given (unknown ids left out)."""
        self._check_open()
        return queries.commits(self._sessions, list(ids))

    def tensors(self, rev: str) -> list[t.TensorInfo]:
        """Names, layout and ingest statistics of a commit's tensors (no tensor bytes read)."""
        self._check_open()
        with self._reading() as s:
            cid = revparse.resolve(s, rev)
            return [views.tensor_info(e.name, tr) for e, tr in catalog.tensor_layout(s, cid)
                    if not is_file_entry(e.name)]

    def tensor_ids(self, state: Any, *, allow_pickle: bool = False) -> dict[str, str]:
        """Entry name -> the id each tensor of ``state`` would have if committed here by ``commit`` or
        ``commit_file`` (``tensors(rev)`` lists the stored ones), computed by hashing its bytes
        (``ingest.identify``); nothing is read from or written to the repository. Equal ids: equal
        dtype, shape and bytes. A distributed commit may give equal content another id (its shards
        are cut on their own grid): ``holds`` then compares the bytes."""
        from ckptrepo import state as st
        from ckptrepo.ingest.identify import tensor_ids
        from ckptrepo.ingest.sources import from_tensors

        self._check_open()
        return tensor_ids(from_tensors(st.flatten(state, allow_pickle=allow_pickle).tensors), self.config.chunk_size,
                          self._pool)

    def holds(self, rev: str, state: Any, *, allow_pickle: bool = False) -> bool:
        """Whether commit ``rev`` holds the tensors of ``state``: the same entry names, each with the same
        dtype, shape and bytes (the skeleton's other values are not compared); nothing is written.

        Compared by tensor id first (``tensor_ids``). Equal content can have another id: a distributed
        commit cuts each rank's shard on its own grid or stores it as boxes (the id names the layout
        too). So where an id differs while dtype and shape agree, the stored tensor is read and its
        bytes compared (a pickled value's too: it is never unpickled). A pruned
        commit's data is gone: it holds ``state`` only when every id is equal."""
        from ckptrepo import state as st
        from ckptrepo.ingest.identify import tensor_ids
        from ckptrepo.ingest.sources import from_tensors

        self._check_open()
        flat = st.flatten(state, allow_pickle=allow_pickle)
        ids = tensor_ids(from_tensors(flat.tensors), self.config.chunk_size, self._pool)
        commit = self.get_commit(rev)
        stored = {info.name: info for info in self.tensors(commit.id)}
        if stored.keys() != ids.keys():
            return False
        differ = [name for name, tid in ids.items() if stored[name].tensor_id != tid]
        if differ and commit.pruned:
            return False
        for name in differ:  # a pickled value too is compared by its bytes: nothing is unpickled here
            mine, theirs = flat.tensors[name], stored[name]
            if theirs.dtype != st.dtype_name(mine.dtype) or tuple(theirs.shape) != tuple(mine.shape):
                return False
            if st.tensor_bytes(self.load_tensor(commit.id, name)) != st.tensor_bytes(mine):
                return False
        return True

    def checkout(self, rev: str, *, into: Mapping[str, Any] | None = None, part: str | None = None,
                 allow_pickle: bool = False, group: ProcessGroup | None = None, local: bool = False) -> Any:
        """The state committed at ``rev`` (tensors on the CPU, ties restored), every chunk verified;
        with ``part`` (a key path such as ``"model"`` or ``"ranks/1"``) only that value, reading only its
        tensors. With ``into``, also load it into live objects: modules, optimizers and schedulers via
        ``load_state_dict``, tensors in place. An optimizer's state comes back keyed as
        ``load_state_dict`` expects, whether one process or many made the commit. Like ``export``
        and ``load_tensor``, it first waits for this process's pending commits: ``commit(state)``
        then ``checkout("main")`` reads that commit.

        ``into`` without ``part`` is collective when ``commit`` would be (``distributed.scope``: a process
        group of two or more ranks, DTensors, or ``group``): every rank calls it and each reads
        only the chunks of its shards, at any world size and layout (DCP's load; an optimizer
        without state yet gets it first, as ``get_state_dict`` does); returns ``into``.
        ``local=True`` loads in this process alone (not with ``group``, nor into DTensors).
        Without ``into``, or with ``part``, it always runs in this process alone."""
        from ckptrepo import state as st
        from ckptrepo.distributed import keys, scope
        from ckptrepo.restore.tensors import read_state

        if into is not None and part is None:
            group = scope.collective_group(into, group, local=local, what="checkout(into=...)")
            if group is not None:
                from ckptrepo.distributed import native

                native.load(self.dcp_reader(rev, allow_pickle=allow_pickle), scope.unwrapped(into), group=group)
                return into
        restored = keys.int_keys(read_state(self._reader, self._pool, *self._layout(rev), part=part,
                                            allow_pickle=allow_pickle))
        if into is not None:
            st.load_into(scope.unwrapped(into), scope.strip_ddp_prefix(into, restored))
        return restored

    def export(self, rev: str, path: str | Path, *, replace: bool = True, format: str | None = None,
               max_shard_size: int | str = "5GB") -> str:
        """Write the state committed at ``rev`` to ``path`` (``.safetensors``; ``.pt``, ``.pth``, ``.bin``,
        ``.ckpt``: torch.save) atomically, a flat dict of tensors streamed; returns the commit id.
        ``replace=False``: OutputExists when anything is at ``path`` (before reading any chunk, and
        for a file that appears meanwhile); else a file there is replaced (a symbolic link itself).

        ``format``: ``safetensors``, ``torch`` or ``dcp`` whatever the suffix (``formats.write_state``),
        or ``hf``: a Hugging Face model folder at ``path`` (new or empty; ``restore.hf_export``): the
        commit's files and its model weights (``formats.hf_layout.model_keys``) as ``model.safetensors``
        or shards of at most ``max_shard_size`` (``"5GB"``, ``"500MB"`` or bytes) and their index,
        which ``from_pretrained`` loads. UsageError when the commit holds no model weights."""
        from ckptrepo.formats import FORMATS, suffix_format, write_state

        if format == "hf":
            from ckptrepo.formats.hf_layout import parse_size
            from ckptrepo.restore.hf_export import export_hf

            limit = parse_size(max_shard_size)
            cid, skeleton, items = self._layout(rev, files=True)
            export_hf(Path(path), skeleton, items, self._reader, self._pool, commit_id=cid, max_shard_size=limit)
            return cid
        if format is not None and format not in FORMATS:
            raise UsageError(f"cannot write {path}: unknown format {format!r}",
                             hint=f"Use one of {', '.join((*FORMATS, 'hf'))}.")
        if format is not None and format != suffix_format(Path(path)):
            cid = self.resolve(rev)
            write_state(self.checkout(cid), Path(path), format=format, replace=replace)
            return cid
        from ckptrepo.restore.export import export

        cid, skeleton, items = self._layout(rev)
        export(Path(path), skeleton, items, self._reader, self._pool, commit_id=cid,
               checkout=lambda: self.checkout(cid), replace=replace)
        return cid

    def files(self, rev: str) -> dict[str, int]:
        """The files commit ``rev`` keeps beside its state (``commit(files=)``, a model folder's
        config and tokenizer files), relative path -> bytes, by path (no bytes read)."""
        from ckptrepo.entries import file_path

        self._check_open()
        with self._reading() as s:
            cid = revparse.resolve(s, rev)
            return {file_path(e.name): tr.nbytes for e, tr in catalog.tensor_layout(s, cid) if is_file_entry(e.name)}

    def read_file(self, rev: str, path: str) -> bytes:
        """The bytes of file ``path`` of commit ``rev``, every chunk verified against its id
        (IntegrityError rather than other bytes); UnknownFile when the commit keeps no such file."""
        from ckptrepo.chunks.tensors import read_tensors
        from ckptrepo.entries import check_file_path, file_entry

        if not isinstance(path, str) or check_file_path(path) is not None:
            raise UsageError(f"{path!r} cannot name a file of a commit", hint="Name it by its relative path, "
                             "as `ckpt show REV` lists the files.")
        name = file_entry(path)
        cid, _, items = self._layout(rev, [name], files=True)
        if name not in items:
            raise UnknownFile(f"commit {short(cid)} keeps no file {path!r}", commit=short(cid), name=path,
                              hint="`ckpt show REV` lists the files a commit keeps.")
        return bytes(read_tensors(self._reader, self._pool, [(name, *items[name])], commit_id=cid)[name].numpy())

    def view(self, rev: str, *, layout: str = "auto", max_shard_size: int | str = "5GB") -> CommitView:
        """Commit ``rev`` as the files its export would hold, read in place (``restore.view``):
        ``layout`` ``hf`` (its files and the model's weights as safetensors shards and index),
        ``safetensors`` (one ``model.safetensors``) or ``auto`` (``hf`` when it has a
        config.json). ``view.read(name, start, end)`` decodes only the chunks a range needs, verified."""
        from ckptrepo.restore.view import CommitView

        cid, skeleton, items = self._layout(rev, files=True)
        return CommitView(cid, skeleton, items, self._reader, self._pool, layout=layout, max_shard_size=max_shard_size)

    def load_tensor(self, rev: str, name: str) -> torch.Tensor:
        """One tensor of a commit, reading only that tensor's chunks."""
        from ckptrepo.chunks.tensors import read_tensors

        cid, _, items = self._layout(rev, [name])
        if name not in items:
            raise UnknownTensor(commit=short(cid), name=name)
        return read_tensors(self._reader, self._pool, [(name, *items[name])], commit_id=cid)[name]

    def _layout(self, rev: str, names: list[str] | None = None, *,
                files: bool = False) -> tuple[str, Any, dict[str, Any]]:
        """Commit id, skeleton and tensor locations of ``rev`` (its files' entries too with ``files``),
        once this process's pending commits have landed (read-your-writes: ``commit()`` then
        ``checkout("main")`` reads that commit)."""
        self._check_open()
        self._own_commits_landed()
        found = layout_of(self._reading, rev, names, files=files)
        if self._keep({c for row, _ in found[2].values() for c in row.chunk_ids}):
            found = layout_of(self._reading, found[0], names, files=files)  # the chunks' new, local locations
        return found

    def _keep(self, chunk_ids: set[str]) -> bool:
        """Before reading ``chunk_ids``: keep here those only a remote holds (``sync.Sync``);
        True when some were copied."""
        return False

    def _keep_commits(self, revs: Collection[str]) -> None:
        """Before reading the commits ``revs`` through another path (DCP, an exact diff): keep
        here their chunks only a remote holds (``sync.Sync``)."""

    def _own_commits_landed(self) -> None:
        """Wait for this process's pending commits, if it made any (a read-only one makes none)."""
        writer: CommitWriter | None = self.__dict__.get("_writer")
        if writer is not None:
            writer.wait_commits()

    def dcp_reader(self, rev: str, *, allow_pickle: bool = False) -> CommitReader:
        """A ``torch.distributed.checkpoint`` StorageReader over commit ``rev``: ``dcp.load``
        reshards it to any world size (``ckptrepo.dcp.Reader``; ``distributed.reader``)."""
        from ckptrepo.distributed.reader import CommitReader

        self._check_open()
        self._own_commits_landed()
        self._keep_commits([rev])
        return CommitReader(self._reading, self._reader, self._pool, rev, allow_pickle=allow_pickle)

    def follow(self, ref: str, *, into: Any, since: str | None = None, poll: float = 0.05,
               timeout: float | None = None, stop: threading.Event | None = None) -> Follower:
        """An iterator over the new commits of branch ``ref`` (or a remote-tracking ref
        ``REMOTE/BRANCH``, fetched at every poll), each applied to ``into`` in place before it is
        yielded (a ``Commit``): ``into`` is a module, optimizer or state as ``commit`` takes it, whose
        tensors are written in place (the same objects, no reallocation). Only the chunks whose id
        differs from the one held are read, delta payloads decoded against the bytes ``into`` holds,
        every chunk verified before it is written (``restore.follow``). The first commit yielded
        is the ref's head applied in full, or, with ``since`` (a commit ``into`` already holds),
        the head applied from there; a follower that missed commits goes to the head at once.
        ``poll``: seconds between looks at the ref; the iteration ends when ``stop`` is set, on
        ``close()``, or after ``timeout`` seconds without a new commit. ``follower.last``: the
        figures of the latest update (``FollowUpdate``). StateMismatch when a commit's tensors do
        not fit ``into`` (nothing written)."""
        from ckptrepo.restore.follow import Follower

        self._check_open()

        def before_read() -> None:
            self._check_open()
            self._own_commits_landed()

        return Follower(reading=self._reading, backend=self._backend, lookup=catalog.locator(self._sessions),
                        fallback=self._chunk_fallback, pool=self._pool, ref=ref, into=into, since=since, poll=poll,
                        timeout=timeout, stop=stop, refresh=self._follow_refresh(ref), before_read=before_read,
                        commit_of=self.get_commit)

    def _follow_refresh(self, ref: str) -> Callable[[], None] | None:
        """What brings ``ref`` up to date before each look (``sync.Sync``: a fetch for a remote-tracking ref)."""
        return None

    # -- lineage and analysis (read-only; see lineage.queries and lineage.analysis) ---------

    def ancestors(self, rev: str, *, kinds: Collection[str] = EDGE_KINDS, max_depth: int | None = None) -> list[str]:
        """Ids of the commits ``rev`` descends from through edges of ``kinds``, nearest first."""
        self._check_open()
        return queries.ancestors(self._sessions, rev, kinds=kinds, max_depth=max_depth)

    def descendants(self, rev: str, *, kinds: Collection[str] = EDGE_KINDS,
                    max_depth: int | None = None) -> list[str]:
        """Ids of the commits descending from ``rev`` through edges of ``kinds``, nearest first."""
        self._check_open()
        return queries.descendants(self._sessions, rev, kinds=kinds, max_depth=max_depth)

    def path(self, a: str, b: str, *, kinds: Collection[str] = EDGE_KINDS) -> list[str]:
        """A shortest chain of commit ids from ``a`` to ``b`` (down to a common ancestor and up);
        [] when they are unrelated."""
        self._check_open()
        return queries.path(self._sessions, a, b, kinds=kinds)

    def merge_base(self, a: str, b: str, *, kinds: Collection[str] = EDGE_KINDS) -> list[str]:
        """The best common ancestors of ``a`` and ``b`` (several after criss-cross merges)."""
        self._check_open()
        return queries.merge_base(self._sessions, a, b, kinds=kinds)

    def best(self, metric: str, *, maximize: bool = False, branch: str | None = None, subtree: str | None = None,
             limit: int = 1) -> list[t.Commit]:
        """The commits with the lowest (or highest) ``metric``, among a branch's history or a subtree."""
        self._check_open()
        return queries.best(self._sessions, metric, maximize=maximize, branch=branch, subtree=subtree, limit=limit)

    def diff(self, a: str, b: str, *, exact: bool = False) -> t.Diff:
        """Per-tensor differences from ``a`` to ``b`` from stored statistics and shared chunks; with
        ``exact`` also L2 distance, relative change and cosine, reading only the chunks that differ."""
        self._check_open()
        if exact:
            self._keep_commits([a, b])
        return analysis.diff(self._reading, a, b, exact=exact, reader=self._reader if exact else None,
                             pool=self._pool)

    def history(self, name: str, *, along: str = DEFAULT_BRANCH, limit: int | None = None) -> list[t.HistoryPoint]:
        """Statistics of tensor ``name`` and its change from the previous commit along the
        first-parent chain of ``along``, newest first (no tensor bytes read)."""
        self._check_open()
        return analysis.history(self._reading, name, along=along, limit=limit)

    def metrics_along(self, names: Collection[str], *, along: str = DEFAULT_BRANCH,
                      limit: int | None = None) -> list[t.MetricPoint]:
        """The metrics ``names`` of every commit of ``along``'s first-parent chain, newest first."""
        self._check_open()
        return analysis.metrics_along(self._sessions, list(names), along=along, limit=limit)

    def metric_names(self) -> list[str]:
        """Every metric name any commit records, sorted."""
        self._check_open()
        return analysis.metric_names(self._sessions)

    # -- refs and the whole repository -------------------------------------------------------

    def branches(self) -> list[t.RefInfo]:
        """Every branch, by name."""
        self._check_open()
        with self._sessions() as s:
            return refs.listing(s, "branch")

    def tags(self) -> list[t.RefInfo]:
        """Every tag, by name."""
        self._check_open()
        with self._sessions() as s:
            return refs.listing(s, "tag")

    def stats(self) -> t.RepoStats:
        """Counts and sizes of the whole repository (see ``RepoStats``)."""
        self._check_open()
        with self._reading() as s:
            return t.RepoStats(**catalog.totals(s))

    def retention(self) -> t.RetentionRules | None:
        """The stored retention setting (``set_retention``), or None."""
        from ckptrepo.maintenance import setting

        self._check_open()
        with self._sessions() as s:
            return setting.read(s)

    def repack_pending(self) -> tuple[int, int]:
        """``(packs, bytes)`` that commits stored raw and no repack has encoded yet."""
        self._check_open()
        with self._sessions() as s:
            return catalog.awaiting_repack(s)
