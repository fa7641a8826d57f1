"""Commands that analyse tensors across commits: ``diff``, ``history`` and ``plot history|metrics``.

Thin over ``Repo``'s analysis (reading) and ``ckptrepo.plot`` (drawing). Without
``--along``/``--branch`` they follow the current branch (``Repo.head``), like ``log``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ckptrepo import errors, plot

from . import render
from .options import (
    AlongOpt,
    ChangedOnlyOpt,
    DiffAArg,
    DiffBArg,
    ExactOpt,
    HistoryLimitOpt,
    JsonOpt,
    MetricNamesArg,
    PlotBranchOpt,
    PlotOutputOpt,
    StatsOpt,
    TensorArg,
)
from .session import branch_head, current

if TYPE_CHECKING:  # loaded when a command runs: `ckpt --version` imports no database stack
    from ckptrepo import Repo

DEFAULT_STATS = ",".join(plot.DEFAULT_STATS)


def diff(
    a: DiffAArg, b: DiffBArg, exact: ExactOpt = False, changed_only: ChangedOnlyOpt = False, as_json: JsonOpt = False
) -> None:
    """Compare the tensors of commits A and B, by name.

    Each tensor is added, removed, changed (how many chunks differ, how its
    stored statistics moved) or unchanged; --stat reads no tensor bytes.
    --exact also measures each change, reading only the chunks that differ.
    The files the commits keep (config, tokenizer files) are listed when they differ."""
    with current().open() as repo:
        result = repo.diff(a, b, exact=exact)
    if as_json:
        render.emit_json(result.to_json(changed_only=changed_only))
        return
    render.out.print(render.diff_summary(result), soft_wrap=True)
    shown = [t for t in result.tensors if not (changed_only and t.status == "unchanged")]
    if shown:
        render.out.print(render.diff_table(shown, exact=exact))
    if result.files:
        render.out.print(render.diff_files(result.files), soft_wrap=True)


def history(tensor: TensorArg, along: AlongOpt = None, max_count: HistoryLimitOpt = None,
            as_json: JsonOpt = False) -> None:
    """Show how one tensor evolved along a branch, newest first.

    Per commit of the first-parent chain: the tensor's stored statistics and
    what changed against the parent commit. Reads no tensor bytes."""
    with current().open() as repo:
        rev = _along(repo, along)
        points = repo.history(tensor, along=rev, limit=max_count)
    if as_json:
        render.emit_json({"tensor": tensor, "along": rev, "points": [p.to_json() for p in points]})
        return
    render.out.print(render.history_summary(tensor, rev, points), soft_wrap=True)
    render.out.print(render.history_table(points))


def plot_history(
    tensor: TensorArg,
    output: PlotOutputOpt,
    along: AlongOpt = None,
    stat: StatsOpt = DEFAULT_STATS,
    max_count: HistoryLimitOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Plot a tensor's stored statistics along a branch to FILE.png."""
    stats = plot.check_stats([s.strip() for s in stat.split(",") if s.strip()])
    plot.check_output(output)
    plot.require()
    with current().open() as repo:
        rev = _along(repo, along)
        points = repo.history(tensor, along=rev, limit=max_count)
    plot.plot_history(points, output, name=tensor, along=rev, stats=stats)
    _wrote(output, len(points), as_json)


def plot_metrics(
    names: MetricNamesArg,
    output: PlotOutputOpt,
    branch: PlotBranchOpt = None,
    max_count: HistoryLimitOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Plot metrics along branches to FILE.png.

    One panel per metric (NAMEs separated by spaces or commas: `loss val_loss`
    or `loss,val_loss`), one line per --branch, following each branch's
    first-parent chain."""
    wanted = list(dict.fromkeys(n.strip() for arg in names for n in arg.split(",") if n.strip()))
    if not wanted:
        raise errors.UsageError("no metric names given", hint="Name them, e.g. `ckpt plot metrics loss,val_loss`.")
    plot.check_output(output)
    plot.require()
    with current().open() as repo:
        revs = list(dict.fromkeys(branch)) if branch else [_along(repo, None)]
        series = {rev: repo.metrics_along(wanted, along=rev, limit=max_count) for rev in revs}
        for name in wanted:
            if not any(name in p.values for points in series.values() for p in points):
                raise errors.UsageError(
                    f"no commit along {', '.join(revs)} records metric {name!r}",
                    hint=errors.did_you_mean("metric", name, repo.metric_names(), "`ckpt log`"),
                )
    plot.plot_metrics(series, wanted, output)
    _wrote(output, sum(len(p) for p in series.values()), as_json)


def _along(repo: Repo, along: str | None) -> str:
    """``--along``, else the current branch (UsageError when that branch has no commits yet)."""
    if along is not None:
        return along
    name = repo.head
    if branch_head(repo, name) is None:
        raise errors.UsageError(
            f"the current branch {name!r} has no commits yet",
            hint="Name a revision with --along REV, or switch with `ckpt checkout BRANCH`.",
        )
    return name


def _wrote(path: Path, n_commits: int, as_json: bool) -> None:
    if as_json:
        render.emit_json({"path": str(path), "bytes": path.stat().st_size, "commits": n_commits})
    else:
        render.out.print(f"wrote {path} ({n_commits} commits)", markup=False)
