"""Every error ckptrepo raises on purpose.

Each class's docstring is its one-line message template; ``hint`` says what to do
about it and ``exit_code`` is what the ``ckpt`` CLI exits with. Raising code passes
the specifics as keyword arguments that fill the template, for example
``UnknownRevision(rev="main~9")``.

Exit codes: 1 generic, 2 usage/bad input, 3 not found, 4 conflict, 5 integrity,
6 schema/version, 7 backend/storage.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any, ClassVar


class CkptError(Exception):
    """{message}"""

    exit_code: ClassVar[int] = 1
    hint: ClassVar[str] = ""

    def __init__(self, message: str | None = None, *, hint: str | None = None, **fields: Any) -> None:
        self.fields = fields
        template = (type(self).__doc__ or "{message}").strip().splitlines()[0]
        if message is None:
            try:
                message = template.format(**fields)
            except (KeyError, IndexError):
                message = template
        self.message = message
        if hint is not None:
            self.hint = hint  # type: ignore[misc]
        super().__init__(message)

    def __str__(self) -> str:
        return self.message


class UsageError(CkptError):
    """{message}"""

    exit_code = 2


class ForkedProcess(UsageError):
    """This {what} belongs to process {owner}; process {pid} was forked from it."""

    hint = ("A forked child cannot use its parent's repository (its threads, connections and pending "
            "commits stay in the parent): open the repository again in the child with Repo.open(path).")


class NotARepository(CkptError):
    """No ckpt repository at or above {path}."""

    exit_code = 3
    hint = "Create one with `ckpt init`, or point at one with `--repo PATH`."


class RepositoryExists(CkptError):
    """A ckpt repository already exists at {path}."""

    exit_code = 4
    hint = "Open it with `ckpt --repo PATH ...`; remove the .ckpt folder first to start over."


class UnknownRevision(CkptError):
    """Unknown revision {rev!r}."""

    exit_code = 3
    hint = ("Use a commit id or a prefix of it (4+ hex digits), a branch or tag name, REV~N, REV^N or "
            "BRANCH@step=N; `ckpt log` lists commits.")


class AmbiguousRevision(CkptError):
    """Revision {rev!r} is ambiguous: it matches {candidates}."""

    exit_code = 2
    hint = "Give more characters of the commit id."


class UnknownTensor(CkptError):
    """Commit {commit} has no tensor named {name!r}."""

    exit_code = 3
    hint = "`ckpt show REV` lists the tensor names of a commit."


class UnknownFile(CkptError, FileNotFoundError):
    """Commit {commit} has no file {name!r}."""

    exit_code = 3
    hint = ("Repo.files(rev) lists the files a commit keeps; its view (fsspec `ls`, `ckpt mount`) also holds "
            "the weight files. Paths are relative to the commit, with /.")


class ReadOnlyView(CkptError, PermissionError):
    """Cannot {what}: a view of a commit is read-only."""

    exit_code = 2
    hint = "Commit changes with `ckpt commit` or Repo.commit; export a writable copy with `ckpt checkout REV -o PATH`."


class UnsupportedState(CkptError):
    """Cannot store the value at {path}: {reason}."""

    exit_code = 2
    hint = (
        "State may hold tensors, numpy arrays, modules, optimizers, schedulers and JSON-compatible values; "
        "convert the value, or pass allow_pickle=True to store it pickled."
    )


class StateMismatch(UsageError):
    """The commit does not fit what it would be loaded into ({count} difference(s)): {detail}."""

    hint = ("Nothing was loaded: every target is as it was. Build the model and optimizer as they were when "
            "committed (`ckpt show REV` lists the commit's tensors and shapes), or load a part that fits "
            "(checkout(rev, part=KEY, into=...)).")


class InvalidInput(CkptError):
    """Cannot read {path}: {reason}."""

    exit_code = 2
    hint = ("`ckpt commit` takes .safetensors and torch.save files, and Hugging Face model folders and "
            "torch.distributed.checkpoint folders.")


class OutputExists(CkptError):
    """Cannot write {path}: it exists, and was not to be replaced."""

    exit_code = 4
    hint = ("Name a new file, or replace it on purpose (`ckpt checkout REV -o FILE --force`, "
            "replace=True); a symbolic link there is replaced itself, never followed.")


class ImportConflict(CkptError):
    """{path} is at step {step}, which branch {branch!r} already holds with other tensors (commit {commit})."""

    exit_code = 4
    hint = ("Nothing was imported. The run was changed or restarted since it was imported: import it on a branch "
            "of its own (`ckpt import-run DIR -b NEW`), or move that checkpoint out of the folder.")


class RefConflict(CkptError):
    """Branch {branch!r} moved while committing: it is at {actual}, expected {expected}."""

    exit_code = 4
    hint = "Commit again on top of the new head, or on a new branch; the commit itself is kept under its id."


class RefExists(CkptError):
    """{kind} {name!r} already exists."""

    exit_code = 4
    hint = "Pick another name."


class InvalidRefName(CkptError):
    """Invalid {kind} name {name!r}: {reason}."""

    exit_code = 2
    hint = "Names may use letters, digits and . _ - /, must not start with - or look like a revision expression."


class ConcurrentChange(CkptError):
    """The {what} conflicted with a {other} running at the same time ({detail})."""

    exit_code = 4
    hint = "Nothing was changed; run it again."


class UnreachableCommits(CkptError):
    """Deleting {kind} {name!r} would leave {count} commit(s) that no ref reaches; gc would remove them."""

    exit_code = 4
    hint = "Pass --force (force=True) to delete it anyway, or first put a branch or tag on what you keep."


class CurrentBranch(UsageError):
    """Branch {name!r} is the current branch; it cannot be deleted."""

    hint = "Switch to another branch first (`ckpt checkout BRANCH`, Repo.switch), then try again."


class UnknownRef(CkptError):
    """No {kind} named {name!r}."""

    exit_code = 3
    hint = "List them with `ckpt branch` or `ckpt tag`."


class CommitPruned(CkptError):
    """Commit {commit} was pruned: its metadata and statistics are kept, its tensors are not."""

    exit_code = 3
    hint = "Check out a commit that still has data; `ckpt log` marks pruned commits."


class CommitDamaged(CkptError):
    """Commit {commit} is damaged: {why}."""

    exit_code = 5
    hint = ("Its data or manifest was missing or corrupt in the store when the database was rebuilt. Restore "
            "the missing store objects from a backup and run `ckpt db rebuild --replace`; `ckpt verify` names "
            "per branch the last good commit to resume from.")


class DamagedCommits(CkptError):
    """{count} commit(s) are damaged ({examples}); {what} would delete data they may still need."""

    exit_code = 5
    hint = ("Restore the missing packs or manifests and run `ckpt db rebuild --replace`; or accept the loss "
            "with `ckpt prune --damaged` (the commits stay in the lineage, pruned) and run it again.")


class StoreInUse(CkptError):
    """The store {url} belongs to repository {found}, not to this one ({expected})."""

    exit_code = 4
    hint = ("A store holds one repository: give each repository its own store (another folder, or another "
            "s3:// prefix). Nothing was changed.")


class UnknownRemote(CkptError):
    """No remote named {name!r}."""

    exit_code = 3
    hint = "`ckpt remote list` shows the remotes; `ckpt remote add NAME URL` adds one."


class RemoteExists(CkptError):
    """A remote named {name!r} exists already ({url})."""

    exit_code = 4
    hint = "Pick another name, or `ckpt remote remove NAME` first."


class PushRejected(CkptError):
    """The remote {remote!r} refused {kind} {name!r}: {why}."""

    exit_code = 4
    hint = ("`ckpt fetch` first, then merge or rebase your work on the remote's, and push again; `--force` "
            "replaces the remote's ref (commits only it reached stay stored, unreferenced). Nothing the "
            "remote shows was changed.")


class NotFastForward(CkptError):
    """Branch {branch!r} ({local}) and {upstream} ({remote}) have diverged: neither contains the other."""

    exit_code = 4
    hint = ("Your branch was not moved. Merge the two (`ckpt commit --parents`), or reset the branch to the "
            "remote's with `ckpt branch --force BRANCH REMOTE/BRANCH`.")


class RemoteNotBare(CkptError):
    """{url} is the store of a working repository: push goes to a remote made for it."""

    exit_code = 4
    hint = ("Push to an empty folder or s3:// prefix (it becomes a remote), or fetch from this one into "
            "the other repository instead. Nothing was changed.")


class ReplicationBacklog(CkptError):
    """Commit refused: {commits} commits ({nbytes} bytes) wait to reach {remote!r}, over the limit ({limit})."""

    exit_code = 7
    hint = ("Nothing was written. The remote is unreachable or slower than the commits; `ckpt status` shows "
            "the backlog and the last error. Commit again once it shrinks, or raise CKPT_REPLICATION_BACKLOG.")


class ReplicaWaiting(CkptError):
    """{chunks} chunks of the commits to replicate are on another node's store, not yet on remote {remote!r}."""

    exit_code = 7
    hint = ("Each node uploads its own packs (CKPT_NODE_STORE); the commit is published on the remote once "
            "all of them are there. Replication retries by itself.")


class NoPath(CkptError):
    """No lineage path between {a} and {b}: they share no ancestor."""

    exit_code = 3
    hint = "`ckpt lineage ancestors REV` lists what each descends from; --kind limits which edges count."


class IntegrityError(CkptError):
    """Stored data is corrupt: {detail}."""

    exit_code = 5
    hint = "Run `ckpt verify` to list damaged packs and the commits that use them."


class SchemaOutdated(CkptError):
    """The repository database is at schema {current}, this ckptrepo needs {head}."""

    exit_code = 6
    hint = "Run `ckpt db upgrade` (back up the database first if it is shared)."


class SchemaTooNew(CkptError):
    """The repository database is at schema {current}, newer than this ckptrepo knows ({head})."""

    exit_code = 6
    hint = "Upgrade ckptrepo to open this repository."


class FormatError(CkptError):
    """Unsupported repository format: {detail}."""

    exit_code = 6
    hint = "Upgrade ckptrepo, or check that --repo points at a ckpt repository."


class DatabaseMissing(FormatError):
    """The repository database is missing, empty or incomplete: {detail}."""

    exit_code = 6
    hint = ("The store still holds the repository: run `ckpt db rebuild` to recreate the database from it "
            "(`ckpt verify` afterwards). If db_url in .ckpt/config.json names the wrong database, correct it instead.")


class DatabaseDamaged(CkptError):
    """The repository database is damaged: {detail}."""

    exit_code = 5
    hint = ("The store still holds the repository: run `ckpt db rebuild` to recreate the database from it (the "
            "damaged file is kept beside the new one), then `ckpt verify`.")


_SQLITE_DAMAGE = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB: primary result codes of a damaged file


def database_damage(exc: BaseException, where: str = "the SQLite database") -> DatabaseDamaged | None:
    """DatabaseDamaged when ``exc`` or what caused it (SQLAlchemy raises its errors from the
    driver's) is SQLite finding its file no database or corrupt, whichever query met it; else None."""
    cause: BaseException | None = exc
    while cause is not None:
        code = getattr(cause, "sqlite_errorcode", None)  # sqlite3's errors only
        if isinstance(code, int) and code & 0xFF in _SQLITE_DAMAGE:
            return DatabaseDamaged(detail=f"{where}: {cause}")
        cause = cause.__cause__
    return None


class StorageError(CkptError):
    """Storage backend failed: {detail}."""

    exit_code = 7
    hint = "Check the store's path or URL, free space and permissions; nothing partial was made visible."


class StoreFull(StorageError):
    """No space left where the repository writes: {detail}."""

    exit_code = 7
    hint = ("Free space there (`ckpt prune` old commits' data or delete branches you no longer need, then "
            "`ckpt gc`; or move the store) and commit "
            "again: nothing of this commit was made visible, and the repository is as it was.")


class ReadOnlyRepository(CkptError):
    """Cannot {what}: the repository {path} is read-only ({why})."""

    exit_code = 7
    hint = ("Nothing was changed. Reading works (log, show, diff, history, checkout REV -o PATH, verify, ui); to "
            "write, use the repository where it is writable (remount it read-write, or copy its .ckpt folder), "
            "and open it without --read-only (read_only=True).")


class UnreadableLog(CkptError):
    """Cannot read {path} on a read-only filesystem: its log {log} holds changes, but its index {index} is gone."""

    exit_code = 7
    hint = ("SQLite reads a log on read-only media only through its index (the -shm file a writer leaves beside "
            "it). Open the repository once where it is writable (any ckpt command folds the log into the "
            "database), or copy its .ckpt folder to a writable place and read it there.")


def storage_failure(exc: OSError) -> StorageError:
    """The ckptrepo error for an ``OSError`` a store or its staging raised while writing:
    StoreFull for a full disk or quota, else StorageError naming the error and the file."""
    import errno

    detail = exc.strerror or str(exc)
    if exc.filename:
        detail += f" ({exc.filename})"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StoreFull(detail=detail)
    return StorageError(detail=detail)


class CommitReadFailed(CkptError):
    """Commit {commit} is durable and visible, but the step after its transaction failed: {detail}."""

    exit_code = 1
    hint = "The commit is in the repository (`ckpt show ID`); do not commit it again."


class CommitFailed(CkptError):
    """A background commit failed: {detail}."""

    exit_code = 1
    hint = "The repository is as it was before that commit; fix the cause and commit again."


class RankFailed(CkptError):
    """The distributed commit failed on rank {rank}: {detail}"""

    exit_code = 1
    hint = ("No commit was made on any rank; packs the other ranks wrote are unreferenced and `ckpt gc` "
            "reclaims them. Fix that rank and commit again.")


# -- evaluation and bisect (explore.evaluate, explore.bisect) -----------------------------------


class EvaluationFailed(CkptError):
    """{failed} of {count} evaluation(s) failed."""

    exit_code = 1
    hint = ("Each failure is listed with the end of its stderr; the others were recorded. Fix the command and run "
            "it again: commits that already have its results are skipped (--force runs them again).")


class NotOnFirstParentLine(UsageError):
    """{good} is not on the first-parent line of {bad}, before it."""

    hint = ("Bisect searches the commits between GOOD and BAD along BAD's first parents: give as GOOD an older "
            "commit of that line (`ckpt log BAD` lists it), not one of another branch or of a merge's other side.")


class BisectEndpoint(UsageError):
    """{message}"""

    hint = ("Bisect needs the predicate false at GOOD and true at BAD. Check it (`ckpt log --where EXPR`, "
            "`ckpt show REV`), or give other ends.")


class BisectAborted(CkptError):
    """Bisect stopped at {commit}: the command {why}."""

    exit_code = 1
    hint = ("A command that cannot start, times out or is killed decides nothing: fix it, or give it more "
            "time (--timeout). Exit status 0 marks a commit good, 125 skips it, any other marks it bad.")


# -- weight-space merges (explore.merging) -------------------------------------------------------


class MergeMismatch(UsageError):
    """Cannot merge: tensor {name!r} {why}."""

    hint = ("Merged commits must hold the same tensors, each with one shape and dtype, and equal integer or bool "
            "tensors (step counters, position ids); nothing was written. Merge commits of one architecture "
            "(`ckpt diff A B` shows how two differ).")


def did_you_mean(what: str, name: str, candidates: Iterable[str], listing: str) -> str:
    """A hint naming up to five close matches of ``name`` among ``candidates`` (those containing
    it first), else saying how to list them (``listing``: a command or call)."""
    pool = sorted(set(candidates))
    within = [c for c in pool if name.lower() in c.lower()]
    matches = (within + [c for c in difflib.get_close_matches(name, pool, n=5, cutoff=0.6) if c not in within])[:5]
    if matches:
        return f"Did you mean {', '.join(repr(m) for m in matches)}?"
    return f"No {what} has a similar name; {listing} lists them."
