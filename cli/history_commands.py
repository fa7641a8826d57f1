"""Commands that read commits: ``log`` and ``show``."""

from __future__ import annotations

from . import render
from .options import AllCommitsOpt, GraphOpt, JsonOpt, LimitOpt, OptionalRevArg, RevArg, WhereOpt
from .session import current, log_start


def log(
    rev: OptionalRevArg = None,
    max_count: LimitOpt = None,
    graph: GraphOpt = False,
    where: WhereOpt = None,
    all_commits: AllCommitsOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """List commits newest first: REV (default: the current branch) and its ancestors, or every
    commit with --all; with --where only those matching the expression, with --graph beside
    their lineage graph."""
    with current().open() as repo:
        commits = repo.log(log_start(repo, rev, all_commits=all_commits), where=where, limit=max_count)
    if as_json:
        render.emit_json([commit.to_json() for commit in commits])
    elif not commits:
        render.err.print("no commits match" if where is not None else "no commits yet")
    elif graph:
        from . import lineage_render  # rich's tables: only the graph draws one

        for line in lineage_render.graph_lines(commits):
            render.out.print(line, soft_wrap=True)
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
