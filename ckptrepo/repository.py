"""The ``Repo`` facade: validates arguments, resolves revisions and delegates to the commit engine
(``ingest.writer``), the catalog (``db``), ``restore``, ``lineage``, ``distributed`` and ``maintenance``.
Every method opens its own short session (a ``Repo`` may be shared between threads); those that
return no tensor run without torch. The folder's layout: ``folder``. What reads without writing
(commits, states, lineage queries, analysis, refs) is ``reads.Reads``, which ``Repo`` inherits;
here: opening and closing, commits, ref changes and maintenance."""

from __future__ import annotations

import contextlib
import functools
import os
import time
import warnings
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from ckptrepo import folder, knobs
from ckptrepo import types as t
from ckptrepo.config import RepoConfig
from ckptrepo.db import catalog, migrate, pending, refs
from ckptrepo.db.engine import Sessions, database_url, make_engine, session_factory, write_transaction
from ckptrepo.db.models import RepoMeta
from ckptrepo.db.readcopy import IndexedCopy
from ckptrepo.errors import (
    CurrentBranch,
    ReadOnlyRepository,
    UnknownRef,
    UsageError,
    did_you_mean,
)
from ckptrepo.exploring import Exploring
from ckptrepo.handle import CommitHandle
from ckptrepo.ingest.request import prepare
from ckptrepo.ledger import identity, journal
from ckptrepo.lineage import revparse
from ckptrepo.maintenance import DEFAULT_GRACE_S
from ckptrepo.maintenance.autoprune import AutoRetention
from ckptrepo.remote import config as remote_config
from ckptrepo.remote.stores import normalize
from ckptrepo.remote.tiered import over_remotes
from ckptrepo.storage import open_backend
from ckptrepo.sync import DEFAULT_REMOTE, remote_packs_of

if TYPE_CHECKING:  # imported where used: reading the lineage needs neither the engine nor numpy
    from torch.distributed import ProcessGroup
    from typing_extensions import Unpack

    from ckptrepo.distributed.writer import ShareWriter
    from ckptrepo.ingest.request import CommitMeta
    from ckptrepo.ingest.writer import CommitWriter, WriterOptions

DEFAULT_BRANCH = refs.DEFAULT_BRANCH


class Repo(Exploring):
    """A checkpoint repository. Use ``Repo.init`` / ``Repo.open`` / ``Repo.discover``, whose
    ``options`` tune commits (``ingest.writer.WriterOptions``: ``max_inflight``, ``staging_budget``,
    ``background_priority``, ``idle_repack``). ``close()`` (or leaving a ``with`` block) waits for
    pending commits and releases the database engine, the store and the worker threads.

    Read-only (``read_only=True``, or a repository this process cannot write: ``folder.write_refusal``):
    every call that would write raises ReadOnlyRepository before it changes anything, and reads
    write nothing (the database opened read-only, ``db.engine``; pending layouts read from a
    private copy, ``db.readcopy``); ``options`` are not used.
    """

    def __init__(self, repo_dir: Path, config: RepoConfig, *, check_schema: bool = True, read_only: bool = False,
                 **writer_options: Unpack[WriterOptions]) -> None:
        self.repo_dir, self.config = repo_dir, config
        self.fetched: t.FetchResult | None = None  # the fetch that made a clone (``clone``)
        self._owner = os.getpid()
        self._closed = False
        self._writer_options = writer_options
        # Why writes are refused (None: they are not); decided once, before the database is opened.
        self._read_only = "opened read-only" if read_only else folder.write_refusal(repo_dir, config)
        self._engine = make_engine(database_url(config.db_url, repo_dir), read_only=self._read_only is not None)
        try:
            if check_schema:
                migrate.check_schema(self._engine)
            node = knobs.get_str("NODE_STORE") if self._read_only is None else None
            self._backend = over_remotes(open_backend(config.store_url, repo_dir / "store"), repo_dir,
                                         Path(node) if node else None)
        except BaseException:
            self._engine.dispose()
            raise
        self._sessions = session_factory(self._engine)
        # Reads of tensor-level tables see no pending layout (db.pending: SQLite only), indexed in
        # the database, or in a private copy of one that is not to be written.
        self._copies = IndexedCopy(self._engine, self._sessions) if (
            self._read_only is not None and self._engine.dialect.name == "sqlite") else None
        self._reading: Sessions = self._copies.reading if self._copies is not None else functools.partial(
            pending.reading, self._sessions, defers=self._engine.dialect.name == "sqlite")
        self._retention = AutoRetention(self._sessions, self._reading, self._backend)  # the setting, after commits
        self._pool = ThreadPoolExecutor(max_workers=knobs.workers(), thread_name_prefix="ckpt")
        self._start_remotes()
        if writer_options and self._read_only is None:
            self._writer.check_usable()  # options are checked now, not at the first commit

    @functools.cached_property
    def _writer(self) -> CommitWriter:
        """The commit engine, made by the first call that writes."""
        from ckptrepo.ingest.writer import CommitWriter

        self._check_writable("commit")
        self._own_store()
        return CommitWriter(self._sessions, self._backend, self._reader, self.config, self._pool,
                            defers_layouts=self._engine.dialect.name == "sqlite",
                            after_commit=self._after_commit, **self._writer_options)

    def _after_commit(self, commit_id: str) -> None:
        """The commit engine's hook once a commit is visible: retention, then replication (each
        only queues work on a thread of its own)."""
        self._retention.after_commit(commit_id)
        if self._replicator is not None:
            self._replicator.after_commit(commit_id)

    @classmethod
    def init(cls, path: str | Path = ".", *, db_url: str | None = None, store_url: str | None = None,
             chunk_size: int | None = None, compression: bool = True, delta: bool = True,
             max_delta_depth: int | None = None, delta_base: str = "root", pack_target: int | None = None,
             encode: str = "auto", replicate_to: str | None = None, **options: Unpack[WriterOptions]) -> Repo:
        """Create a repository in ``PATH/.ckpt`` (or at ``path`` if it is named ``.ckpt``) and open it.

        Settings: see ``config.RepoConfig``; ``options`` as for ``open``. ``replicate_to``: a remote
        URL (``origin``) every commit is pushed to in the background (``add_remote``). Nothing is
        changed if one exists already (RepositoryExists); a failed init leaves no folder that looks
        like one.
        """
        config = RepoConfig.of(db_url=db_url, store_url=store_url, chunk_size=chunk_size, compression=compression,
                               delta=delta, max_delta_depth=max_delta_depth, delta_base=delta_base,
                               pack_target=pack_target, encode=encode)
        repo_dir = folder.create(path, config)
        if replicate_to is not None:
            remote_config.add(repo_dir, t.RemoteInfo(name=DEFAULT_REMOTE, url=normalize(replicate_to), replicate=True))
        return cls(repo_dir, config, **options)

    @classmethod
    def open(cls, path: str | Path = ".", *, search_parents: bool = False, read_only: bool = False,
             **options: Unpack[WriterOptions]) -> Repo:
        """Open the repository at ``path`` (the folder holding ``.ckpt``, or ``.ckpt`` itself), or
        with ``search_parents`` the nearest one at or above it, like git. ``read_only``: refuse
        every write (as on read-only media, which opens read-only by itself) and write nothing."""
        repo_dir = folder.find_repo(path, search_parents=search_parents)
        return cls(repo_dir, RepoConfig.load(repo_dir), read_only=read_only, **options)

    @classmethod
    def discover(cls, start: str | Path = ".", *, read_only: bool = False, **options: Unpack[WriterOptions]) -> Repo:
        """``open(start, search_parents=True)``."""
        return cls.open(start, search_parents=True, read_only=read_only, **options)

    @classmethod
    def rebuild_database(cls, path: str | Path = ".", *, replace: bool = False) -> t.RebuildReport:
        """Recreate the database of the repository at ``path`` from its store alone: packs, commit
        manifests and the journal (``maintenance.rebuild``), in one transaction. RepositoryExists
        when the database holds a repository, unless ``replace`` (a SQLite file is kept beside the
        new one). Run it while no other process uses the repository."""
        from ckptrepo.maintenance.rebuild import rebuild

        repo_dir = folder.find_repo(path)
        config = RepoConfig.load(repo_dir)
        folder.check_writable(repo_dir, config, "rebuild the database")
        backend = open_backend(config.store_url, repo_dir / "store")
        try:
            return rebuild(repo_dir, config, backend, replace=replace,
                           remote_packs=lambda: remote_packs_of(repo_dir))
        finally:
            backend.close()

    def __enter__(self) -> Repo:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Wait for pending commits (their failures stay on their handles) and release everything;
        further calls fail (in a forked child: only mark it closed, the rest is the parent's)."""
        if self._closed:
            return
        self._closed = True
        writer: CommitWriter | None = self.__dict__.get("_writer")
        if writer is not None:
            writer.close()  # in a forked child: only forgets the parent's commits and threads
        if os.getpid() != self._owner:
            self._engine.dispose(close=False)  # the connections stay the parent's, unclosed
            return
        self._retention.close()  # after the writer: the last commit's run has been queued
        if self._replicator is not None:
            self._replicator.close()
        self._close_remotes()
        self._pool.shutdown(wait=True)
        if self._copies is not None:
            self._copies.close()
        self._backend.close()
        self._engine.dispose()

    def __repr__(self) -> str:
        return f"Repo({str(self.repo_dir)!r})"

    def _settle(self) -> None:
        """Check open, then wait for this repository's pending commits, background repack and
        retention run."""
        self._check_open()
        if "_writer" in self.__dict__:
            self._writer.settle()
        self._retention.wait()

    def _own_store(self) -> None:
        """Refuse (StoreInUse) a store that belongs to another repository, once per process
        (``ledger.identity``); a store made before identities is claimed for this one."""
        if self.__dict__.get("_store_owned"):
            return
        with self._sessions() as s:
            meta = {k: v for k, v in s.execute(select(RepoMeta.key, RepoMeta.value).where(
                RepoMeta.key.in_(("repo_id", identity.CLAIMED))))}
        identity.check(self._backend, meta.get("repo_id") or self.config.repo_id)
        if identity.CLAIMED not in meta:  # a store claimed now (made before identities): its loss is damage from here
            with write_transaction(self._sessions) as s:
                s.merge(RepoMeta(key=identity.CLAIMED, value="1"))
        self._store_owned = True

    def _check_writable(self, what: str) -> None:
        """ReadOnlyRepository (``what``: the refused action) when this repository is read-only."""
        self._check_open()
        if self._read_only is not None:
            raise ReadOnlyRepository(what=what, path=str(self.repo_dir), why=self._read_only)

    # -- committing ------------------------------------------------------------------------

    def reserve(self, state: Any, *, allow_pickle: bool = False) -> int:
        """Map the staging memory for commits of states laid out like ``state`` now, not inside the
        first ``commit()`` (call it after the first optimizer step); returns its staged bytes."""
        from ckptrepo import state as st

        self._check_writable("commit")
        return self._writer.reserve(st.flatten(state, allow_pickle=allow_pickle).tensors)

    def commit(self, state: Any, *, branch: str | None = None, message: str | None = None, step: int | None = None,
               epoch: int | None = None, metrics: Mapping[str, float] | None = None, config: Any = None,
               parents: list[str] | None = None, transfer_from: Any = None, allow_pickle: bool = False,
               code_version: str | None = None, blocking: bool = False, group: ProcessGroup | None = None,
               local: bool = False, wait_remote: bool = False,
               files: Mapping[str, bytes | str | os.PathLike[str]] | None = None) -> CommitHandle:
        """Store ``state`` as a new commit on ``branch`` (default: the current branch, ``head``); two-phase.

        Phase 1, on the caller's thread: validate the state and every argument (UnsupportedState
        names the offending key path) and copy every tensor into a reused staging slot; then the
        caller may mutate the state again. Phase 2, in the background, in call order: resolve
        parents (default: the branch head; two or more make a merge), hash, deduplicate, write
        durable packs, then one transaction makes the commit visible and moves the branch by
        compare-and-swap (RefConflict if another writer moved it). ``transfer_from``: a revision,
        or ``(rev, {dst: src})``, the commit this state was initialised from. ``handle.wait()``
        returns the commit or re-raises; ``blocking=True`` returns once durable.

        In a distributed job it is collective (``distributed.scope``): under an initialised process group
        of two or more ranks (DDP, FSDP2, DTensors or plain tensors alike), for a state holding
        DTensors, or with ``group``, every rank of that group (default: the default group) calls
        it with its own state and one commit of all ranks' state is made, the same on every
        rank's handle (each rank writes its share: its shards, a part of the replicated tensors).
        ``local=True``: this process alone commits its state, as without a process group (one
        rank committing on purpose; not with ``group``, nor for DTensors). A rank that calls a
        collective commit alone waits ``CKPT_DIST_TIMEOUT`` for the others, then raises
        RankFailed. A ``DistributedDataParallel`` is stored as the module it wraps (no ``module.``
        in the names), so the commit loads into a plain, a DDP or an FSDP2 model alike.

        With a remote that replicates (``add_remote(..., replicate=True)``), the commit is pushed
        there in the background once durable here; ``wait_remote=True`` returns only once the
        remote holds it (``wait_replicated``). ReplicationBacklog, before anything is written, when
        more than ``CKPT_REPLICATION_BACKLOG`` bytes wait to reach the remote.

        ``files``: files the commit keeps beside the state (``{relative path: bytes or a path to
        read}``: a model's config.json, tokenizer files, model card), checked whole first
        (``formats.files``: names, ``CKPT_MAX_FILE_BYTES``) and read as bytes, never run;
        ``files()`` lists them, ``read_file`` reads one, ``export(format="hf")`` writes them out.
        Not in a collective commit.
        """
        from ckptrepo.distributed import scope

        entered = time.perf_counter()
        self._check_writable("commit")
        self._check_backlog()
        group = scope.collective_group(state, group, local=local, what="commit()")
        kept = None
        if files:
            from ckptrepo.formats.files import file_tensors

            if group is not None:
                raise UsageError("files= is for a commit of one process",
                                 hint="Commit the files from one rank with local=True, or leave them out.")
            kept = file_tensors(files)
        meta: CommitMeta = {"message": message, "step": step, "epoch": epoch, "metrics": metrics, "config": config,
                            "parents": parents, "transfer_from": transfer_from, "code_version": code_version}
        if group is None:
            handle = self._writer.commit_state(scope.unwrapped(state), meta, branch=branch or self.head,
                                               blocking=blocking, allow_pickle=allow_pickle, entered=entered,
                                               files=kept)
        else:
            from ckptrepo.distributed import native

            fields = self._writer.collective_fields(meta, branch=branch or self.head)
            handle = native.commit(self._writer, scope.unwrapped(state), fields, group=group, blocking=blocking,
                                   entered=entered, allow_pickle=allow_pickle)
            self._replicate_job_commit(handle, group)
        self._retention.track(handle)
        if wait_remote:
            self.wait_replicated(handle.wait().id)
        return handle

    def commit_file(self, path: str | Path, *, branch: str | None = None, allow_pickle: bool = False,
                    allow_code: bool = False, **meta: Unpack[CommitMeta]) -> t.Commit:
        """Commit a checkpoint file or folder (``formats.read_state``; ``meta`` as for ``commit``,
        else what the run recorded: ``formats.fill_run_meta``), validated whole first; a plain
        safetensors file is read whole and committed as bytes, without torch. Returns the commit.

        A model folder's other files are kept too (``formats.files.hf_folder_files``: config,
        tokenizer, model card, subfolders; not hidden ones, pickles or the weights read), code
        files (``*.py`` ...) only with ``allow_code``: without it they are left out with a
        warning naming them."""
        from ckptrepo.formats import ReadBuffer, fill_run_meta, read_state
        from ckptrepo.formats.files import hf_folder_files, skipped_note
        from ckptrepo.ingest.sources import from_safetensors

        entered = time.perf_counter()
        self._check_writable("commit")
        with contextlib.closing(ReadBuffer()) as buffer:
            found = from_safetensors(Path(path), buffer)  # a plain file: nothing recorded beside it
            if found is not None:
                return self._writer.commit_sources(*found, meta, branch=branch or self.head, entered=entered)
        folder_files = hf_folder_files(Path(path), allow_code=allow_code) if Path(path).is_dir() else None
        state = read_state(Path(path), mapped=True, allow_pickle=allow_pickle)
        meta = fill_run_meta(meta, Path(path), state)
        commit = self.commit(state, branch=branch, blocking=True, allow_pickle=allow_pickle, local=True,
                             files=folder_files.kept if folder_files else None, **meta).wait()
        note = skipped_note(folder_files) if folder_files else None
        if note is not None:
            warnings.warn(note, UserWarning, stacklevel=2)
        return commit

    def dcp_writer(self, *, branch: str | None = None, allow_pickle: bool = False,
                   **meta: Unpack[CommitMeta]) -> ShareWriter:
        """A ``torch.distributed.checkpoint`` StorageWriter: each ``dcp.save`` through it is one
        commit on ``branch`` (``ckptrepo.dcp.Writer``; ``distributed.writer``)."""
        from ckptrepo.distributed.writer import ShareWriter

        self._check_writable("commit")
        return ShareWriter(self._writer, prepare(self._sessions, branch=branch or self.head, names=(), **meta),
                           allow_pickle=allow_pickle, per_save_time=True)

    # -- refs ------------------------------------------------------------------------------

    def switch(self, branch: str) -> None:
        """Make ``branch`` the current branch (``head``), atomically; InvalidRefName for a bad name."""
        self._check_writable("switch branches")
        refs.write_head(self.repo_dir, branch)

    def branch(self, name: str, at: str | None = None, *, force: bool = False) -> t.RefInfo:
        """Create branch ``name`` at ``at`` (default: the head of main, else the newest commit);
        an existing branch is only moved with ``force``."""
        return self._set_ref("branch", name, at, force=force)

    def tag(self, name: str, at: str | None = None) -> t.RefInfo:
        """Create tag ``name`` at ``at``; tags never move."""
        return self._set_ref("tag", name, at, force=False)

    def _set_ref(self, kind: str, name: str, at: str | None, *, force: bool) -> t.RefInfo:
        self._check_writable(f"create a {kind}")
        self._own_store()
        refs.check_ref_name(name, kind)
        with self._sessions() as s:
            target = revparse.resolve(s, at) if at is not None else refs.default_target(s)
        with journal.entry(self._backend, {"op": "ref", "kind": kind, "name": name, "to": target}) as key, \
                write_transaction(self._sessions) as s:
            catalog.record_journal_key(s, key)
            return refs.create(s, kind, name, target, force=force)

    def delete_branch(self, name: str, *, force: bool = False) -> t.RefInfo:
        """Delete branch ``name``; UnreachableCommits when no other ref reaches some of its commits,
        unless ``force`` (the next ``gc`` then removes them). CurrentBranch, whatever ``force``, for
        the current branch (``head``): its next commit would start a new root under the same name."""
        if name == self._readable_head():
            raise CurrentBranch(name=name)
        return self._delete_ref("branch", name, force=force)

    def rename_branch(self, old: str, new: str, *, force: bool = False) -> t.RefInfo:
        """Rename branch ``old`` to ``new``; its commits and their lineage stay as they are, and the
        current branch (``head``) follows when it was ``old``. RefExists when ``new`` exists, unless
        ``force`` (which replaces it: commits only it reached go at the next ``gc``); UnknownRef
        when there is no ``old``. Journalled as ``new`` created at ``old``'s head and ``old`` deleted,
        both recorded by the one transaction that renames it."""
        self._check_writable("rename a branch")
        self._own_store()
        refs.check_ref_name(new, "branch")
        with self._sessions() as s:
            target = refs.branch_head(s, old)
            if target is None:
                raise UnknownRef(kind="branch", name=old, hint=did_you_mean(
                    "branch", old, [r.name for r in refs.listing(s, "branch")], "`ckpt branch`"))
        if new == old:
            raise UsageError(f"branch {old!r} already has that name", hint="Give another NEW name.")
        with journal.entry(self._backend, {"op": "ref", "kind": "branch", "name": new, "to": target}) as created, \
                journal.entry(self._backend, {"op": "ref", "kind": "branch", "name": old, "to": None}) as deleted, \
                write_transaction(self._sessions) as s:
            catalog.record_journal_key(s, created)
            catalog.record_journal_key(s, deleted)
            renamed = refs.rename(s, "branch", old, new, target, force=force)
        if self._readable_head() == old:
            refs.write_head(self.repo_dir, new)
        return renamed

    def _readable_head(self) -> str | None:
        """``head``, or None when ``.ckpt/HEAD`` holds no branch name (``switch`` rewrites it)."""
        try:
            return self.head
        except UsageError:
            return None

    def delete_tag(self, name: str, *, force: bool = False) -> t.RefInfo:
        """Delete tag ``name``, on the same terms as ``delete_branch``."""
        return self._delete_ref("tag", name, force=force)

    def _delete_ref(self, kind: str, name: str, *, force: bool) -> t.RefInfo:
        self._check_writable(f"delete a {kind}")
        self._own_store()
        with journal.entry(self._backend, {"op": "ref", "kind": kind, "name": name, "to": None}) as key, \
                write_transaction(self._sessions) as s:
            catalog.record_journal_key(s, key)
            return refs.delete_ref(s, kind, name, force=force)

    # -- whole repository ------------------------------------------------------------------

    def gc(self, *, grace: float = DEFAULT_GRACE_S, dry_run: bool = False) -> t.GcReport:
        """Remove commits no ref reaches and everything only they needed (``maintenance.gc``); objects
        younger than ``grace`` seconds are kept, and so, whatever ``grace``, are those a writer of
        another process may own (its lease in the store, ``ledger.leases``)."""
        from ckptrepo.maintenance import gc as collector  # imported here: it loads numpy (packs)

        self._check_writable("gc")
        self._settle()
        self._own_store()
        return collector.collect(self._sessions, self._backend, grace=grace, dry_run=dry_run)

    def prune(self, *, keep_last: int | None = None, keep_every: int | None = None,
              keep_best: str | tuple[str, int] | None = None, maximize: bool = False, keep_dense_early: bool = False,
              keep_younger_than: str | float | None = None, branches: Collection[str] | None = None,
              rules: t.RetentionRules | None = None, damaged: bool = False, dry_run: bool = False) -> t.PruneReport:
        """Drop the data of the commits no keep rule keeps, keeping them in the lineage (``maintenance.prune``;
        the rules: ``maintenance.retention``, at least one; ``rules``: given whole instead, e.g.
        ``retention()``). Marks them pruned in one transaction; the next ``gc`` frees their data.
        Branch heads, tags and fork points are always kept. ``dry_run``: what would be pruned.
        ``damaged`` (without rules): accept the loss of every damaged commit (``Commit.damage``)
        instead: they are marked pruned, so that ``gc`` runs again."""
        from ckptrepo.maintenance import prune as pruner
        from ckptrepo.maintenance import retention

        self._check_writable("prune")
        self._settle()
        self._own_store()
        if damaged:
            if rules is not None or any(x not in (None, False) for x in (keep_last, keep_every, keep_best,
                                                                        keep_dense_early, keep_younger_than)):
                raise UsageError("damaged=True takes no keep rules", hint="Prune the damaged commits on their "
                                 "own (`ckpt prune --damaged`), then with rules.")
            return pruner.prune_damaged(self._sessions, self._reading, self._backend, dry_run=dry_run)
        chosen = retention.chosen(rules, keep_last=keep_last, keep_every=keep_every, keep_best=keep_best,
                                  maximize=maximize, keep_dense_early=keep_dense_early,
                                  keep_younger_than=keep_younger_than, branches=branches)
        return pruner.prune(self._sessions, self._reading, self._backend, chosen, dry_run=dry_run)

    def set_retention(self, rules: t.RetentionRules | Mapping[str, Any] | None) -> None:
        """Store ``rules`` (or their ``to_json``) as the repository's retention setting, None to remove
        it (``maintenance.setting``). While set, it is applied in the background after every commit
        this process makes (a prune, then a gc when something was pruned; never on a commit's path)."""
        from ckptrepo.maintenance import setting

        self._check_writable("store a retention setting")
        self._own_store()
        if rules is not None and not isinstance(rules, t.RetentionRules):
            rules = t.RetentionRules.from_json(rules)
        setting.write(self._sessions, self._backend, rules)
        self._retention.set_rules(rules)

    def repack(self, *, compact_below: float = 0.0, dry_run: bool = False) -> t.RepackReport:
        """Encode the chunks commits stored raw and, with ``compact_below`` (a fraction), move the
        live chunks of packs less live than that into new packs (``maintenance.repack``)."""
        from ckptrepo.maintenance import repack as packer

        self._check_writable("repack")
        self._settle()
        return packer.repack(self._sessions, self._backend, self._reader, self._pool, self.config,
                             compact_below=compact_below, dry_run=dry_run)

    def write_missing_manifests(self) -> int:
        """Write the manifests that are missing (commits made before manifests existed), damaged or
        of format 1, from the database, and journal entries that pin today's refs and pruned marks,
        so that ``rebuild_database`` recreates this database (``maintenance.backfill``); returns
        how many manifests were written."""
        from ckptrepo.maintenance import backfill

        self._check_writable("write manifests")
        self._settle()
        return backfill.write_missing(self._reading, self._sessions, self._backend).written

    def verify(self, *, full: bool = False) -> t.VerifyReport:
        """Check database and packs against each other (``full``: read and hash-check every chunk)."""
        from ckptrepo.maintenance.verify import verify as verify_repository

        self._settle()
        return verify_repository(self._reading, self._backend, self._reader, full=full)

