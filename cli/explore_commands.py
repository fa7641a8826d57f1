"""Commands that explore a lineage after the fact by running things on it: ``eval`` (a command on
each commit's state, its results recorded as annotations) and ``bisect`` (the first commit of a
first-parent line where a predicate turns true).

Thin over ``Repo.evaluate_command`` and ``Repo.bisect``. Their options are declared here (they
belong to these two commands alone). Results print as they are known: one line per commit or
test on stdout, a progress bar on stderr (on a terminal only); ``--json`` prints one document
at the end instead. Every string a repository or a command gives is shown escaped
(``terminal.one_line``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from ckptrepo import errors
from ckptrepo.types import BisectResult, BisectStep, EvalResult, short_id

from . import render, terminal
from .options import MAX_COUNT, JsonOpt
from .session import current

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from rich.table import Table

    from ckptrepo.types import TensorDelta

# -- options (these two commands') ------------------------------------------------------------------

EVAL_FORMATS = ("safetensors", "torch", "dcp")
MAX_TIMEOUT = 366 * 86400.0

EvalRevsArg = Annotated[
    list[str] | None,
    typer.Argument(metavar="[REV]...", help="Commits to evaluate (any revisions), in this order. Or --along.",
                   show_default=False),
]
EvalAlongOpt = Annotated[
    str | None,
    typer.Option("--along", metavar="BRANCH", help="Evaluate the commits of BRANCH's first-parent line (any "
                 "revision), oldest first.", show_default=False),
]
EveryOpt = Annotated[
    int,
    typer.Option("--every", min=1, max=MAX_COUNT, metavar="N", help="With --along: every N-th commit, counted from "
                 "the head (which is always evaluated)."),
]
EvalRunOpt = Annotated[
    str,
    typer.Option("--run", metavar="CMD", help="Shell command run on each commit's state: {path} (the exported file "
                 "or folder), {rev} (full commit id) and {step} are replaced, shell-quoted, and given as "
                 "CKPT_EVAL_PATH, CKPT_EVAL_REV and CKPT_EVAL_STEP. The last line of its stdout must be a JSON "
                 'object of metrics, e.g. {"acc": 0.91}.', show_default=False),
]
RunFormatOpt = Annotated[
    str,
    typer.Option("--format", metavar="safetensors|torch|dcp", help="How each state is written for the command: "
                 "a .safetensors file, a torch.save file, or a torch.distributed.checkpoint folder."),
]
JobsOpt = Annotated[int, typer.Option("--jobs", "-j", min=1, max=256, metavar="N", help="Run N commands at once.")]
TimeoutOpt = Annotated[
    float | None,
    typer.Option("--timeout", min=0.001, max=MAX_TIMEOUT, metavar="S",
                 help="Kill a command (and what it started) after S seconds.", show_default=False),
]
EvalForceOpt = Annotated[
    bool, typer.Option("--force", "-f", help="Also evaluate commits that already have results from this command.")
]
SourceOpt = Annotated[
    str | None,
    typer.Option("--source", metavar="TEXT", help="Label of the recorded results (default: eval: CMD); commits "
                 "with results from it are skipped.", show_default=False),
]
GoodArg = Annotated[str, typer.Argument(metavar="GOOD", help="A commit where the predicate is false (an older "
                                        "commit of BAD's first-parent line).", show_default=False)]
BadArg = Annotated[str, typer.Argument(metavar="BAD", help="A commit where the predicate is true.",
                                       show_default=False)]
BisectWhereOpt = Annotated[
    str | None,
    typer.Option("--where", "-w", metavar="EXPR", help="Bad where EXPR holds, e.g. \"val_loss > 3\": the "
                 "where-language of `ckpt log` (fields, metrics, annotations). Reads no tensor bytes.",
                 show_default=False),
]
BisectStatOpt = Annotated[
    str | None,
    typer.Option("--stat", metavar="GLOB:STAT[OP X]", help="Bad where some tensor named like GLOB has a stored "
                 "statistic that satisfies it: '*:nan', '*:inf', '*.weight:abs_max>1e4', 'head.*:norm<1e-6' "
                 "(mean, std, min, max, norm, abs_max, numel, nan, inf; < <= > >= == !=). Reads no tensor bytes.",
                 show_default=False),
]
BisectRunOpt = Annotated[
    str | None,
    typer.Option("--run", metavar="CMD", help="Bad where CMD, run on the commit's exported state as `ckpt eval "
                 "--run` does, exits nonzero: 0 good, 125 skip (cannot test), other statuses bad.",
                 show_default=False),
]
TopTensorsOpt = Annotated[
    int, typer.Option("--top", min=0, max=10_000, metavar="N", help="Show the N tensors that changed most there.")
]


# -- eval -------------------------------------------------------------------------------------------


def eval_(
    revs: EvalRevsArg = None,
    run: EvalRunOpt = "",
    along: EvalAlongOpt = None,
    every: EveryOpt = 1,
    fmt: RunFormatOpt = "safetensors",
    jobs: JobsOpt = 1,
    timeout: TimeoutOpt = None,
    force: EvalForceOpt = False,
    source: SourceOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run a command on commits' states and record the metrics it prints as annotations.

    Each commit (REV..., or --along BRANCH [--every N]) is exported in --format into a private
    temporary folder (removed afterwards), and CMD runs with {path}, {rev} and {step} filled in.
    The JSON object on the last line of its stdout is recorded on the commit (`ckpt show`, `log
    --where`, `best` see it), labelled `eval: CMD`. Commits that already have results from the
    same command are skipped (--force runs them again), and so are pruned or damaged ones. A
    command that fails (exit status, --timeout, no JSON object of numbers on its last line) is
    reported with the end of its stderr and the others go on; the exit status is then 1.

        ckpt eval --along main --every 10 -j 2 --run 'python3 eval.py {path}'
    """
    if fmt not in EVAL_FORMATS:
        raise errors.UsageError(f"unknown --format {fmt!r}", hint=f"Use one of {', '.join(EVAL_FORMATS)}.")
    if not run.strip():
        raise errors.UsageError("eval needs the command to run: --run CMD",
                                hint="e.g. ckpt eval main --run 'python3 eval.py {path}'")
    if bool(revs) == (along is not None):
        raise errors.UsageError("eval takes commits to evaluate: REV... or --along BRANCH (one of them)",
                                hint="e.g. ckpt eval main~3 main --run CMD, or ckpt eval --along main --every 10 "
                                "--run CMD")
    if every != 1 and along is None:
        raise errors.UsageError("--every picks commits of --along BRANCH", hint="Give --along BRANCH with it.")
    lock = threading.Lock()
    with _stop_on_sigterm(), current().open() as repo, _progress(as_json) as advance:
        def shown(result: EvalResult) -> None:
            with lock:
                if not as_json:
                    render.out.print(_result_line(result), soft_wrap=True)
                    if result.status == "failed" and result.stderr:
                        render.out.print(Text(_indented(result.stderr), style="dim"), soft_wrap=True)
                advance(result)

        results = repo.evaluate_command(run, revs or None, along=along, every=every, format=fmt, jobs=jobs,
                                        timeout=timeout, source=source, force=force, on_result=shown)
    counts = {k: sum(r.status == k for r in results) for k in ("ok", "skipped", "failed")}
    if as_json:
        render.emit_json({"source": results[0].source if results else source, "counts": counts,
                          "results": [r.to_json() for r in results]})
    else:
        render.out.print(f"{len(results)} commit(s): {counts['ok']} evaluated, {counts['skipped']} skipped, "
                         f"{counts['failed']} failed", markup=False)
    if counts["failed"]:
        raise errors.EvaluationFailed(failed=counts["failed"], count=len(results))


@contextmanager
def _stop_on_sigterm() -> Iterator[None]:
    """While the block runs, SIGTERM (a job scheduler ending the job, `kill PID`) interrupts it as
    Ctrl-C does: the commands started are killed and the temporary folder removed before exiting.
    (The commands run in process groups of their own, which neither signal reaches.)"""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


_STATUS = {"ok": ("ok", "green"), "skipped": ("skipped", "dim"), "failed": ("FAILED", "bold red")}


def _result_line(result: EvalResult) -> Text:
    word, style = _STATUS[result.status]
    text = Text(f"{word:<8}", style=style).append(result.short_id, style="yellow")
    text.append(f"  step {result.step}" if result.step is not None else "")
    if result.ok:
        text.append("  " + render.metrics(result.metrics)).append(f"  ({render.seconds(result.seconds)})", style="dim")
    elif result.reason:
        text.append("  ").append(terminal.one_line(result.reason))
    return text


def _indented(stderr: str) -> str:
    return "\n".join("        | " + terminal.one_line(line) for line in stderr.splitlines())


@contextmanager
def _progress(as_json: bool, total: int | None = None) -> Iterator[Callable[[EvalResult], None]]:
    """A progress bar on stderr (a terminal only) counting results; yields the call made per result."""
    if not render.err.is_terminal:
        yield lambda _result: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("evaluating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=render.err, transient=True, redirect_stdout=not as_json) as bar:
        task = bar.add_task("eval", total=total)

        def advance(result: EvalResult) -> None:
            bar.advance(task)

        yield advance


# -- bisect -----------------------------------------------------------------------------------------


def bisect(
    good: GoodArg,
    bad: BadArg,
    where: BisectWhereOpt = None,
    stat: BisectStatOpt = None,
    run: BisectRunOpt = None,
    fmt: RunFormatOpt = "safetensors",
    timeout: TimeoutOpt = None,
    top: TopTensorsOpt = 10,
    as_json: JsonOpt = False,
) -> None:
    """Find the first commit between GOOD and BAD where a predicate turns true.

    Searches BAD's first-parent line after GOOD (GOOD must be on it) by binary search,
    assuming that once true the predicate stays true; one of --where EXPR (metrics and
    annotations), --stat 'GLOB:STAT[OP X]' (stored tensor statistics; both read no tensor
    bytes) or --run CMD (exit status 0 good, 125 skip, other bad; about log2(n) runs, each
    tested commit exported as for `ckpt eval`). The predicate must be false at GOOD and true
    at BAD. Prints each test, the commit found and the tensors whose statistics changed most
    there against its first parent.

        ckpt bisect main~500 main --stat '*:nan'
    """
    if fmt not in EVAL_FORMATS:
        raise errors.UsageError(f"unknown --format {fmt!r}", hint=f"Use one of {', '.join(EVAL_FORMATS)}.")
    with _stop_on_sigterm(), current().open() as repo:
        result = repo.bisect(good, bad, where=where, stat=stat, run=run, format=fmt, timeout=timeout, top=top,
                             on_step=None if as_json else _print_step)
        found = repo.get_commit(result.first_bad)
    if as_json:
        render.emit_json({**result.to_json(), "first_bad_commit": found.to_json()})
        return
    render.out.print(_found(result, found.message), soft_wrap=True)
    if result.changed:
        render.out.print(f"changed most from {short_id(result.parent)} to {short_id(result.first_bad)} (stored "
                         "statistics):", markup=False)
        render.out.print(_changed_table(result.changed))


def _print_step(step: BisectStep) -> None:
    word = {"good": ("good", "green"), "bad": ("bad", "red"), "skip": ("skip", "dim")}[step.verdict]
    text = Text(f"{word[0]:<5}", style=word[1]).append(step.short_id, style="yellow")
    text.append(f"  step {step.step}" if step.step is not None else "")
    if step.detail:
        text.append(f"  {terminal.one_line(step.detail)}", style="dim")
    text.append(f"  {step.remaining} commit(s) left", style="dim")
    render.out.print(text, soft_wrap=True)


def _found(result: BisectResult, message: str) -> Text:
    title = message.splitlines()[0] if message else ""
    if result.found:
        text = Text("first bad commit: ").append(short_id(result.first_bad), style="bold yellow")
        text.append(f" (step {result.first_bad_step})" if result.first_bad_step is not None else "")
        text.append(f"  {terminal.one_line(title)}" if title else "")
    else:
        text = Text("the first bad commit is one of: ")
        text.append(", ".join(short_id(c) for c in result.candidates), style="bold yellow")
        text.append(" (commits that could not be tested are among them)")
    text.append(f"\n{result.commits} commit(s) after GOOD, {result.steps} tested "
                f"({terminal.one_line(result.predicate)})", style="dim")
    return text


def _changed_table(deltas: Sequence[TensorDelta]) -> Table:
    """The tensors that changed most: status, name, NaN and Inf counts (with their change), the
    relative change of the L2 norm, and the changes of abs-max, mean and std."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column("tensor", overflow="fold")
    for name in ("nan", "inf", "Δl2", "Δabs_max", "Δmean", "Δstd"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("note", overflow="fold", style="dim")
    for d in deltas:
        mark = {"changed": ("~", "yellow"), "added": ("+", "green"), "removed": ("-", "red")}.get(d.status, ("=", ""))
        side = d.b or d.a
        assert side is not None  # a changed, added or removed tensor
        nan, inf = side.stats.nan_count, side.stats.inf_count
        if d.a is not None and d.b is not None:
            nan_text = f"{nan} ({nan - d.a.stats.nan_count:+d})" if nan or d.a.stats.nan_count else ""
            inf_text = f"{inf} ({inf - d.a.stats.inf_count:+d})" if inf or d.a.stats.inf_count else ""
            na, nb = d.a.stats.l2_norm, d.b.stats.l2_norm
            rel = f"{100 * (nb - na) / na:+.3g}%" if na and nb is not None else ""
            moved = d.deltas
            figures = [rel, *(render.num(moved.get(k), signed=True) for k in ("abs_max", "mean", "std"))]
        else:
            nan_text, inf_text = (str(nan) if nan else ""), (str(inf) if inf else "")
            figures = ["", "", "", ""]
        table.add_row(Text(mark[0], style=mark[1]), render.plain(d.name), nan_text, inf_text, *figures,
                      render.plain(render.diff_note(d)))
    return table
