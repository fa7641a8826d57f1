"""Bisecting a first-parent line (``Repo.bisect``, ``ckpt bisect GOOD BAD``): the first commit after
GOOD, up to BAD, at which a predicate turns true.

The line: BAD's first-parent chain back to GOOD (``first_parent_line``: GOOD's and BAD's places
on the first-parent lines give its length, then one bounded read of the chain, ``db.lines``);
GOOD must be on it (NotOnFirstParentLine). The predicate is tested at both ends first (false at
GOOD, true at BAD, else BisectEndpoint), then by binary search (``search``): the midpoint of the
commits that may still be the first bad one, or, when that one could not be tested (``skip``),
the nearest that can. Like ``git bisect`` it assumes a predicate that, once true, stays true;
otherwise it still ends at a commit where it turns true (false at its first parent). Tests:
about log2(n) + 2.

Predicates: ``explore.predicates`` for ``--where`` and ``--stat`` (rows only), or a command
(``command_test``): its state written as for ``ckpt eval``, exit status 0 good, 125 skip, any
other bad; a command that cannot start, times out or is killed stops the bisect
(BisectAborted). Pruned and damaged commits are skipped by a command (their state is gone).

What changed at the commit found: ``ranked_changes`` of the stored-statistics diff from its
first parent (no tensor bytes read): tensors that gained NaN or Inf values first, then by the
relative change of their L2 norm, then the share of chunks that changed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from ckptrepo.db import lines
from ckptrepo.db.models import Commit as CommitRow
from ckptrepo.errors import BisectAborted, BisectEndpoint, CommitDamaged, CommitPruned, NotOnFirstParentLine
from ckptrepo.explore import runner
from ckptrepo.explore.evaluate import Export
from ckptrepo.ids import short
from ckptrepo.lineage import revparse
from ckptrepo.types import BisectResult, BisectStep, Diff, TensorDelta, TensorInfo


class LineCommit(NamedTuple):
    """A commit of the bisected line: id, step, and why its state cannot be read (None: it can)."""

    id: str
    step: int | None
    unreadable: str | None


Verdict = tuple[str, str | None]  # ("good" | "bad" | "skip", detail)
Test = Callable[[LineCommit], Verdict]
OnStep = Callable[[BisectStep], None]


def first_parent_line(session: Session, good: str, bad: str) -> list[LineCommit]:
    """The commits from ``good`` (first) to ``bad`` (last) along ``bad``'s first parents, each the
    first parent of the next. UnknownRevision for a bad revision; NotOnFirstParentLine when
    ``good`` is not an older commit of that line."""
    good_id, bad_id = revparse.resolve(session, good), revparse.resolve(session, bad)
    query = select(CommitRow.id, CommitRow.fp_depth).where(CommitRow.id.in_([good_id, bad_id]))
    depths: dict[str, int] = {cid: depth for cid, depth in session.execute(query)}
    span = depths[bad_id] - depths[good_id]
    if good_id == bad_id or span <= 0:
        raise NotOnFirstParentLine(good=short(good_id), bad=short(bad_id))
    chain = lines.chain_commits(bad_id, span + 1, CommitRow.id, CommitRow.step, CommitRow.pruned, CommitRow.damage)
    rows = sorted(session.execute(chain), key=lambda row: row[0], reverse=True)
    if len(rows) != span + 1 or rows[0][1] != good_id:
        raise NotOnFirstParentLine(good=short(good_id), bad=short(bad_id))
    return [LineCommit(cid, step, _unreadable(bool(pruned), damage)) for _, cid, step, pruned, damage in rows]


def _unreadable(pruned: bool, damage: str | None) -> str | None:
    if pruned:
        return "pruned: retention dropped its data"
    return None if damage is None else f"damaged: {damage}"


def boolean_test(holds: Callable[[str], bool]) -> Test:
    """A test from a predicate of commit ids (``predicates.where_test``, ``stat_test``): true is bad."""
    return lambda commit: ("bad", None) if holds(commit.id) else ("good", None)


def command_test(command: str | Sequence[str], *, fmt: str, timeout: float | None, export: Export) -> Test:
    """A test that writes each commit's state in ``fmt`` (``export(commit_id, path)``) into a private
    temporary folder and runs ``command`` on it (``runner.run_command``, placeholders and
    environment as for ``ckpt eval``): exit status 0 good, 125 skip, any other bad. A commit whose
    state cannot be read is skipped; BisectAborted when the command cannot start, times out or is
    killed by a signal."""

    def test(commit: LineCommit) -> Verdict:
        if commit.unreadable is not None:
            return "skip", commit.unreadable
        with runner.private_folder(prefix="ckpt-bisect-") as folder:
            path = runner.state_path(folder, fmt)
            try:
                export(commit.id, path)
            except (CommitPruned, CommitDamaged) as exc:
                return "skip", str(exc)
            outcome = runner.run_command(command, path, rev=commit.id, step=commit.step, timeout=timeout,
                                         parse=False)
        code = outcome.returncode
        if code is None or code < 0:
            raise BisectAborted(commit=short(commit.id), why=outcome.error or "failed")
        if code == 0:
            return "good", "exit status 0"
        return ("skip" if code == 125 else "bad"), f"exit status {code}"

    return test


def search(line: Sequence[LineCommit], test: Test, on_step: OnStep | None = None) -> tuple[int, list[int],
                                                                                           list[BisectStep]]:
    """Binary search of ``line`` (``first_parent_line``) for the first commit ``test`` calls bad:
    ``(its index, the indices that may be it, the steps tested)``. The ends are tested first:
    BisectEndpoint unless ``line[0]`` is good and ``line[-1]`` bad. The candidates are more than
    the one index only when commits between the last good and first bad ones were skipped."""
    steps: list[BisectStep] = []
    lo, hi = 0, len(line) - 1

    def probe(i: int) -> tuple[str, str | None, float]:
        started = time.perf_counter()
        verdict, detail = test(line[i])
        return verdict, detail, time.perf_counter() - started

    def note(i: int, verdict: str, detail: str | None, seconds: float) -> None:
        step = BisectStep(line[i].id, line[i].step, verdict, detail, hi - lo, seconds)
        steps.append(step)
        if on_step is not None:
            on_step(step)

    for i, wanted, end in ((0, "good", "GOOD"), (hi, "bad", "BAD")):
        found, detail, seconds = probe(i)
        note(i, found, detail, seconds)
        if found != wanted:
            c = line[i]
            at = f"{end} {short(c.id)}" + (f" (step {c.step})" if c.step is not None else "")
            raise BisectEndpoint(f"the predicate is {found} at {at}" + (f" ({detail})" if detail else "")
                                 + f", where bisect needs it {wanted}")
    skipped: set[int] = set()
    while (pick := _next(lo, hi, skipped)) is not None:
        i = pick
        verdict, detail, seconds = probe(i)
        if verdict == "good":
            lo = i
        elif verdict == "bad":
            hi = i
        else:
            skipped.add(i)
        note(i, verdict, detail, seconds)
    candidates = [i for i in range(lo + 1, hi) if i in skipped] + [hi]
    return hi, candidates, steps


def _next(lo: int, hi: int, skipped: set[int]) -> int | None:
    """The untested index strictly between ``lo`` and ``hi`` nearest their midpoint (None: none left)."""
    mid = (lo + hi) // 2
    for offset in range(hi - lo):
        for i in (mid - offset, mid + offset + 1):
            if lo < i < hi and i not in skipped:
                return i
    return None


def _nonfinite(info: TensorInfo | None) -> int:
    return 0 if info is None else info.stats.nan_count + info.stats.inf_count


def magnitude(delta: TensorDelta) -> float:
    """How much a tensor changed, in [0, 1]: |Δ‖x‖₂| / max(‖a‖₂, ‖b‖₂) of the stored norms; 1 when
    added or removed or when only one side has a norm, 0 when unchanged or neither has one."""
    if delta.status == "unchanged":
        return 0.0
    if delta.a is None or delta.b is None:
        return 1.0
    na, nb = delta.a.stats.l2_norm, delta.b.stats.l2_norm
    if na is None or nb is None:
        return 0.0 if na is None and nb is None else 1.0
    if not (math.isfinite(na) and math.isfinite(nb)):
        return 1.0
    top = max(abs(na), abs(nb))
    return abs(nb - na) / top if top > 0 else 0.0


def ranked_changes(diff: Diff, top: int) -> tuple[TensorDelta, ...]:
    """The ``top`` tensors of ``diff`` that changed (added and removed ones too), largest change
    first: those that gained NaN or Inf values, then by ``magnitude``, the share of chunks that
    changed, and name."""
    changed = [d for d in diff.tensors if d.status != "unchanged"]
    changed.sort(key=lambda d: (_nonfinite(d.b) <= _nonfinite(d.a), -magnitude(d), -(d.changed_fraction or 0.0),
                                d.name))
    return tuple(changed[:top])


def bisect(line: Sequence[LineCommit], test: Test, *, predicate: str, diff: Callable[[str, str], Diff],
           top: int = 10, on_step: OnStep | None = None) -> BisectResult:
    """Search ``line`` with ``test`` (``search``) and describe the commit found, with the ``top``
    tensors that changed most from its first parent (``diff(parent, commit)``, stored statistics)."""
    found, candidates, steps = search(line, test, on_step)
    first, parent = line[found], line[found - 1]
    return BisectResult(good=line[0].id, bad=line[-1].id, predicate=predicate, first_bad=first.id,
                        first_bad_step=first.step, parent=parent.id,
                        candidates=tuple(line[i].id for i in candidates), commits=len(line) - 1,
                        tested=tuple(steps), changed=ranked_changes(diff(parent.id, first.id), top))

