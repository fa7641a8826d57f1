"""Predicates over commits that the catalog answers (``ckpt bisect --where`` and ``--stat``): no
tensor bytes are read, only rows.

``--where EXPR``: the where-language of ``ckpt log`` (``lineage.where``), over commit fields,
metrics and annotations (annotated values are rows of ``metrics`` too).

``--stat GLOB:STAT[OP NUMBER]``: true at a commit when some tensor whose name matches ``GLOB``
(``fnmatch``, case-sensitive: ``*`` also crosses dots and slashes) has a stored statistic
(``TensorStats``, taken at ingest) that satisfies the comparison. ``STAT``: ``mean``, ``std``,
``min``, ``max``, ``norm`` (``l2_norm``), ``abs_max``, ``numel``, ``nan`` (``nan_count``) and
``inf`` (``inf_count``); ``OP``: ``<``, ``<=``, ``>``, ``>=``, ``==``, ``!=``. A count alone
(``*:nan``, ``layers.*:inf``) means more than zero. A statistic a tensor has none of (the mean
of a boolean tensor) satisfies nothing; the value statistics cover finite elements only, so
NaN and Inf are found with ``nan`` and ``inf``. Examples: ``*:nan``, ``*.weight:abs_max>1e4``,
``head.*:norm<1e-6``.
"""

from __future__ import annotations

import fnmatch
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from ckptrepo.db.models import Commit, Entry, Id, Tensor
from ckptrepo.entries import is_file_entry
from ckptrepo.errors import UsageError
from ckptrepo.lineage import where as where_language

#: ``--stat`` names and the ``tensors`` column each reads.
STATS = {
    "mean": "mean", "std": "std", "min": "min", "max": "max", "norm": "l2_norm", "l2_norm": "l2_norm",
    "abs_max": "abs_max", "numel": "numel", "nan": "nan_count", "nan_count": "nan_count", "inf": "inf_count",
    "inf_count": "inf_count",
}
COUNTS = frozenset({"nan_count", "inf_count"})  # the statistics that may stand alone (> 0)
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
}
_TAIL = re.compile(r"^\s*(?P<stat>[A-Za-z_]+)\s*(?:(?P<op><=|>=|==|!=|<|>)\s*(?P<value>\S+)\s*)?$")
STAT_HINT = ("Write GLOB:STAT or GLOB:STAT<OP>NUMBER, e.g. '*:nan', '*.weight:abs_max>1e4', 'head.*:norm<1e-6'; "
             f"STAT is one of {', '.join(sorted(set(STATS) - set(COUNTS)))}; OP one of {' '.join(_OPS)}.")


@dataclass(frozen=True)
class StatPredicate:
    """A parsed ``--stat`` spec: tensors whose names match ``glob``, statistic ``column`` (of
    ``tensors``), compared with ``op`` to ``threshold``."""

    glob: str
    column: str
    op: str
    threshold: float
    text: str

    def holds(self, value: float | int | None) -> bool:
        """Whether a tensor's stored ``value`` of the statistic satisfies the comparison (None: never)."""
        if value is None:
            return False
        return _OPS[self.op](float(value), self.threshold)

    def matches(self, name: str) -> bool:
        """Whether tensor ``name`` is one the spec looks at."""
        return fnmatch.fnmatchcase(name, self.glob)


def parse_stat(spec: str) -> StatPredicate:
    """The ``StatPredicate`` of ``GLOB:STAT[OP NUMBER]`` (see the module docstring); UsageError
    naming what is wrong (no colon, an empty glob, an unknown statistic, a value statistic without
    a comparison, a number that is not finite)."""
    glob, sep, rest = spec.rpartition(":")
    if not sep or not glob.strip():
        raise UsageError(f"--stat {spec!r}: expected GLOB:STAT (a glob of tensor names, a colon, a statistic)",
                         hint=STAT_HINT)
    m = _TAIL.match(rest)
    if m is None:
        raise UsageError(f"--stat {spec!r}: cannot read {rest.strip()!r} as STAT or STAT<OP>NUMBER", hint=STAT_HINT)
    name = m.group("stat").lower()
    column = STATS.get(name)
    if column is None:
        raise UsageError(f"--stat {spec!r}: unknown statistic {m.group('stat')!r}", hint=STAT_HINT)
    op, value = m.group("op"), m.group("value")
    if op is None:
        if column not in COUNTS:
            raise UsageError(f"--stat {spec!r}: {name} needs a comparison, e.g. {glob}:{name}>1.0", hint=STAT_HINT)
        return StatPredicate(glob.strip(), column, ">", 0.0, spec)
    try:
        threshold = float(value)
    except ValueError:
        raise UsageError(f"--stat {spec!r}: {value!r} is not a number", hint=STAT_HINT) from None
    if not math.isfinite(threshold):
        raise UsageError(f"--stat {spec!r}: the threshold must be a finite number, not {value}", hint=STAT_HINT)
    return StatPredicate(glob.strip(), column, op, threshold, spec)


def stat_test(session: Session, predicate: StatPredicate) -> Callable[[str], bool]:
    """``test(commit_id)``: whether ``predicate`` holds at that commit, from one query of its
    entries' names and that statistic (``session``: one whose snapshot holds no pending layout,
    ``db.pending.reading``). Reads no tensor bytes."""
    column = getattr(Tensor, predicate.column)
    query = (select(Entry.name, column).join(Tensor, Tensor.key == Entry.tensor_key)
             .where(Entry.commit_id == bindparam("cid", type_=Id)))

    def test(commit_id: str) -> bool:
        return any(predicate.matches(name) and predicate.holds(value)
                   for name, value in session.execute(query, {"cid": commit_id}) if not is_file_entry(name))

    return test


def where_test(session: Session, text: str) -> Callable[[str], bool]:
    """``test(commit_id)``: whether the where-expression ``text`` holds at that commit, one query
    each. UsageError now for malformed text or a name that is neither a field nor a metric or
    annotation any commit has."""
    cond = where_language.compile_where(session, text)
    query: Any = select(Commit.id).where(Commit.id == bindparam("cid", type_=Id), cond)

    def test(commit_id: str) -> bool:
        return session.execute(query, {"cid": commit_id}).first() is not None

    return test
