"""Commands that read commits: ``log`` and ``show``."""

from __future__ import annotations

from . import render
from .options import JsonOpt, LimitOpt, OptionalRevArg, RevArg
from .session import current


def log(rev: OptionalRevArg = None, max_count: LimitOpt = None, as_json: JsonOpt = False) -> None:
    """List commits newest first: REV and its ancestors, or every commit when REV is not given."""
    with current().open() as repo:
        commits = repo.log(rev, limit=max_count)
    if as_json:
        render.emit_json([commit.to_json() for commit in commits])
    elif not commits:
        render.err.print("no commits yet")
    else:
        for commit in commits:
            render.out.print(render.log_line(commit), soft_wrap=True)


def show(rev: RevArg, as_json: JsonOpt = False) -> None:
    """Show one commit: its fields, parents, metrics, ingest figures and tensors."""
    with current().open() as repo:
        commit = repo.get_commit(rev)
        tensors = repo.tensors(commit.id)
    if as_json:
        render.emit_json({**commit.to_json(), "tensors": [tensor.to_json() for tensor in tensors]})
        return
    render.out.print(render.commit_fields(commit))
    if tensors:
        render.out.print()
        render.out.print(render.tensor_table(tensors))
