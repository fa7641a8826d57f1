"""Retention rules and the choice of what prune marks (``maintenance.retention``): pure, no database."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptrepo.errors import UsageError
from ckptrepo.maintenance import retention
from ckptrepo.maintenance.retention import Lineage, Node
from ckptrepo.types import RetentionRules

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)


def line(n: int, *, prefix: str = "c", steps: list[int | None] | None = None,
         metrics: list[float | None] | None = None, hours_apart: float = 1.0) -> list[Node]:
    """A line of ``n`` commits, head first: the head is ``{prefix}{n-1}``, the newest, made at NOW."""
    out = []
    for i in reversed(range(n)):
        step = steps[i] if steps is not None else 10 * i
        metric = metrics[i] if metrics is not None else None
        out.append(Node(f"{prefix}{i}", step, NOW - timedelta(hours=hours_apart * (n - 1 - i)), metric))
    return out


def ids(nodes: list[Node]) -> list[str]:
    return [n.id for n in nodes]


def kept(line_: list[Node], **rules: object) -> set[str]:
    r = RetentionRules(**rules)  # type: ignore[arg-type]
    return set(retention.kept_on_line(line_, r, NOW))


# -- rules, one by one -----------------------------------------------------------------------------


def test_keep_last_keeps_the_newest() -> None:
    assert kept(line(10), keep_last=3) == {"c9", "c8", "c7"}
    assert kept(line(2), keep_last=5) == {"c1", "c0"}


def test_keep_every_keeps_the_first_commit_of_each_step_bucket() -> None:
    steps: list[int | None] = [0, 30, 70, 100, 110, None, 250, 260, 301, 400]
    assert kept(line(10, steps=steps), keep_every=100) == {"c0", "c3", "c6", "c8", "c9"}
    # The first at or after the multiple: 99 is in bucket 0 with 0, 101 starts bucket 1.
    assert kept(line(3, steps=[99, 101, 150]), keep_every=100) == {"c0", "c1"}
    # Equal steps in a bucket: the oldest.
    assert kept(line(3, steps=[5, 5, 7]), keep_every=10) == {"c0"}
    assert kept(line(3, steps=[None, None, None]), keep_every=10) == set()


def test_keep_best_keeps_the_n_best_by_the_metric() -> None:
    values: list[float | None] = [5.0, 1.0, None, math.nan, 3.0, 0.5, 9.0]
    nodes = line(7, metrics=values)
    assert kept(nodes, keep_best=("loss", 2)) == {"c5", "c1"}
    assert kept(nodes, keep_best=("loss", 2), maximize=True) == {"c6", "c0"}
    assert kept(nodes, keep_best=("loss", 10)) == {"c0", "c1", "c4", "c5", "c6"}  # NaN and missing do not compete
    # Ties go to the older commit.
    assert kept(line(3, metrics=[1.0, 1.0, 1.0]), keep_best=("loss", 1)) == {"c0"}


def test_keep_dense_early_is_log_spaced() -> None:
    steps: list[int | None] = list(range(0, 40))
    got = kept(line(40, steps=steps), keep_dense_early=True)
    assert got == {"c0", "c1", "c2", "c4", "c8", "c16", "c32"}
    # Without the exact powers of two: the first commit of each [2^k, 2^(k+1)).
    assert kept(line(5, steps=[3, 5, 6, 13, 40]), keep_dense_early=True) == {"c0", "c1", "c3", "c4"}
    assert kept(line(2, steps=[None, -3]), keep_dense_early=True) == set()


def test_keep_younger_than_keeps_recent_commits() -> None:
    nodes = line(10, hours_apart=1.0)  # c9 at NOW, c8 an hour before, ...
    assert kept(nodes, keep_younger_than=2.5 * 3600) == {"c9", "c8", "c7"}
    assert kept(nodes, keep_younger_than=0.0) == {"c9"}


def test_rules_compose_as_a_union() -> None:
    nodes = line(10, metrics=[float(10 - i) if i != 2 else -1.0 for i in range(10)])
    got = kept(nodes, keep_last=2, keep_best=("loss", 1), keep_every=50)
    assert got == {"c9", "c8"} | {"c2"} | {"c0", "c5"}
    reasons = retention.kept_on_line(nodes, RetentionRules(keep_last=2, keep_every=50), NOW)
    assert reasons["c9"] == {"last"} and reasons["c5"] == {"every"}


# -- arguments -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("30m", 1800), ("12h", 43200), ("7d", 604800),
                                               ("2w", 1209600), ("1.5h", 5400), (" 10 ", 10), (45, 45)])
def test_durations(text: str | int, seconds: float) -> None:
    assert retention.parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["7y", "d", "-1h", "", "1e3s", True, -5])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(UsageError):
        retention.parse_duration(bad)  # type: ignore[arg-type]


def test_rules_are_validated() -> None:
    r = retention.rules(keep_last=3, keep_best="val_loss:2", maximize=True, keep_younger_than="1d", branches=["a"])
    assert r == RetentionRules(keep_last=3, keep_best=("val_loss", 2), maximize=True, keep_younger_than=86400.0,
                               branches=("a",))
    assert retention.rules(keep_best=("acc", 1)).keep_best == ("acc", 1)
    assert RetentionRules.from_json(r.to_json()) == r
    with pytest.raises(UsageError, match="no keep rule") as none:
        retention.rules()
    assert "--keep-last" in none.value.hint
    with pytest.raises(UsageError, match="no keep rule"):
        retention.rules(branches=["main"])
    for bad in ({"keep_last": 0}, {"keep_last": True}, {"keep_every": -1}, {"keep_best": "loss"},
                {"keep_best": "loss:x"}, {"keep_best": ":3"}, {"keep_best": "loss:0"},
                {"maximize": True, "keep_last": 1}, {"keep_last": 1, "branches": []}):
        with pytest.raises(UsageError):
            retention.rules(**bad)  # type: ignore[arg-type]


# -- protected commits and scope -------------------------------------------------------------------


def _forked() -> Lineage:
    """main: m0..m5; exp forks at m2 (e0, e1); tag at m1; a transfer from m4 into e1."""
    main = line(6, prefix="m")
    exp = [Node("e1", 101, NOW), Node("e0", 100, NOW), *[n for n in main if n.id in ("m2", "m1", "m0")]]
    return Lineage(lines={"main": main, "exp": exp, "conflicts/main/x": [main[1], *main[2:]]},
                   tags={"v1": "m1"}, forks={"m2", "m4"}, merged=set(), transferred={"m4"})


def test_protected_commits() -> None:
    got = retention.protected(_forked())
    assert got["m5"] == {"head"} and got["e1"] == {"head"}
    assert got["m4"] == {"conflict", "fork", "transfer", "junction"}  # the conflicts/ branch's head, on main
    assert got["m1"] == {"tag"}
    assert got["m2"] == {"fork", "junction"}
    assert set(got) == {"m5", "e1", "m4", "m1", "m2"}


def test_select_never_prunes_protected_commits_and_keeps_by_any_line() -> None:
    lineage = _forked()
    sel = retention.select(lineage, RetentionRules(keep_last=1), NOW)
    assert set(sel.pruned) == {"m3", "e0", "m0"}
    assert set(sel.considered) == {"m0", "m1", "m2", "m3", "m4", "m5", "e0", "e1"}
    assert sel.kept_by["head"] == 2 and sel.kept_by["last"] == 3
    # m3 is the 2nd newest of the conflicts/ branch's line: kept there, though not on main's.
    sel = retention.select(lineage, RetentionRules(keep_last=2), NOW)
    assert set(sel.pruned) == {"m0"} and sel.kept["m3"] == ("last",)
    # m0 is the 5th newest of exp's line (and of the conflicts/ one), the 6th of main's.
    assert set(retention.select(lineage, RetentionRules(keep_last=4), NOW).pruned) == {"m0"}
    assert set(retention.select(lineage, RetentionRules(keep_last=5), NOW).pruned) == set()


def test_scope_keeps_commits_other_branches_need() -> None:
    lineage = _forked()
    sel = retention.select(lineage, RetentionRules(keep_last=1, branches=("exp",)), NOW)
    assert set(sel.considered) == {"e1", "e0", "m2", "m1", "m0"}
    assert set(sel.pruned) == {"e0"}  # m0 is also on main's line, outside the scope
    assert "other_branch" in sel.kept["m0"]
    with pytest.raises(UsageError, match="no branch named 'exq'") as err:
        retention.select(lineage, RetentionRules(keep_last=1, branches=("exq",)), NOW)
    assert "exp" in err.value.hint


def test_already_pruned_commits_stay_pruned() -> None:
    nodes = line(5)
    nodes[3] = Node(nodes[3].id, nodes[3].step, nodes[3].created_at, None, pruned=True)
    sel = retention.select(Lineage(lines={"main": nodes}), RetentionRules(keep_last=2, keep_every=1), NOW)
    assert sel.already == ("c1",) and sel.pruned == ()
    assert "c1" not in sel.kept and len(sel.considered) == 5


# -- properties ------------------------------------------------------------------------------------


@st.composite
def lineages(draw: st.DrawFn) -> Lineage:
    """A main line and branches forking off it (or off each other), with random steps, metrics,
    tags and forks; each commit's parent is the next one on its line."""
    n_main = draw(st.integers(1, 30))
    counter = iter(range(10_000))

    def node() -> Node:
        i = next(counter)
        step = draw(st.one_of(st.none(), st.integers(0, 5000)))
        metric = draw(st.one_of(st.none(), st.floats(-10, 10), st.just(math.nan)))
        return Node(f"n{i}", step, NOW - timedelta(minutes=draw(st.integers(0, 10_000))), metric,
                    pruned=draw(st.booleans()) and draw(st.booleans()))

    lines = {"main": [node() for _ in range(n_main)]}
    for b in range(draw(st.integers(0, 3))):
        base = draw(st.sampled_from(sorted(lines)))
        at = draw(st.integers(0, len(lines[base]) - 1))
        own = [node() for _ in range(draw(st.integers(0, 8)))]
        lines[f"b{b}"] = own + list(lines[base][at:])
    every = [n.id for ln in lines.values() for n in ln]
    tags = {f"t{i}": cid for i, cid in enumerate(draw(st.lists(st.sampled_from(every), max_size=3)))}
    forks = set(draw(st.lists(st.sampled_from(every), max_size=3)))
    return Lineage(lines=lines, tags=tags, forks=forks, merged=set(), transferred=set())


@settings(max_examples=300, deadline=None)
@given(lineage=lineages(), keep_last=st.integers(1, 6), extra=st.booleans())
def test_protected_never_pruned_and_keep_last_keeps_the_newest(lineage: Lineage, keep_last: int, extra: bool) -> None:
    rules = RetentionRules(keep_last=keep_last, keep_every=700 if extra else None,
                           keep_best=("loss", 2) if extra else None)
    sel = retention.select(lineage, rules, NOW)
    pruned = set(sel.pruned)
    protected = retention.protected(lineage)
    assert not pruned & set(protected)
    for ln in lineage.lines.values():
        newest = {n.id for n in ln[:keep_last]}
        assert not pruned & newest
        if not extra:  # keep_last alone: a commit kept by a rule is among some line's newest N
            for n in ln:
                if n.id in sel.kept and n.id not in protected:
                    assert any(n.id in {m.id for m in other[:keep_last]} for other in lineage.lines.values())
    # Every considered commit is kept, pruned now or pruned before: exactly one of them.
    assert set(sel.considered) == set(sel.kept) | pruned | set(sel.already)
    assert not set(sel.kept) & pruned and not set(sel.already) & (set(sel.kept) | pruned)
    assert all(not n.pruned for ln in lineage.lines.values() for n in ln if n.id in pruned)
