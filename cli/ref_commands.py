"""Commands for names of commits: ``branch`` and ``tag``."""

from __future__ import annotations

from ckptrepo import Repo, errors
from ckptrepo.ids import short
from ckptrepo.types import RefInfo

from . import render
from .options import AtRevArg, BranchNameArg, ForceOpt, JsonOpt, TagNameArg
from .session import branch_head, current, current_branch


def branch(name: BranchNameArg = None, rev: AtRevArg = None, force: ForceOpt = False, as_json: JsonOpt = False) -> None:
    """List branches (* marks the current one), or create branch NAME at REV.

    REV defaults to the head of the current branch. Creating a branch does
    not switch to it: `ckpt checkout -b NAME` does both."""
    if name is None and force:
        raise errors.UsageError("--force needs a branch NAME", hint="Run `ckpt branch --force NAME REV`.")
    with current().open() as repo:
        if name is None:
            _list(repo, repo.branches(), as_json, empty="no branches yet", current=current_branch(repo))
            return
        ref = repo.branch(name, at=_default_at(repo, rev), force=force)
    _created(ref, as_json)


def tag(name: TagNameArg = None, rev: AtRevArg = None, as_json: JsonOpt = False) -> None:
    """List tags, or create tag NAME at REV (default: the head of the current branch)."""
    with current().open() as repo:
        if name is None:
            _list(repo, repo.tags(), as_json, empty="no tags yet")
            return
        ref = repo.tag(name, at=_default_at(repo, rev))
    _created(ref, as_json)


def _default_at(repo: Repo, rev: str | None) -> str | None:
    """``rev``, else the current branch's head when it has one (else the library's default)."""
    if rev is not None:
        return rev
    return branch_head(repo, current_branch(repo))


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


def _created(ref: RefInfo, as_json: bool) -> None:
    if as_json:
        render.emit_json(ref.to_json())
    else:
        render.out.print(f"{ref.kind} {ref.name} -> {short(ref.commit_id)}", markup=False)
