"""Commands for names of commits: ``branch`` and ``tag``."""

from __future__ import annotations

from ckptrepo import Repo, errors
from ckptrepo.ids import short
from ckptrepo.types import RefInfo

from . import render
from .options import AtRevArg, BranchNameArg, ForceOpt, JsonOpt, TagNameArg
from .session import current


def branch(name: BranchNameArg = None, rev: AtRevArg = None, force: ForceOpt = False, as_json: JsonOpt = False) -> None:
    """List branches, or create branch NAME at REV (default: the head of main)."""
    if name is None and force:
        raise errors.UsageError("--force needs a branch NAME", hint="Run `ckpt branch --force NAME REV`.")
    with current().open() as repo:
        if name is None:
            _list(repo, repo.branches(), as_json, empty="no branches yet")
            return
        ref = repo.branch(name, at=rev, force=force)
    _created(ref, as_json)


def tag(name: TagNameArg = None, rev: AtRevArg = None, as_json: JsonOpt = False) -> None:
    """List tags, or create tag NAME at REV (default: the head of main)."""
    with current().open() as repo:
        if name is None:
            _list(repo, repo.tags(), as_json, empty="no tags yet")
            return
        ref = repo.tag(name, at=rev)
    _created(ref, as_json)


def _list(repo: Repo, refs: list[RefInfo], as_json: bool, *, empty: str) -> None:
    if as_json:
        render.emit_json([ref.to_json() for ref in refs])
    elif not refs:
        render.err.print(empty)
    else:
        commits = {ref.commit_id: repo.get_commit(ref.commit_id) for ref in refs}
        render.out.print(render.ref_table(refs, commits))


def _created(ref: RefInfo, as_json: bool) -> None:
    if as_json:
        render.emit_json(ref.to_json())
    else:
        render.out.print(f"{ref.kind} {ref.name} -> {short(ref.commit_id)}", markup=False)
