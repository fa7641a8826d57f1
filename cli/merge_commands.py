"""Weight-space merges: ``merge`` (a new commit from several commits' weights) and ``interpolate``
(the straight line between two commits' weights, evaluated by a command, never committed).

Thin over ``Repo.merge_weights`` and ``Repo.interpolate``; their options are declared here (they
belong to these two commands alone). Every string a repository or a command gives is shown
escaped (``terminal.one_line``, through ``render``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from ckptrepo import errors
from ckptrepo.types import short_id

from . import render, terminal
from .options import BranchOpt, JsonOpt, MessageOpt
from .session import current

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.table import Table

    from ckptrepo.types import InterpolationPoint

METHODS = ("average", "weighted", "task-arithmetic", "ties", "slerp")
MAX_TIMEOUT = 366 * 86400.0

MergeRevsArg = Annotated[
    list[str],
    typer.Argument(metavar="REV...", help="The commits to merge, in order: the first is the merge's first parent.",
                   show_default=False),
]
MethodOpt = Annotated[
    str,
    typer.Option("--method", metavar="|".join(METHODS), help="average: the mean; weighted: sum w_i x_i / sum w_i; "
                 "task-arithmetic: base + lambda * sum w_i (x_i - base); ties: task vectors trimmed to their "
                 "--density largest entries, signs elected, agreeing entries averaged, times lambda, added to the "
                 "base; slerp: spherical interpolation between two commits at --t.", show_default=False),
]
BaseOpt = Annotated[
    str | None,
    typer.Option("--base", metavar="REV", help="The commit the inputs were fine-tuned from (task-arithmetic, ties); "
                 "recorded as a transfer edge.", show_default=False),
]
WeightsOpt = Annotated[
    list[str] | None,
    typer.Option("--weights", metavar="W", help="One weight per input, in order: --weights 0.3,0.7 (or the option "
                 "repeated). weighted: required; task-arithmetic, ties: default 1 each.", show_default=False),
]
DensityOpt = Annotated[
    float | None,
    typer.Option("--density", metavar="D", help="ties: the share of each task vector's entries kept, by magnitude "
                 "(0 < D <= 1; default 1: none trimmed).", show_default=False),
]
LambdaOpt = Annotated[
    float | None,
    typer.Option("--lambda", metavar="L", help="task-arithmetic, ties: scale of the merged task vector (default 1).",
                 show_default=False),
]
TOpt = Annotated[
    float | None,
    typer.Option("--t", "-t", metavar="T", help="slerp: where between the two commits (0: the first, 1: the "
                 "second).", show_default=False),
]
NoRepackOpt = Annotated[
    bool,
    typer.Option("--no-repack", help="Leave the merge's new chunks as stored (raw) instead of encoding them before "
                 "returning; `ckpt repack` encodes them later."),
]
ARev = Annotated[str, typer.Argument(metavar="A", help="The line's start (t = 0).", show_default=False)]
BRev = Annotated[str, typer.Argument(metavar="B", help="The line's end (t = 1).", show_default=False)]
PointsOpt = Annotated[
    int, typer.Option("--points", min=2, max=10_000, metavar="N", help="Evenly spaced points from t = 0 to 1.")
]
LineRunOpt = Annotated[
    str,
    typer.Option("--run", metavar="CMD", help="Shell command run on each state, written to a private temporary "
                 ".safetensors file: {path} is replaced (shell-quoted), and given in the environment as for "
                 '`ckpt eval`. The last line of its stdout must be a JSON object of metrics, e.g. {"loss": 0.31}.',
                 show_default=False),
]
LineTimeoutOpt = Annotated[
    float | None,
    typer.Option("--timeout", min=0.001, max=MAX_TIMEOUT, metavar="S",
                 help="Kill a command (and what it started) after S seconds.", show_default=False),
]


def _weights(values: list[str] | None) -> list[float] | None:
    """``--weights`` given as ``0.3,0.7`` and/or repeated, as numbers."""
    if not values:
        return None
    out: list[float] = []
    for value in values:
        for part in value.replace(",", " ").split():
            try:
                number = float(part)
            except ValueError:
                raise errors.UsageError(f"--weights: {terminal.one_line(part)!r} is not a number",
                                        hint="e.g. --weights 0.3,0.7") from None
            if not math.isfinite(number):
                raise errors.UsageError(f"--weights: {part} is not a finite number")
            out.append(number)
    return out


# -- merge ------------------------------------------------------------------------------------------


def merge(
    revs: MergeRevsArg,
    method: MethodOpt = "",
    base: BaseOpt = None,
    weights: WeightsOpt = None,
    density: DensityOpt = None,
    lam: LambdaOpt = None,
    t: TOpt = None,
    branch: BranchOpt = None,
    message: MessageOpt = None,
    no_repack: NoRepackOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Merge the weights of commits into a new commit (default: on the current branch).

    Tensor by tensor (a few tensors in memory, never a model), with mergekit's formulas in fp32,
    cast back to each tensor's dtype. The new commit's parents are REV... in order (merge edges),
    with a transfer edge from --base; its config records the method, inputs and parameters.
    A tensor all inputs hold unchanged is copied (and deduplicates); integer and bool tensors
    must be equal and are copied. Inputs missing a tensor, or holding it with another shape or
    dtype, are refused before anything is written. The merge is stored raw, then encoded
    before the command returns (--no-repack: later, by `ckpt repack`).

        ckpt merge main ft-a ft-b --method ties --base main --density 0.2 -b merged
    """
    if not method:
        raise errors.UsageError("merge needs --method", hint=f"One of {', '.join(METHODS)}.")
    with current().open() as repo, render.phases(enabled=not as_json) as phase:
        phase(f"merging {len(revs)} commit(s) ({method})")
        commit = repo.merge_weights(revs, method=method, base=base, weights=_weights(weights), density=density,
                                    lam=lam, t=t, branch=branch, message=message)
        if not no_repack and repo.repack_pending()[0]:
            phase("encoding the merge's chunks (repack)")
            repo.repack()
    if as_json:
        render.emit_json(commit.to_json())
        return
    text = Text("merged ").append(commit.short_id, style="bold yellow")
    if commit.branch:
        text.append(f" on {terminal.one_line(commit.branch)}")
    text.append(f" ({terminal.one_line(method)} of {len(revs)}): {commit.n_tensors} tensors, "
                f"{render.size(commit.logical_bytes)} logical, {render.size(commit.new_bytes)} new")
    render.out.print(text, soft_wrap=True)


# -- interpolate ------------------------------------------------------------------------------------


def interpolate(
    a: ARev,
    b: BRev,
    run: LineRunOpt = "",
    points: PointsOpt = 11,
    timeout: LineTimeoutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate the straight line (1 - t) A + t B between two commits' weights (mode connectivity).

    At --points evenly spaced t from 0 to 1 the interpolated state (floats merged in fp32, the
    rest A's; at t = 0 and 1 the commits themselves) is written a tensor at a time to a private
    temporary .safetensors file and CMD runs on it, printing a JSON object of metrics on its last
    line of stdout; the table gives t -> metrics. The states are not committed. A command that
    fails at a point is reported there and the others go on; the exit status is then 1.

        ckpt interpolate main ft --points 11 --run 'python3 eval.py {path}'
    """
    if not run.strip():
        raise errors.UsageError("interpolate needs the command to run: --run CMD",
                                hint="e.g. ckpt interpolate A B --run 'python3 eval.py {path}'")
    with current().open() as repo, render.phases(enabled=not as_json) as phase:
        ids = (repo.resolve(a), repo.resolve(b))

        def shown(point: InterpolationPoint) -> None:
            phase(f"evaluated t = {point.t:g}")

        found = repo.interpolate(a, b, points=points, run=run, timeout=timeout, on_point=shown)
    failed = sum(not p.ok for p in found)
    if as_json:
        render.emit_json({"a": ids[0], "b": ids[1], "points": [p.to_json() for p in found]})
    else:
        render.out.print(Text(f"{short_id(ids[0])} (t = 0) -> {short_id(ids[1])} (t = 1), "
                              f"{len(found)} points, not committed"), soft_wrap=True)
        render.out.print(_line_table(found))
    if failed:
        raise errors.EvaluationFailed(failed=failed, count=len(found))


def _line_table(found: Sequence[InterpolationPoint]) -> Table:
    """t, one column per metric name (sorted), the seconds it took, and why a point failed."""
    from rich import box
    from rich.table import Table

    names = sorted({name for p in found for name in p.metrics})
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("t", justify="right", no_wrap=True)
    for name in names:
        table.add_column(terminal.one_line(name), justify="right", no_wrap=True)
    table.add_column("time", justify="right", no_wrap=True, style="dim")
    errors_shown = any(not p.ok for p in found)
    if errors_shown:
        table.add_column("error", overflow="fold")
    for p in found:
        row = [f"{p.t:.4g}", *(f"{p.metrics[n]:.6g}" if n in p.metrics else "" for n in names),
               render.seconds(p.seconds)]
        if errors_shown:
            row.append(terminal.one_line(p.error or ""))
        table.add_row(*row)
    return table
