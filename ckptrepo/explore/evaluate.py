"""Evaluation runs over commits (``Repo.evaluate``, ``Repo.evaluate_command``, ``ckpt eval``): each
commit's state is handed to a function or written to a file for a command, and what comes back
is recorded as annotations of the commit, with its source.

Which commits: revisions given (``resolve_targets``), or every ``every``-th commit of a branch's
first-parent line counted from its head, oldest first (``line_targets``). Skipped without
running anything: a commit that already has results from the same source (unless ``force``),
and one whose data is pruned or damaged (``unreadable``); each such commit still gets a result
saying why.

Commands (``run_commands``): up to ``jobs`` at once; states are written ahead, at most
``jobs + 1`` of them on disk at once, each in its own subfolder of one private temporary folder
(``runner.Workspace``), removed once its command is done, the folder at the end. A failing
command (exit status, timeout, a last line of stdout that is no JSON object of numbers) or a
failing export gives a ``failed`` result for that commit, and the others go on. Functions
(``run_function``): one commit at a time, in this thread; what the function raises is raised.

Everything the facade owns comes in as callables (export, checkout, recording annotations,
asking for the sources a commit's annotations have), so this module never imports ``Repo``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from operator import itemgetter
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from ckptrepo.db import lines
from ckptrepo.db.models import Commit as CommitRow
from ckptrepo.errors import CkptError, CommitDamaged, CommitPruned, UsageError
from ckptrepo.explore import runner
from ckptrepo.ledger.journal import MAX_NOTE
from ckptrepo.lineage import revparse
from ckptrepo.types import Commit, EvalResult

Export = Callable[[str, Path], None]  # (commit id, path): write that commit's state at path
Record = Callable[[str, Mapping[str, float], str], None]  # (commit id, metrics, source): annotate
OnResult = Callable[[EvalResult], None]


def resolve_targets(session: Session, revs: Sequence[str]) -> list[str]:
    """The full ids of ``revs``, in the order given, each once (UnknownRevision for a bad one)."""
    out: dict[str, None] = {}
    for rev in revs:
        out.setdefault(revparse.resolve(session, rev), None)
    return list(out)


def line_targets(session: Session, along: str, every: int = 1) -> list[str]:
    """The ids of every ``every``-th commit of ``along``'s first-parent line, counted from its head
    (the head always among them), oldest first. One index range per line (``db.lines``)."""
    head = revparse.resolve(session, along)
    rows = session.execute(lines.chain_commits(head, None, CommitRow.id)).all()
    return [cid for depth, cid in sorted(rows, key=itemgetter(0), reverse=True) if depth % every == 0]


def unreadable(commit: Commit) -> str | None:
    """Why the state of ``commit`` cannot be read (pruned, damaged), else None."""
    if commit.pruned:
        return "pruned: retention dropped its data (its metadata and statistics are kept)"
    if commit.damage is not None:
        return f"damaged: {commit.damage}"
    return None


def _skipped(commit: Commit, source: str, reason: str) -> EvalResult:
    return EvalResult(commit.id, commit.step, "skipped", source, reason=reason)


def _skip_reason(commit: Commit, source: str, done: Callable[[str], Collection[str]], force: bool) -> str | None:
    why = unreadable(commit)
    if why is not None:
        return why
    if not force and source in done(commit.id):
        return "already has results from this source (force to run it again)"
    return None


# -- commands ------------------------------------------------------------------------------------


def run_commands(commits: Sequence[Commit], command: str | Sequence[str], *, source: str, fmt: str, jobs: int,
                 timeout: float | None, export: Export, record: Record, done: Callable[[str], Collection[str]],
                 force: bool = False, on_result: OnResult | None = None) -> list[EvalResult]:
    """Run ``command`` on each of ``commits`` (see the module docstring); results in the order of
    ``commits``. ``export(commit_id, path)`` writes a state in ``fmt`` at ``path``;
    ``record(commit_id, metrics, source)`` annotates; ``done(commit_id)`` gives the sources of its
    annotations. ``on_result`` is called once per commit as its result is known, one call at a
    time (from worker threads). Interrupted (KeyboardInterrupt), the running commands are killed
    and the temporary folder removed before it is raised again."""
    results: list[EvalResult | None] = [None] * len(commits)
    lock = threading.Lock()

    def deliver(i: int, result: EvalResult) -> None:
        with lock:
            results[i] = result
            if on_result is not None:
                on_result(result)

    work: list[tuple[int, Commit]] = []
    for i, commit in enumerate(commits):
        why = _skip_reason(commit, source, done, force)
        if why is not None:
            deliver(i, _skipped(commit, source, why))
        else:
            work.append((i, commit))
    if work:
        _pipeline(work, command, source=source, fmt=fmt, jobs=jobs, timeout=timeout, export=export, record=record,
                  deliver=deliver)
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def _pipeline(work: list[tuple[int, Commit]], command: str | Sequence[str], *, source: str, fmt: str, jobs: int,
              timeout: float | None, export: Export, record: Record,
              deliver: Callable[[int, EvalResult], None]) -> None:
    """Exports run ahead of the commands (at most ``jobs + 1`` states on disk), ``jobs`` commands at once."""
    with runner.private_folder() as root, ThreadPoolExecutor(jobs, "ckpt-eval-export") as exporters, \
            ThreadPoolExecutor(jobs, "ckpt-eval-run") as runners:
        space = runner.Workspace(root)
        ahead = threading.BoundedSemaphore(jobs + 1)
        futures: list[Future[None]] = []

        def timed_export(cid: str, path: Path) -> float:
            started = time.perf_counter()
            export(cid, path)
            return time.perf_counter() - started

        def finish(i: int, commit: Commit, exported: Future[float], path: Path) -> None:
            try:
                deliver(i, _evaluated(commit, exported, path, command, source=source, timeout=timeout,
                                      record=record))
            finally:
                space.release(path)

        try:
            for i, commit in work:
                ahead.acquire()
                path = space.claim(fmt)
                exported = exporters.submit(timed_export, commit.id, path)
                future = runners.submit(finish, i, commit, exported, path)
                future.add_done_callback(lambda _f: ahead.release())
                futures.append(future)
            for future in futures:
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            runner.stop_all()
            raise


def _evaluated(commit: Commit, exported: Future[float], path: Path, command: str | Sequence[str], *, source: str,
               timeout: float | None, record: Record) -> EvalResult:
    """The result of one commit whose state ``exported`` is writing at ``path``: the command run on
    it, its metrics recorded."""
    try:
        export_s = exported.result()
    except (CommitPruned, CommitDamaged) as exc:
        return _skipped(commit, source, str(exc))
    except (CkptError, OSError) as exc:
        return EvalResult(commit.id, commit.step, "failed", source, reason=f"export failed: {exc}")
    outcome = runner.run_command(command, path, rev=commit.id, step=commit.step, timeout=timeout)
    seconds = export_s + outcome.seconds
    if outcome.metrics is None:
        return EvalResult(commit.id, commit.step, "failed", source, reason=outcome.error, stderr=outcome.stderr_tail,
                          returncode=outcome.returncode, seconds=seconds)
    started = time.perf_counter()
    try:
        record(commit.id, outcome.metrics, source)
    except CkptError as exc:
        return EvalResult(commit.id, commit.step, "failed", source, reason=f"not recorded: {exc}",
                          stderr=outcome.stderr_tail, returncode=outcome.returncode, seconds=seconds)
    return EvalResult(commit.id, commit.step, "ok", source, metrics=outcome.metrics, returncode=outcome.returncode,
                      seconds=seconds + time.perf_counter() - started)


# -- functions -------------------------------------------------------------------------------------


def run_function(commits: Sequence[Commit], fn: Callable[[Any, Commit], Mapping[str, float]], *, source: str,
                 checkout: Callable[[str], Any], record: Record, done: Callable[[str], Collection[str]],
                 force: bool = False, on_result: OnResult | None = None) -> list[EvalResult]:
    """``fn(state, commit)`` for each of ``commits`` (state: ``checkout(commit_id)``), what it
    returns recorded (``record``), one commit at a time, in order. A commit already evaluated by
    ``source`` (unless ``force``), pruned or damaged is skipped with a result saying why. What
    ``fn`` or the recording raises is raised: the commits before it keep their results (a run
    again skips them)."""
    results: list[EvalResult] = []
    for commit in commits:
        why = _skip_reason(commit, source, done, force)
        if why is None:
            started = time.perf_counter()
            try:
                state = checkout(commit.id)
            except (CommitPruned, CommitDamaged) as exc:
                why = str(exc)
            else:
                metrics = fn(state, commit)
                del state
                if not isinstance(metrics, Mapping):
                    raise TypeError(f"the evaluation function returned {type(metrics).__name__}, not a mapping of "
                                    "metric names to numbers")
                values = dict(metrics)
                record(commit.id, values, source)
                result = EvalResult(commit.id, commit.step, "ok", source,
                                    metrics={k: float(v) for k, v in values.items()},
                                    seconds=time.perf_counter() - started)
        if why is not None:
            result = _skipped(commit, source, why)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def sources_of(annotations: Sequence[Any]) -> set[str]:
    """The sources of a commit's annotations (``Repo.annotations``), those that name one."""
    return {a.source for a in annotations if a.source is not None}



def check_source(source: str) -> None:
    """UsageError unless ``source`` can label annotations: a string of 1 to ``MAX_NOTE`` characters."""
    if not isinstance(source, str) or not source or len(source) > MAX_NOTE:
        raise UsageError(f"the source of the results must be a string of 1 to {MAX_NOTE} characters",
                         hint="A long command: give a shorter source= (ckpt eval --source TEXT).")
