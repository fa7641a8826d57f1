"""Retention rules and the choice of what ``prune`` marks: pure functions over plain records.

No database here (``maintenance.prune`` reads the records and marks the result). A *line* is
the first-parent chain of a branch head, head first (``Lineage.lines``). Rules are evaluated
per line; a commit on several lines is kept if any line keeps it:

- ``keep_last`` N: the N newest commits of the line (by position: pruned ones count too);
- ``keep_every`` STEPS: per bucket ``[k * STEPS, (k+1) * STEPS)`` of step, the first commit
  at or after its start (lowest step; of equal steps the oldest); commits without a step are
  not kept by this rule;
- ``keep_best`` (METRIC, N): the N commits of the line with the lowest value of METRIC (the
  highest with ``maximize``); NaN and missing values do not compete; ties go to the older;
- ``keep_dense_early``: log-spaced thinning (COCI-style): the first commit of step 0 and of each
  bucket ``[2^k, 2^(k+1))``: dense early in training, sparse late;
- ``keep_younger_than`` SECONDS: commits created at most that long before ``now``.

Always kept, whatever the rules (``protected``): the head of every branch (``head``; the
heads of ``conflicts/`` branches as ``conflict``), tagged commits (``tag``), fork points: a
commit with more than one child through any edge kind (``fork``), the parent of a merge edge
(``merged``) or of a transfer edge (``transfer``), and a commit where another branch's line
leaves this one (``junction``). Merge bases of branch heads need no rule of their own: a
merge base that is not itself a head has at least two children (were its only child on
every path from both heads, that child would be a better common ancestor), so it is a fork
point. With ``branches`` (a scope), only those branches' lines are candidates, and a commit
also on the line of a branch outside the scope is kept (``other_branch``): pruning one
branch never takes data from another.

Commits pruned before stay pruned (``Selection.already``); nothing here un-prunes.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ckptrepo.db import integers
from ckptrepo.errors import UsageError, did_you_mean
from ckptrepo.types import RetentionRules

RULE_REASONS = ("last", "every", "best", "dense_early", "younger")
"""Why a rule keeps a commit, one per rule, in ``RetentionRules`` field order."""
PROTECTED_REASONS = ("head", "conflict", "tag", "fork", "merged", "transfer", "junction", "other_branch",
                     "unreplicated", "replicated_head")
"""Why a commit is kept whatever the rules."""
CONFLICTS_PREFIX = "conflicts/"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_RULES_HINT = ("Give at least one keep rule: keep_last=N, keep_every=STEPS, keep_best='METRIC:N', "
               "keep_dense_early=True or keep_younger_than='7d' (CLI: --keep-last N, --keep-every STEPS, "
               "--keep-best METRIC:N, --keep-dense-early, --keep-younger-than 7d).")


# -- rules ---------------------------------------------------------------------------------------


def parse_duration(value: str | float | int) -> float:
    """Seconds from ``"90s"``, ``"30m"``, ``"12h"``, ``"7d"``, ``"2w"`` or a number of seconds;
    UsageError for anything else (or a negative number)."""
    if isinstance(value, bool):
        raise UsageError(f"duration {value!r} is not a duration", hint="Use e.g. 90s, 30m, 12h or 7d.")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value).lower())
        if match is None:
            raise UsageError(f"duration {value!r} is not a duration", hint="Use e.g. 90s, 30m, 12h or 7d.")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not math.isfinite(seconds) or seconds < 0:
        raise UsageError(f"duration {value!r} is not a non-negative duration", hint="Use e.g. 90s, 30m, 12h or 7d.")
    return integers.seconds(f"duration {value!r}", seconds)


def parse_best(value: str | tuple[str, int] | list[Any]) -> tuple[str, int]:
    """``(metric, N)`` from ``"val_loss:3"`` or ``("val_loss", 3)``; UsageError otherwise."""
    if isinstance(value, str):
        name, sep, count = value.rpartition(":")
        if not sep:
            raise UsageError(f"keep_best {value!r} is not METRIC:N", hint="Use e.g. val_loss:3.")
        try:
            n: Any = int(count)
        except ValueError:
            raise UsageError(f"keep_best {value!r}: {count!r} is not a number of commits",
                             hint="Use e.g. val_loss:3.") from None
    elif isinstance(value, tuple | list) and len(value) == 2:
        name, n = value[0], value[1]
    else:
        raise UsageError(f"keep_best {value!r} is not METRIC:N", hint="Use e.g. val_loss:3 or ('val_loss', 3).")
    if not isinstance(name, str) or not name.strip():
        raise UsageError(f"keep_best {value!r} names no metric", hint="Use e.g. val_loss:3.")
    return name.strip(), _positive("keep_best's N", n)


def _positive(what: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{what} must be a positive integer, got {value!r}")
    return value


def rules(*, keep_last: int | None = None, keep_every: int | None = None,
          keep_best: str | tuple[str, int] | None = None, maximize: bool = False, keep_dense_early: bool = False,
          keep_younger_than: str | float | None = None, branches: Collection[str] | None = None) -> RetentionRules:
    """Validated rules (see the module docstring); UsageError for a bad value, or when no keep
    rule is given (a prune without one would prune everything but the protected commits)."""
    got = RetentionRules(
        keep_last=None if keep_last is None else _positive("keep_last", keep_last),
        keep_every=None if keep_every is None else _positive("keep_every", keep_every),
        keep_best=None if keep_best is None else parse_best(keep_best),
        maximize=bool(maximize), keep_dense_early=bool(keep_dense_early),
        keep_younger_than=None if keep_younger_than is None else parse_duration(keep_younger_than),
        branches=None if branches is None else _branch_names(branches),
    )
    if not got.any_rule:
        raise UsageError("no keep rule given: prune would drop the data of every commit but the protected ones",
                         hint=_RULES_HINT)
    if maximize and keep_best is None:
        raise UsageError("maximize applies to keep_best, which is not given",
                         hint="Pass keep_best='METRIC:N' with maximize=True (CLI: --keep-best METRIC:N --max).")
    return got


def chosen(given: RetentionRules | None, **arguments: Any) -> RetentionRules:
    """``given`` validated (``checked``), or rules from ``arguments`` (``rules``'s keywords);
    UsageError when both are there."""
    if given is None:
        return rules(**arguments)
    if any(v not in (None, False) for v in arguments.values()):
        raise UsageError("rules given whole and as separate arguments",
                         hint="Pass either rules=RetentionRules(...) or keep_last=..., keep_best=... (not both).")
    return checked(given)


def checked(stored: RetentionRules) -> RetentionRules:
    """``stored`` (a setting read back, say) validated as ``rules`` validates arguments."""
    return rules(keep_last=stored.keep_last, keep_every=stored.keep_every, keep_best=stored.keep_best,
                 maximize=stored.maximize, keep_dense_early=stored.keep_dense_early,
                 keep_younger_than=stored.keep_younger_than, branches=stored.branches)


def _branch_names(branches: Collection[str]) -> tuple[str, ...]:
    if isinstance(branches, str):
        branches = [branches]
    names = tuple(dict.fromkeys(str(b) for b in branches))
    if not names:
        raise UsageError("an empty list of branches selects nothing",
                         hint="Leave branches out (None) to prune every branch.")
    return names


# -- records ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """A commit as selection sees it: ``metric`` is its value of the ``keep_best`` metric
    (None when it records none)."""

    id: str
    step: int | None
    created_at: datetime
    metric: float | None = None
    pruned: bool = False


@dataclass(frozen=True)
class Lineage:
    """What selection needs of the repository: every branch's line (head first), tags (name ->
    commit), commits with more than one child (``forks``), parents of merge edges (``merged``) and
    of transfer edges (``transferred``)."""

    lines: Mapping[str, Sequence[Node]]
    tags: Mapping[str, str] = field(default_factory=dict)
    forks: Collection[str] = frozenset()
    merged: Collection[str] = frozenset()
    transferred: Collection[str] = frozenset()


@dataclass(frozen=True)
class Selection:
    """The result: ``considered`` commits (on the lines in scope), those ``kept`` with their
    reasons, those newly ``pruned`` and those pruned ``already`` (ids sorted)."""

    considered: tuple[str, ...]
    kept: Mapping[str, tuple[str, ...]]
    pruned: tuple[str, ...]
    already: tuple[str, ...]

    @property
    def kept_by(self) -> dict[str, int]:
        """How many kept commits each reason keeps (a commit counts once per reason)."""
        counts: Counter[str] = Counter(r for reasons in self.kept.values() for r in reasons)
        return {r: counts[r] for r in (*PROTECTED_REASONS, *RULE_REASONS) if counts[r]}


# -- selection -----------------------------------------------------------------------------------


def _first_per_bucket(line: Sequence[Node], bucket: Any) -> set[str]:
    """Per bucket (``bucket(step)``; None: in none), the commit with the lowest step, the oldest
    (deepest on the line) of equal steps."""
    best: dict[Any, tuple[int, int, str]] = {}
    for depth, node in enumerate(line):
        if node.step is None:
            continue
        b = bucket(node.step)
        if b is None:
            continue
        key = (node.step, -depth, node.id)
        if b not in best or key < best[b]:
            best[b] = key
    return {v[2] for v in best.values()}


def _dense_bucket(step: int) -> int | None:
    """-1 for step 0, k for a step in ``[2^k, 2^(k+1))``, None for a negative step."""
    if step < 0:
        return None
    return -1 if step == 0 else step.bit_length() - 1


def kept_on_line(line: Sequence[Node], r: RetentionRules, now: datetime) -> dict[str, set[str]]:
    """The commits of one line (head first) the rules keep, with the rules that keep each."""
    out: dict[str, set[str]] = {}

    def keep(ids: Collection[str], reason: str) -> None:
        for cid in ids:
            out.setdefault(cid, set()).add(reason)

    if r.keep_last is not None:
        keep([n.id for n in line[: r.keep_last]], "last")
    if r.keep_every is not None:
        every = r.keep_every
        keep(_first_per_bucket(line, lambda step: step // every), "every")
    if r.keep_best is not None:
        _, n = r.keep_best
        sign = -1.0 if r.maximize else 1.0
        ranked = sorted((sign * node.metric, -depth, node.id) for depth, node in enumerate(line)
                        if node.metric is not None and not math.isnan(node.metric))
        keep([cid for _, _, cid in ranked[:n]], "best")
    if r.keep_dense_early:
        keep(_first_per_bucket(line, _dense_bucket), "dense_early")
    if r.keep_younger_than is not None:
        since = now - timedelta(seconds=r.keep_younger_than)
        keep([n.id for n in line if n.created_at >= since], "younger")
    return out


def protected(lineage: Lineage, scope: Collection[str] | None = None) -> dict[str, set[str]]:
    """The commits kept whatever the rules, with why (see the module docstring); ``scope``: the
    branches whose lines are candidates (None: all), for ``other_branch``."""
    out: dict[str, set[str]] = {}

    def keep(cid: str, reason: str) -> None:
        out.setdefault(cid, set()).add(reason)

    on_lines: dict[str, set[str]] = {}
    for name, line in lineage.lines.items():
        if line:
            keep(line[0].id, "conflict" if name.startswith(CONFLICTS_PREFIX) else "head")
        for node in line:
            on_lines.setdefault(node.id, set()).add(name)
    for cid in lineage.tags.values():
        keep(cid, "tag")
    for ids, reason in ((lineage.forks, "fork"), (lineage.merged, "merged"), (lineage.transferred, "transfer")):
        for cid in ids:
            if cid in on_lines:
                keep(cid, reason)
    for name, line in lineage.lines.items():
        before: set[str] = set()  # the other lines the previous (newer) commit of this line is on
        for node in line:
            others = on_lines[node.id] - {name}
            if others - before:
                keep(node.id, "junction")
            before = others
    if scope is not None:
        inside = set(scope)
        for cid, names in on_lines.items():
            if not names <= inside:
                keep(cid, "other_branch")
    return out


def select(lineage: Lineage, r: RetentionRules, now: datetime) -> Selection:
    """What a prune with rules ``r`` at time ``now`` keeps and marks. UsageError when
    ``r.branches`` names a branch that does not exist."""
    scope = list(lineage.lines) if r.branches is None else list(r.branches)
    for name in scope:
        if name not in lineage.lines:
            raise UsageError(f"no branch named {name!r}",
                             hint=did_you_mean("branch", name, lineage.lines, "`ckpt branch`"))
    keep = protected(lineage, None if r.branches is None else scope)
    considered: dict[str, Node] = {}
    for name in scope:
        line = lineage.lines[name]
        considered.update((n.id, n) for n in line)
        for cid, reasons in kept_on_line(line, r, now).items():
            keep.setdefault(cid, set()).update(reasons)
    kept = {cid: tuple(sorted(keep[cid])) for cid, n in considered.items() if cid in keep and not n.pruned}
    return Selection(
        considered=tuple(considered),
        kept=kept,
        pruned=tuple(sorted(cid for cid, n in considered.items() if cid not in keep and not n.pruned)),
        already=tuple(sorted(cid for cid, n in considered.items() if n.pruned)),
    )
