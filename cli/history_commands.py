"""Commands that read commits, ``log`` and ``show``, and ``annotate``, which attaches results to one."""

from __future__ import annotations

from . import render
from .options import (
    AllCommitsOpt,
    GraphOpt,
    JsonOpt,
    LimitOpt,
    NoteOpt,
    OptionalRevArg,
    ResultOpt,
    RevArg,
    SourceOpt,
    WhereOpt,
)
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
    """Show one commit: its fields, parents, metrics, annotations, ingest figures, tensors and the
    files it keeps (a model folder's config and tokenizer files), with their sizes."""
    with current().open() as repo:
        commit = repo.get_commit(rev)
        notes = repo.annotations(commit.id)
        tensors = repo.tensors(commit.id)
        files = repo.files(commit.id)
    if as_json:
        render.emit_json({**commit.to_json(), "annotation_history": [a.to_json() for a in notes],
                          "tensors": [tensor.to_json() for tensor in tensors], "files": files})
        return
    render.out.print(render.commit_fields(commit))
    if notes:
        render.out.print()
        render.out.print(render.annotation_table(notes))
    if tensors:
        render.out.print()
        render.out.print(render.tensor_table(tensors))
    if files:
        render.out.print()
        render.out.print(render.file_table(files))


def annotate(rev: RevArg, metric: ResultOpt = None, note: NoteOpt = None, source: SourceOpt = None,
             as_json: JsonOpt = False) -> None:
    """Attach results to commit REV after the fact (like git notes): --metric NAME=NUMBER
    (repeatable), --note TEXT, --source; with neither, list its annotations.

    The commit's id does not change. A newer value for a name becomes current and the older one
    stays in the history `ckpt show` lists. Annotated values work wherever metrics do (`log
    --where`, `best`, `plot metrics`, the UI), marked as annotations; a name the commit logged
    when it was made cannot be annotated. Pruned commits can be annotated."""
    with current().open() as repo:
        if metric or note is not None:
            commit = repo.annotate(rev, metrics={m.name: m.value for m in metric or []}, note=note, source=source)
        else:
            commit = repo.get_commit(rev)
        notes = repo.annotations(commit.id)
    if as_json:
        render.emit_json({"commit": commit.id, "annotations": commit.annotations,
                          "history": [a.to_json() for a in notes]})
    elif not notes:
        render.err.print(f"no annotations on {commit.short_id}")
    else:
        render.out.print(render.annotation_table(notes))
