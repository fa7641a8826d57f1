"""Lineage from the weights: ``ckpt similar``, and what ``commit --infer-parent`` and ``import-run
--infer-lineage`` show and commit (``state_commands`` calls ``commit_inferred`` / ``import_inferred``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptrepo import errors
from ckptrepo.types import LineageCandidate, LineageProposal, Similarity, short_id

from . import render, terminal
from .options import AllowPickleOpt, JsonOpt, NearestOpt, SimilarArg
from .session import branch_head, current

if TYPE_CHECKING:
    from rich.table import Table

    from ckptrepo import Repo

# Checkpoint files an --infer-lineage folder may hold besides a run's checkpoint-N folders and .ckpt files.
CHECKPOINT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt")


def similar(target: SimilarArg, number: NearestOpt = 5, allow_pickle: AllowPickleOpt = False,
            as_json: JsonOpt = False) -> None:
    """List the commits nearest to a commit or a checkpoint file, by their weights.

    Three stages, each on fewer commits: the chunks the model shares with each commit (frozen
    or unchanged parts, copies: one query over the chunk index), a bound on the distance from
    each tensor's stored statistics (no bytes read), and the exact relative L2 distance over
    the model's weights for the best few (only the chunks that differ are read). A file is read
    and hashed as a commit would hash it; nothing is stored. Columns: score (1 - distance),
    shared chunk bytes, weights matched by name, the statistics' bound, the exact distance, and
    the tensors that differ most.
    """
    with current().open() as repo:
        found = repo.similar(target, n=number, allow_pickle=allow_pickle)
        commits = {c.id: c for c in repo.commits([s.commit_id for s in found])}
    if as_json:
        render.emit_json([s.to_json() for s in found])
        return
    if not found:
        render.err.print("no commit to compare with", markup=False)
        return
    render.out.print(similar_table(found, {cid: c.message for cid, c in commits.items()}))


def similar_table(found: Sequence[Similarity], messages: Mapping[str, str]) -> Table:
    table = render._table()
    for column in ("commit", "score", "shared", "matched", "bound", "exact", "differ most", "message"):
        table.add_column(column, justify="right" if column in ("score", "bound", "exact") else "left")
    for s in found:
        worst = sorted(s.per_tensor.items(), key=lambda kv: -kv[1])[:2]
        message = (messages.get(s.commit_id) or "").splitlines()
        table.add_row(short_id(s.commit_id), f"{s.score:.4f}",
                      f"{render.size(s.shared_bytes)} ({100 * s.shared_fraction:.0f}%)",
                      f"{s.matched_tensors}/{s.query_tensors}", render.num(s.stat_distance),
                      render.num(s.exact_distance),
                      render.plain(", ".join(f"{terminal.one_line(n)} {v:.2g}" for n, v in worst)),
                      render.plain(message[0] if message else ""))
    return table


# -- proposals ------------------------------------------------------------------------------------


def _source(label: str | None) -> str:
    """A source as shown: a commit's short id, a file's name."""
    if label is None:
        return ""
    return short_id(label) if len(label) == 64 and all(c in "0123456789abcdef" for c in label) else Path(label).name


def _candidate(c: LineageCandidate | None) -> str:
    return "" if c is None else f"{c.kind} {_source(c.source)} {c.score:.4f}"


def proposal_table(proposals: Sequence[LineageProposal]) -> Table:
    """One row per model: the proposed edge, its score and evidence, and the runner-up."""
    table = render._table()
    for column in ("model", "kind", "from", "score", "distance", "frozen", "direction", "runner-up"):
        table.add_column(column, justify="right" if column in ("score", "distance", "frozen") else "left")
    for p in proposals:
        e = p.evidence
        table.add_row(render.plain(_source(p.model)), p.kind or "root", render.plain(_source(p.parent)),
                      f"{p.score:.4f}", render.num(e.distance) if e else "",
                      f"{100 * e.frozen_fraction:.0f}%" if e else "",
                      (e.direction + (" (against)" if e.against else "")) if e else "",
                      render.plain(_candidate(p.runner_up)))
    return table


def _not_accepted() -> None:
    render.err.print("nothing committed: add --accept to commit with the proposed edges", markup=False)


# -- commit FILE --infer-parent [--accept] ----------------------------------------------------------


def commit_inferred(path: Path, *, message: str | None, branch: str | None, step: int | None, epoch: int | None,
                    metrics: Mapping[str, float] | None, accept: bool, allow_pickle: bool, as_json: bool) -> None:
    """Propose ``path``'s source among the commits; with ``accept``, commit it with that edge on
    ``branch``, or where the edge fits (``_branch_for``)."""
    with current().open() as repo:
        proposal = repo.infer_parent(path, allow_pickle=allow_pickle)
        made = None
        if accept:
            on = _branch_for(repo, proposal, branch)
            made = repo.commit_file(
                path, branch=on, message=message, step=step, epoch=epoch, metrics=metrics, allow_pickle=allow_pickle,
                parents=[proposal.parent] if proposal.kind == "parent" and proposal.parent else None,
                transfer_from=proposal.parent if proposal.kind == "transfer" else None)
    if as_json:
        render.emit_json({"proposal": proposal.to_json(), "commit": made.to_json() if made else None})
        return
    render.out.print(proposal_table([proposal]))
    if made is None:
        _not_accepted()
    else:
        render.out.print(render.commit_summary(made))


def _branch_for(repo: Repo, proposal: LineageProposal, given: str | None) -> str:
    """Where an accepted proposal is committed: ``given``, else the current branch when the edge fits
    there (its head is the proposed parent, or it has no commit yet), else for a parent edge the
    branch whose head is that parent. A transfer or a root has no parent edge, so it goes on a
    branch without commits. UsageError when no branch fits (name a new one with -b)."""
    current_branch = given or repo.head
    head = branch_head(repo, current_branch)
    if proposal.kind == "parent" and proposal.parent is not None:
        if head is None or head == proposal.parent or given is not None:
            return current_branch  # the commit engine refuses a given branch whose head is another commit
        at = sorted(b.name for b in repo.branches() if b.commit_id == proposal.parent)
        if at:
            return at[0]
        raise errors.UsageError(
            f"the proposed parent {short_id(proposal.parent)} is not the head of branch {current_branch!r} "
            "nor of any other branch",
            hint=f"Commit on a new branch starting there: add -b NEW (its first commit's parent is "
                 f"{short_id(proposal.parent)}).")
    if head is not None:
        what = f"a transfer from {_source(proposal.parent)}" if proposal.kind == "transfer" else "a new root"
        raise errors.UsageError(
            f"the proposal is {what}, which starts a line, and branch {current_branch!r} has commits",
            hint="Name a new branch for it with -b NEW.")
    return current_branch


# -- import-run DIR --infer-lineage [--accept] ------------------------------------------------------


def checkpoints_in(run_dir: Path, allow_pickle: bool) -> list[Path]:
    """The checkpoints of ``run_dir``: a run's (``formats.run_checkpoints``: checkpoint-N folders,
    Lightning .ckpt files), else every checkpoint file (``CHECKPOINT_SUFFIXES``) and model folder
    in it, by name. InvalidInput when it holds none."""
    from ckptrepo.formats import lightning_meta, read_state, run_checkpoints

    if not run_dir.is_dir():
        raise errors.InvalidInput(path=str(run_dir), reason="not a folder")
    try:
        return run_checkpoints(run_dir, lambda p: lightning_meta(read_state(p, mapped=True,
                                                                              allow_pickle=allow_pickle)).get("step"))[0]
    except errors.InvalidInput:
        pass
    found = sorted(p for p in run_dir.iterdir()
                   if (p.is_file() and p.suffix.lower() in CHECKPOINT_SUFFIXES)
                   or (p.is_dir() and any(f.suffix.lower() in (".safetensors", ".bin") or f.name == ".metadata"
                                          for f in p.iterdir())))
    if not found:
        raise errors.InvalidInput(path=str(run_dir), reason="no checkpoint files or model folders in it",
                                  hint="Put the checkpoints (" + ", ".join(CHECKPOINT_SUFFIXES) + " files, or model "
                                  "folders) in one folder.")
    return found


def import_inferred(run_dir: Path, *, message: str | None, branch: str | None, accept: bool, allow_pickle: bool,
                    as_json: bool) -> None:
    """Propose a tree over ``run_dir``'s checkpoints; with ``accept``, commit them with its edges."""
    paths = checkpoints_in(run_dir, allow_pickle)
    with current().open() as repo, render.phases(enabled=True) as phase:
        phase(f"reading and comparing {len(paths)} checkpoints")
        proposals = repo.infer_lineage(paths, allow_pickle=allow_pickle)
        made: list[Any] = []
        if accept:
            phase(f"committing {len(paths)} checkpoints")
            made = repo.commit_lineage(proposals, branch=branch, message=message, allow_pickle=allow_pickle)
    if as_json:
        render.emit_json({"proposals": [p.to_json() for p in proposals], "commits": [c.to_json() for c in made]})
        return
    render.out.print(proposal_table(proposals))
    if not accept:
        _not_accepted()
    for commit in made:
        render.out.print(render.commit_summary(commit))
