"""Commands for names of commits: ``branch`` and ``tag``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ckptrepo import errors
from ckptrepo.types import RefInfo, short_id

from . import render
from .options import (
    AtRevArg,
    BranchNameArg,
    BranchRevArg,
    DeleteOpt,
    ForceOpt,
    JsonOpt,
    MoveOpt,
    TagForceOpt,
    TagNameArg,
)
from .session import branch_head, current

if TYPE_CHECKING:  # loaded when a command runs: `ckpt --version` imports no database stack
    from ckptrepo import Repo


def branch(name: BranchNameArg = None, rev: BranchRevArg = None, force: ForceOpt = False, delete: DeleteOpt = False,
           move: MoveOpt = False, as_json: JsonOpt = False) -> None:
    """List branches (* marks the current one), create branch NAME at REV, rename it (-m NAME NEW) or delete it (-d).

    REV defaults to the head of the current branch. Creating a branch does
    not switch to it: `ckpt checkout -b NAME` does both. Renaming keeps its commits and
    lineage; the current branch follows; an existing NEW is replaced only with --force.
    Deleting refuses the current branch, and a branch whose commits no other ref reaches
    unless --force; `ckpt gc` then removes those commits."""
    if name is None and (force or delete or move):
        flag = "--delete" if delete else "--move" if move else "--force"
        raise errors.UsageError(f"{flag} needs a branch NAME", hint=f"Run `ckpt branch {flag} NAME`.")
    if delete and move:
        raise errors.UsageError("--delete and --move do not go together", hint="Rename with `ckpt branch -m OLD NEW`, "
                                "delete with `ckpt branch -d NAME`.")
    if move and rev is None:
        raise errors.UsageError("--move needs the NEW name", hint="Run `ckpt branch -m OLD NEW`.")
    with current().open() as repo:
        if name is None:
            _list(repo, repo.branches(), as_json, empty="no branches yet", current=repo.head)
            return
        if delete:
            _check_no_rev(rev)
            ref = repo.delete_branch(name, force=force)  # refuses the current branch (CurrentBranch)
        elif move:
            assert rev is not None
            ref = repo.rename_branch(name, rev, force=force)
        else:
            ref = repo.branch(name, at=_default_at(repo, rev), force=force)
    if move:
        _renamed(name, ref, as_json)
    else:
        _done(ref, as_json, deleted=delete)


def tag(name: TagNameArg = None, rev: AtRevArg = None, delete: DeleteOpt = False, force: TagForceOpt = False,
        as_json: JsonOpt = False) -> None:
    """List tags, create tag NAME at REV (default: the head of the current branch), or delete it (-d)."""
    if name is None and (force or delete):
        raise errors.UsageError("--delete needs a tag NAME", hint="Run `ckpt tag --delete NAME`.")
    if force and not delete:
        raise errors.UsageError("tags never move; --force only goes with --delete",
                                hint="Delete the tag (`ckpt tag -d NAME`), then create it again.")
    with current().open() as repo:
        if name is None:
            _list(repo, repo.tags(), as_json, empty="no tags yet")
            return
        if delete:
            _check_no_rev(rev)
            ref = repo.delete_tag(name, force=force)
        else:
            ref = repo.tag(name, at=_default_at(repo, rev))
    _done(ref, as_json, deleted=delete)


def _check_no_rev(rev: str | None) -> None:
    if rev is not None:
        raise errors.UsageError("--delete takes a NAME only, no REV", hint="Drop the revision argument.")


def _default_at(repo: Repo, rev: str | None) -> str | None:
    """``rev``, else the current branch's head when it has one (else the library's default)."""
    if rev is not None:
        return rev
    return branch_head(repo, repo.head)


def _list(repo: Repo, refs: list[RefInfo], as_json: bool, *, empty: str, current: str | None = None) -> None:
    if as_json:
        render.emit_json([
            {**ref.to_json(), **({"current": ref.name == current} if current is not None else {})} for ref in refs
        ])
    elif not refs:
        render.err.print(empty)
    else:
        commits = {ref.commit_id: repo.get_commit(ref.commit_id) for ref in refs}
        render.out.print(render.ref_table(refs, commits, current=current))


def _renamed(old: str, ref: RefInfo, as_json: bool) -> None:
    if as_json:
        render.emit_json({**ref.to_json(), "renamed_from": old})
    else:
        render.out.print(f"renamed branch {old} to {ref.name} ({short_id(ref.commit_id)})", markup=False)


def _done(ref: RefInfo, as_json: bool, *, deleted: bool) -> None:
    if as_json:
        render.emit_json({**ref.to_json(), **({"deleted": True} if deleted else {})})
    elif deleted:
        render.out.print(f"deleted {ref.kind} {ref.name} (was {short_id(ref.commit_id)})", markup=False)
    else:
        render.out.print(f"{ref.kind} {ref.name} -> {short_id(ref.commit_id)}", markup=False)
