"""Lineage queries, ``--where`` filters, ``best`` and their CLI, on every database the suite runs against.

Two kinds of graphs: a hand-built repository committed through the public API (branches, a
merge, a transfer, an unrelated root, and a criss-cross whose branches share two merge
bases), where every answer is spelled out; and random DAGs inserted as rows, deep enough
to take several generation bands, checked against brute-force answers computed in Python.
"""

from __future__ import annotations

import itertools
import json
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import func, insert, inspect, select, update
from typer.testing import CliRunner, Result

import ckptrepo
from ckptrepo import errors
from ckptrepo.cli.app import app
from ckptrepo.cli.lineage_render import graph_rows
from ckptrepo.db import lines
from ckptrepo.db.engine import fetch_tuples, write_connection
from ckptrepo.db.models import Chunk, Commit, Edge, Entry, Metric, Tensor, TensorChunk
from ckptrepo.lineage import graph
from ckptrepo.testing import parts
from ckptrepo.types import Parent


@dataclass
class Hand:
    repo: ckptrepo.Repo
    ids: dict[str, str]  # label -> full id
    path: Path

    def __getitem__(self, label: str) -> str:
        return self.ids[label]

    def labels(self, ids: list[str]) -> list[str]:
        back = {v: k for k, v in self.ids.items()}
        return [back[i] for i in ids]

    def by_gen_desc(self, *labels: str) -> list[str]:
        """Labels ordered as ancestor lists are: highest generation first, then id."""
        return self.labels(sorted((self.ids[x] for x in labels), key=lambda i: (-GEN[self.labels([i])[0]], i)))


# label: (branch, parents or None for the branch head, transfer source, step, epoch, metrics)
PLAN: list[tuple[str, str, list[str] | None, str | None, int | None, int | None, dict[str, float]]] = [
    ("r0", "main", None, None, 0, None, {"val_loss": 3.0}),
    ("r1", "main", None, None, 100, None, {"val_loss": 2.5, "acc": 0.1}),
    ("r2", "main", None, None, 200, None, {"val_loss": 2.0}),
    ("f1", "feat", ["r1"], None, 150, None, {"val_loss": 2.2}),
    ("f2", "feat", None, None, 250, None, {"val_loss": 1.9, "acc": 0.5}),
    ("r3", "main", None, None, 300, None, {"val_loss": 2.05}),
    ("m", "main", ["r3", "f2"], None, 350, None, {"val_loss": 1.8}),
    ("r5", "main", None, None, 400, 1, {}),
    ("t1", "ft", None, "r2", None, None, {"val_loss": 2.4}),
    ("t2", "ft", None, None, 10, None, {"val_loss": 2.3}),
    ("u0", "other", None, None, 5, None, {"val_loss": 5.0}),
    # criss-cross: A merges (p, q), B merges (q, p); C merges the two branches.
    ("o", "x", None, None, None, None, {}),
    ("p", "x", None, None, None, None, {}),
    ("q", "y", ["o"], None, None, None, {}),
    ("A", "x", ["p", "q"], None, None, None, {}),
    ("B", "y", ["q", "p"], None, None, None, {}),
    ("A2", "x", None, None, None, None, {}),
    ("B2", "y", None, None, None, None, {}),
    ("C", "x", ["A2", "B2"], None, None, None, {}),
]
GEN = {"r0": 1, "r1": 2, "r2": 3, "f1": 3, "f2": 4, "r3": 4, "m": 5, "r5": 6, "t1": 4, "t2": 5, "u0": 1,
       "o": 1, "p": 2, "q": 2, "A": 3, "B": 3, "A2": 4, "B2": 4, "C": 5}  # fmt: skip


@pytest.fixture
def hand(tmp_path: Path, db_url: str) -> Iterator[Hand]:
    path = tmp_path / "work"
    with ckptrepo.Repo.init(path, db_url=db_url) as repo:
        ids: dict[str, str] = {}
        for i, (label, branch, parents, transfer, step, epoch, metrics) in enumerate(PLAN):
            value = float("nan") if label == "f1" else float(i)
            commit = repo.commit(
                {"w": torch.tensor([value, 1.0])}, branch=branch, message=label, step=step, epoch=epoch,
                metrics=metrics, parents=[ids[p] for p in parents] if parents else None,
                transfer_from=ids[transfer] if transfer else None, blocking=True,
            ).wait()  # fmt: skip
            ids[label] = commit.id
        yield Hand(repo, ids, path)


# -- graph queries on the hand-built repository --------------------------------------------------


def test_generations_are_as_planned(hand: Hand) -> None:
    with parts(hand.repo).sessions() as s:
        gens = dict(s.execute(select(Commit.id, Commit.generation)).all())
    assert {label: gens[cid] for label, cid in hand.ids.items()} == GEN


def test_ancestors(hand: Hand) -> None:
    anc = lambda rev, **kw: hand.labels(hand.repo.ancestors(rev, **kw))  # noqa: E731
    # Nearest first, breadth-first, first parents first.
    assert anc(hand["r5"]) == ["m", "r3", "f2", "r2", "f1", "r1", "r0"]
    assert anc("main") == anc(hand["r5"])
    assert anc("main", kinds=["parent"]) == ["m", "r3", "r2", "r1", "r0"]
    assert anc("main", max_depth=2) == ["m", "r3", "f2"]
    assert anc("main", kinds=["merge"]) == []
    assert anc("main~1", kinds=["merge", "parent"], max_depth=1) == ["r3", "f2"]
    assert anc("ft") == ["t1", "r2", "r1", "r0"]
    assert anc("ft", kinds=("parent", "merge")) == ["t1"]
    assert anc("ft", kinds=("transfer",)) == []
    assert anc(hand["t1"], kinds=("transfer",)) == ["r2"]
    assert anc(hand["r0"]) == [] and anc("other") == []
    assert anc(hand["C"]) == ["A2", "B2", "A", "B", "p", "q", "o"]


def test_ancestors_along_one_line(hand: Hand) -> None:
    """Ancestors that form one line of parents come from the walk without UNION; a walk that
    branches, or that ``generation`` cuts short, leaves the answer to the edge walk."""
    with parts(hand.repo).sessions() as s:
        def line(label: str, kinds: tuple[str, ...] = graph.EDGE_KINDS, depth: int | None = None) -> Any:
            found = graph._line_of_parents(s, hand[label], kinds, depth)
            return None if found is None else hand.labels(found)

        assert line("r3") == ["r2", "r1", "r0"] and line("r0") == []
        assert line("f2", depth=1) == ["f1"]
        assert line("t2") == ["t1", "r2", "r1", "r0"]  # through the transfer edge
        assert line("r5") is None and line("C") is None  # m and C have two parents
        assert line("r5", ("parent",)) == ["m", "r3", "r2", "r1", "r0"]
    with write_connection(parts(hand.repo).engine) as conn:  # a generation too low: the walk is cut short
        conn.execute(update(Commit).where(Commit.id == hand["r3"]).values(generation=2))
    with parts(hand.repo).sessions() as s:
        assert graph._line_of_parents(s, hand["r3"], graph.EDGE_KINDS, None) is None
    assert hand.labels(hand.repo.ancestors(hand["r3"])) == ["r2", "r1", "r0"]


def test_first_parent_recorded_with_each_commit(hand: Hand) -> None:
    """``commits.first_parent_id`` is the parent of the ``parent`` edge at position 0: none for
    roots and for commits whose only parent is a transfer source."""
    with parts(hand.repo).sessions() as s:
        stored = dict(s.execute(select(Commit.id, Commit.first_parent_id)).all())
        first = select(Edge.child_id, Edge.parent_id).where(Edge.kind == "parent", Edge.position == 0)
        edges = dict(s.execute(first).all())
    assert stored == {c: edges.get(c) for c in stored}
    assert stored[hand["m"]] == hand["r3"] and stored[hand["r0"]] is None and stored[hand["t1"]] is None


def _levels(found: list[str], *levels: set[str]) -> bool:
    """``found`` is ``levels`` one after the other, each in some order (nearest first)."""
    i = 0
    for level in levels:
        if set(found[i : i + len(level)]) != level:
            return False
        i += len(level)
    return i == len(found)


def test_descendants(hand: Hand) -> None:
    desc = lambda rev, **kw: hand.labels(hand.repo.descendants(rev, **kw))  # noqa: E731
    assert _levels(desc(hand["r1"]), {"r2", "f1"}, {"r3", "f2", "t1"}, {"m", "t2"}, {"r5"})
    assert _levels(desc(hand["r1"], kinds=["parent"]), {"r2", "f1"}, {"r3", "f2"}, {"m"}, {"r5"})
    assert _levels(desc(hand["r1"], max_depth=1), {"r2", "f1"})
    assert desc(hand["r1"], max_depth=1) == sorted(["r2", "f1"], key=hand.__getitem__)  # siblings by id
    assert _levels(desc(hand["r1"], kinds=["parent", "merge"], max_depth=3), {"r2", "f1"}, {"r3", "f2"}, {"m"})
    assert desc(hand["f2"]) == ["m", "r5"]
    assert desc(hand["f2"], kinds=["parent"]) == []
    assert desc(hand["r2"], kinds=["transfer"]) == ["t1"]
    assert desc("main") == [] and desc(hand["u0"]) == []
    assert _levels(desc(hand["o"]), {"p", "q"}, {"A", "B"}, {"A2", "B2"}, {"C"})


def test_merge_base(hand: Hand) -> None:
    mb = lambda a, b, **kw: hand.labels(hand.repo.merge_base(a, b, **kw))  # noqa: E731
    assert mb("main", "feat") == ["f2"]  # feat was merged into main
    assert mb("feat", "main") == ["f2"]
    assert mb(hand["f2"], hand["r3"]) == ["r1"]
    assert mb(hand["f1"], hand["r2"]) == ["r1"]
    assert mb("ft", "main") == ["r2"]  # through the transfer edge
    assert mb("ft", "main", kinds=["parent", "merge"]) == []
    assert mb(hand["r5"], hand["r5"]) == ["r5"]
    assert mb(hand["r0"], hand["r5"]) == ["r0"]
    assert mb("main", "other") == [] and mb("main", "x") == []
    # Criss-cross: the two branches share two best common ancestors.
    assert mb(hand["A2"], hand["B2"]) == hand.by_gen_desc("p", "q")
    assert mb(hand["A"], hand["B"]) == hand.by_gen_desc("p", "q")
    assert mb(hand["A"], hand["B"], kinds=["parent"]) == ["o"]
    assert mb(hand["C"], hand["A"]) == ["A"]
    assert mb(hand["q"], hand["p"]) == ["o"]


def test_path(hand: Hand) -> None:
    path = lambda a, b, **kw: hand.labels(hand.repo.path(a, b, **kw))  # noqa: E731
    assert path(hand["f2"], hand["r3"]) == ["f2", "f1", "r1", "r2", "r3"]
    assert path(hand["r3"], hand["f2"]) == ["r3", "r2", "r1", "f1", "f2"]
    assert path("main", hand["r1"]) == ["r5", "m", "r3", "r2", "r1"]  # first parents win the tie
    assert path(hand["r1"], "main") == ["r1", "r2", "r3", "m", "r5"]
    assert path("main", "feat") == ["r5", "m", "f2"]
    assert path("ft", hand["r3"]) == ["t2", "t1", "r2", "r3"]
    assert path("ft", hand["r3"], kinds=["parent", "merge"]) == []
    assert path(hand["m"], hand["m"]) == ["m"]
    assert path("main", "other") == []
    turn = hand.by_gen_desc("p", "q")[0]  # equal lengths and generations: the smaller id
    assert path(hand["A2"], hand["B2"]) == ["A2", "A", turn, "B", "B2"]


def test_unknown_revisions_and_bad_arguments(hand: Hand) -> None:
    for call in (
        lambda: hand.repo.ancestors("nope"),
        lambda: hand.repo.descendants("main~40"),
        lambda: hand.repo.path("main", "nope"),
        lambda: hand.repo.merge_base("nope", "main"),
        lambda: hand.repo.best("val_loss", branch="nope"),
        lambda: hand.repo.log("nope", where="step > 1"),
    ):
        with pytest.raises(errors.UnknownRevision):
            call()
    for call in (
        lambda: hand.repo.ancestors("main", kinds=["parent", "child"]),
        lambda: hand.repo.ancestors("main", kinds=[]),
        lambda: hand.repo.descendants("main", max_depth=0),
        lambda: hand.repo.best("val_loss", limit=0),
        lambda: hand.repo.log(limit=0),
    ):
        with pytest.raises(errors.UsageError):
            call()


# -- where ----------------------------------------------------------------------------------


def _where(hand: Hand, text: str, rev: str | None = None) -> set[str]:
    return set(hand.labels([c.id for c in hand.repo.log(rev, where=text)]))


ALL = {label for label, *_ in PLAN}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("val_loss < 2.1", {"r2", "f2", "r3", "m"}),
        ("val_loss <= 2.0", {"r2", "f2", "m"}),
        ("val_loss > 2.4", {"r0", "r1", "u0"}),
        ("val_loss >= 2.4", {"r0", "r1", "u0", "t1"}),
        ("val_loss == 2.0", {"r2"}),
        ("val_loss != 2.0", {"r0", "r1", "f1", "f2", "r3", "m", "t1", "t2", "u0"}),
        ("2.1 > val_loss", {"r2", "f2", "r3", "m"}),
        ("metric('val_loss') < 2.1", {"r2", "f2", "r3", "m"}),
        ("not val_loss < 2.1", ALL - {"r2", "f2", "r3", "m"}),  # a missing metric: the comparison is false
        ("acc > 0.2 or step >= 400", {"f2", "r5"}),
        ("acc < val_loss", {"r1", "f2"}),
        ("(val_loss < 2.1 and step >= 300) or branch == 'feat'", {"r3", "m", "f1", "f2"}),
        ("step >= 100 and not branch == \"main\"", {"f1", "f2"}),
        ("not step < 100", ALL - {"r0", "t2", "u0"}),  # commits without a step
        ("epoch == 1", {"r5"}),
        ("nonfinite > 0", {"f1"}),
        ("message == 'm' OR message == 'A'", {"m", "A"}),
        ("branch > 'w'", {"o", "p", "A", "A2", "C", "q", "B", "B2"}),
        ("branch == \"main'; DROP TABLE commits; --\"", set()),
    ],
)
def test_where(hand: Hand, text: str, expected: set[str]) -> None:
    assert _where(hand, text) == expected


def test_where_time_and_rev(hand: Hand) -> None:
    commits = {hand.labels([c.id])[0]: c for c in hand.repo.log()}
    at = commits["m"].created_at
    assert _where(hand, f"time >= '{at.isoformat()}'") == {x for x, c in commits.items() if c.created_at >= at}
    local = at.astimezone(timezone(timedelta(hours=5))).isoformat()
    assert _where(hand, f"created_at < '{local}'") == {x for x, c in commits.items() if c.created_at < at}
    assert _where(hand, "time < 2000-01-01") == set()
    assert _where(hand, "val_loss < 2.3", rev="main") == {"r2", "f1", "f2", "r3", "m"}
    assert [hand.labels([c.id])[0] for c in hand.repo.log("main", where="val_loss < 2.3", limit=2,
                                                         offset=1)] == ["r3", "f2"]


def _counts(hand: Hand) -> dict[str, int]:
    with parts(hand.repo).sessions() as s:
        return {m.__tablename__: s.scalar(select(func.count()).select_from(m)) or 0 for m in (Commit, Edge, Metric)}


@pytest.mark.parametrize(
    "text",
    ["step = 1; DROP TABLE commits", "'x' OR 1=1 --", "val_loss < 2; DELETE FROM metrics", "step > 0) OR (1=1",
     "1 == 1", "commits.step > 0", "val_los < 2"],
)  # fmt: skip
def test_where_errors_change_nothing(hand: Hand, text: str) -> None:
    before = _counts(hand)
    with pytest.raises(errors.UsageError) as info:
        hand.repo.log(where=text)
    assert info.value.exit_code == 2
    assert _counts(hand) == before
    assert {"commits", "edges", "metrics"} <= set(inspect(parts(hand.repo).engine).get_table_names())


def test_unknown_name_lists_fields_and_metrics(hand: Hand) -> None:
    with pytest.raises(errors.UsageError) as info:
        hand.repo.log(where="val_los < 2 and step > 1")
    assert "'val_los'" in info.value.message and "val_loss" in info.value.message
    assert "step" in info.value.hint and "acc, val_loss" in info.value.hint


# -- best -----------------------------------------------------------------------------------


def test_best(hand: Hand) -> None:
    best = lambda metric, **kw: hand.labels([c.id for c in hand.repo.best(metric, **kw)])  # noqa: E731
    assert best("val_loss") == ["m"]
    assert best("val_loss", limit=3) == ["m", "f2", "r2"]
    assert best("val_loss", maximize=True, limit=2) == ["u0", "r0"]
    assert best("val_loss", branch="feat", limit=10) == ["f2", "f1", "r1", "r0"]
    assert best("val_loss", subtree=hand["r2"], limit=10) == ["m", "r2", "r3", "t2", "t1"]
    assert best("val_loss", branch="main", subtree=hand["f1"], limit=10) == ["m", "f2", "f1"]
    assert best("acc", maximize=True) == ["f2"]
    assert best("acc", subtree="ft") == []
    assert hand.repo.best("val_loss")[0].metrics["val_loss"] == 1.8
    with pytest.raises(errors.UsageError, match="unknown field or metric 'loss'"):
        hand.repo.best("loss")


# -- random DAGs against brute force ------------------------------------------------------------


T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _with_lines(rows: list[dict[str, Any]], parents: dict[str, list[tuple[str, str]]]) -> list[dict[str, Any]]:
    """``rows`` (commits, parents first) with the first parent and first-parent line that
    ``catalog.record_commit`` would store, for commits inserted directly."""
    firsts = {cid: ps[0][0] if ps and ps[0][1] == "parent" else None for cid, ps in parents.items()}
    extra = {cid for cid, ps in parents.items() if any(j > 0 or k != "parent" for j, (_, k) in enumerate(ps))}
    placed = lines.assign_all((r["id"], firsts[r["id"]], r["id"] in extra) for r in rows)
    return [{**r, "first_parent_id": firsts[r["id"]], **placed[r["id"]]._asdict()} for r in rows]


def _with_forks(edges: list[dict[str, Any]], commits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``edges`` with the fork marks ``catalog.record_commit`` would store (``lines.with_forks``)."""
    return lines.with_forks(edges, {c["id"]: (c["line_id"], c["fp_depth"]) for c in commits})


def _random_dag(repo: ckptrepo.Repo, n: int, seed: int) -> tuple[list[str], dict[str, list[tuple[str, str]]]]:
    """Insert ``n`` commits in a few long lines with forks, merges and transfers; returns the ids
    (oldest first) and each commit's parents as (id, kind) in position order."""
    rng = random.Random(seed)
    ids = [f"{seed:08x}{i:056x}" for i in range(n)]
    parents: dict[str, list[tuple[str, str]]] = {}
    gen: dict[str, int] = {}
    heads: list[str] = []  # a few long lines, so histories run many bands deep
    rows, edges = [], []
    for i, cid in enumerate(ids):
        ps: list[tuple[str, str]] = []
        if heads and rng.random() > 0.01:
            roll = rng.random()
            first = rng.choice(heads) if roll < 0.9 else rng.choice(ids[:i])  # continue a line, or fork
            ps.append((first, "parent"))
            if first in heads:
                heads.remove(first)
            for kind, chance in (("merge", 0.06), ("merge", 0.02), ("transfer", 0.03)):
                other = rng.choice(ids[:i])
                if rng.random() < chance and other not in {p for p, _ in ps}:
                    ps.append((other, kind))
        heads = [*heads, cid][-3:]
        parents[cid] = ps
        gen[cid] = 1 + max((gen[p] for p, _ in ps), default=0)
        rows.append({"id": cid, "created_at": T0 + timedelta(seconds=i), "generation": gen[cid], "skeleton": {},
                     "step": i, "branch": f"line{i % 3}"})
        edges += [{"child_id": cid, "parent_id": p, "kind": k, "position": j} for j, (p, k) in enumerate(ps)]
    with write_connection(parts(repo).engine) as conn:
        placed = _with_lines(rows, parents)
        conn.execute(insert(Commit), placed)
        if edges:
            conn.execute(insert(Edge), _with_forks(edges, placed))
        conn.execute(insert(Metric), [{"commit_id": c, "name": "loss", "value": rng.random()} for c in ids])
    return ids, parents


def _dist(start: str, parents: dict[str, list[tuple[str, str]]], kinds: set[str]) -> dict[str, int]:
    dist, queue = {start: 0}, deque([start])
    while queue:
        node = queue.popleft()
        for p, k in parents[node]:
            if k in kinds and p not in dist:
                dist[p] = dist[node] + 1
                queue.append(p)
    return dist


def _dist_up(start: str, children: dict[str, set[str]]) -> dict[str, int]:
    dist, queue = {start: 0}, deque([start])
    while queue:
        node = queue.popleft()
        for c in children[node]:
            if c not in dist:
                dist[c] = dist[node] + 1
                queue.append(c)
    return dist


def _bfs_up(start: str, children: dict[str, set[str]]) -> list[str]:
    """The descendants of ``start`` breadth-first, each commit's children by id (``start`` excluded)."""
    order, seen = [start], {start}
    for node in order:
        for c in sorted(children[node]):
            if c not in seen:
                seen.add(c)
                order.append(c)
    return order[1:]


def test_descendants_where_paths_multiply(tmp_path: Path, db_url: str) -> None:
    """Twelve diamonds in a row: 4,096 paths from the root to the top, more walk rows than the
    repository has edges, so the capped walk without duplicate check (SQLite) gives up and the
    exact walk answers; the answer is the same everywhere."""
    ids = [f"{i:064x}" for i in range(1, 38)]
    parents: dict[str, list[tuple[str, str]]] = {ids[0]: []}
    for k in range(12):
        low, left, right, top = ids[3 * k : 3 * k + 4]
        parents[left] = [(low, "parent")]
        parents[right] = [(low, "parent")]
        parents[top] = [(left, "parent"), (right, "merge")]
    gen: dict[str, int] = {}
    for cid in ids:
        gen[cid] = 1 + max((gen[p] for p, _ in parents[cid]), default=0)
    children: dict[str, set[str]] = {c: set() for c in ids}
    for child, ps in parents.items():
        for p, _ in ps:
            children[p].add(child)
    with ckptrepo.Repo.init(tmp_path / "diamonds", db_url=db_url) as repo:
        with write_connection(parts(repo).engine) as conn:
            placed = _with_lines([{"id": c, "created_at": T0 + timedelta(seconds=i), "generation": gen[c],
                                   "skeleton": {}} for i, c in enumerate(ids)], parents)
            conn.execute(insert(Commit), placed)
            conn.execute(insert(Edge), _with_forks([{"child_id": c, "parent_id": p, "kind": k, "position": j}
                                                    for c, ps in parents.items() for j, (p, k) in enumerate(ps)],
                                                   placed))
        with parts(repo).sessions() as s:
            repeated = s.connection().execute(graph._edge_walk(ids[0], graph.EDGE_KINDS, None, down=False,
                                                               repeat=True)).all()
            assert len(repeated) > s.scalar(select(func.count()).select_from(Edge))
        for start in (ids[0], ids[17], ids[-2]):
            assert repo.descendants(start) == _bfs_up(start, children)


def _history_by_entries(repo: ckptrepo.Repo, along: str, name: str, limit: int | None) -> list[tuple[Any, ...]]:
    """What ``analysis.history`` says, worked out from ``entries`` and ``tensor_chunks`` commit by
    commit: (commit, status, tensor id, previous tensor id, chunks changed, chunk count)."""
    chain = [repo.resolve(along)]
    while (up := repo.get_commit(chain[-1]).parents) and up[0].kind == "parent":
        chain.append(up[0].id)
    with parts(repo).sessions() as s:
        tids = [s.scalar(select(Tensor.id).join(Entry, Entry.tensor_key == Tensor.key)
                         .where(Entry.commit_id == c, Entry.name == name)) for c in chain]
        chunks = {t: list(s.scalars(select(Chunk.id).join(TensorChunk, TensorChunk.chunk_key == Chunk.key)
                                    .join(Tensor, Tensor.key == TensorChunk.tensor_key).where(Tensor.id == t)
                                    .order_by(TensorChunk.seq))) for t in set(tids) - {None}}
    out = []
    for i, (cid, this) in enumerate(zip(chain, tids, strict=True)):
        prev = tids[i + 1] if i + 1 < len(chain) else None
        if this is None and prev is None:
            out.append((cid, "absent", None, None, 0, 0))
        elif this is None or prev is None:
            n = len(chunks[this or prev])  # type: ignore[index]
            out.append((cid, "added" if prev is None else "removed", this, prev, n, n))
        elif this == prev:
            out.append((cid, "unchanged", this, prev, 0, len(chunks[this])))
        else:
            a, b = chunks[prev], chunks[this]
            differ = sum(x != y for x, y in zip(a, b, strict=False)) + abs(len(a) - len(b))
            out.append((cid, "changed", this, prev, differ, max(len(a), len(b))))
    return out[:limit]


def test_history_rows(tmp_path: Path, db_url: str) -> None:
    """``analysis.history`` along a chain whose tensor appears, stays, changes, goes away and
    comes back, whole or cut short, and for a tensor no commit has; along a fork that left the
    line of its parent (its chain crosses from one first-parent line to another), and a fork
    whose first commit lacks the tensor its fork point has (a line starts afresh), the same as
    worked out from ``entries`` commit by commit."""
    values = [None, 1.0, 1.0, 2.0, None, None, 3.0, 3.0, 4.0, 4.0]
    with ckptrepo.Repo.init(tmp_path / "hist", db_url=db_url) as repo:
        for i, v in enumerate(values):
            state = {"other": torch.full((3,), float(i))}
            if v is not None:
                state["w"] = torch.full((2, 5000), v)  # several chunks: ``differing`` counts positions
            repo.commit(state, branch="main", message=str(i), step=i, blocking=True).wait()
        points = repo.history("w", along="main")
        assert [p.status for p in points] == ["unchanged", "changed", "unchanged", "added", "absent", "removed",
                                              "changed", "unchanged", "added", "absent"]
        repo.branch("fork", "main~6")
        repo.commit({"w": torch.full((2, 5000), 9.0)}, branch="fork", step=100, blocking=True).wait()
        along_fork = repo.history("w", along="fork")
        assert [p.step for p in along_fork] == [100, 3, 2, 1, 0]
        assert [p.status for p in along_fork] == ["changed", "changed", "unchanged", "added", "absent"]
        repo.branch("gap", "main~2")  # "w" is 3.0 there; the fork drops it, then brings the same tensor back
        repo.commit({"other": torch.zeros(3)}, branch="gap", step=200, blocking=True).wait()
        repo.commit({"w": torch.full((2, 5000), 3.0), "other": torch.zeros(3)}, branch="gap", step=201,
                    blocking=True).wait()
        assert [p.status for p in repo.history("w", along="gap", limit=4)] == [
            "added", "removed", "unchanged", "added"]
        for along, name, limit in itertools.product(("main", "fork", "gap", "gap~1", "main~3"),
                                                    ("w", "other"), (None, 1, 2, 3, 5, 20)):
            expected = _history_by_entries(repo, along, name, limit)
            if all(tid is None for _, _, tid, *_ in expected):
                with pytest.raises(errors.UnknownTensor):
                    repo.history(name, along=along, limit=limit)
                continue
            found = [(p.commit_id, p.status, p.tensor.tensor_id if p.tensor else None,
                      p.previous.tensor_id if p.previous else None, p.chunks_changed, p.n_chunks)
                     for p in repo.history(name, along=along, limit=limit)]
            assert found == expected, (along, name, limit)
        with pytest.raises(errors.UnknownTensor):
            repo.history("absent", along="gap")
        with parts(repo).sessions() as s:
            placed = dict(s.execute(select(Commit.id, Commit.line_id)).all())
        assert placed[repo.resolve("fork")] == repo.resolve("fork") != placed[repo.resolve("main~6")]
        assert placed[repo.resolve("gap~1")] == repo.resolve("gap~1")


@pytest.mark.parametrize("kinds", [graph.EDGE_KINDS, ("merge", "parent")])
def test_random_dags_match_brute_force(tmp_path: Path, db_url: str, kinds: tuple[str, ...]) -> None:
    with ckptrepo.Repo.init(tmp_path / "rand", db_url=db_url) as repo:
        ids, parents = _random_dag(repo, 450, seed=len(kinds))
        rng = random.Random(7)
        allowed = set(kinds)
        children: dict[str, set[str]] = {c: set() for c in ids}
        for child, ps in parents.items():
            for p, kind in ps:
                if kind in allowed:
                    children[p].add(child)
        with parts(repo).sessions() as s:
            gen = dict(s.execute(select(Commit.id, Commit.generation)).all())
            for _ in range(40):
                a, b = rng.choice(ids[len(ids) // 2 :]), rng.choice(ids)
                da, db = _dist(a, parents, allowed), _dist(b, parents, allowed)
                common = da.keys() & db.keys()
                bases = sorted((c for c in common if not children[c] & common), key=lambda c: (-gen[c], c))
                assert graph.merge_bases(s, a, b, kinds) == bases
                chain = graph.shortest_path(s, a, b, kinds)
                if not common:
                    assert chain == []
                    continue
                length = min(da[c] + db[c] for c in common)
                turn = min((c for c in common if da[c] + db[c] == length), key=lambda c: (-gen[c], c))
                assert len(chain) == length + 1 and chain[0] == a and chain[-1] == b and turn in chain
                k = chain.index(turn)
                steps = list(itertools.pairwise(chain))
                for x, y in steps[:k]:  # down to the turn
                    assert y in {p for p, kind in parents[x] if kind in allowed}
                for x, y in steps[k:]:  # up from it
                    assert x in {p for p, kind in parents[y] if kind in allowed}
                found = graph.ancestor_ids(s, a, kinds)
                assert set(found) == set(da) - {a} and [da[x] for x in found] == sorted(da[x] for x in found)
                assert graph.ancestor_ids(s, a, kinds, 3) == [x for x in found if da[x] <= 3]
                dd = _dist_up(b, children)
                assert graph.descendant_ids(s, b, kinds) == _bfs_up(b, children)
                found = graph.descendant_ids(s, b, kinds, 4)
                assert set(found) == {x for x, d in dd.items() if 0 < d <= 4}
                assert [dd[x] for x in found] == sorted(dd[x] for x in found)
            for head in ids[-5:] + rng.sample(ids, 5):
                chain = [head]  # first parents, by brute force
                while parents[chain[-1]] and parents[chain[-1]][0][1] == "parent":
                    chain.append(parents[chain[-1]][0][0])
                for limit in (None, 1, 7, len(chain), len(chain) + 1):
                    rows = fetch_tuples(s.connection(), lines.chain_commits(head, limit, Commit.id))
                    assert sorted(rows) == list(enumerate(chain[:limit])), limit
                full = graph.log_commits(s, head, None)
                assert [c.id for c in full] == sorted(_dist(head, parents, set(graph.EDGE_KINDS)),
                                                      key=lambda c: (-ids.index(c), c))
                for limit, offset in ((1, 0), (50, 0), (30, 70), (500, 0)):
                    page = graph.log_commits(s, head, limit, offset)
                    assert [c.id for c in page] == [c.id for c in full[offset : offset + limit]]
                wanted = set(s.scalars(select(Metric.commit_id).where(Metric.name == "loss", Metric.value < 0.5)))
                page = repo.log(head, where="loss < 0.5 and step >= 10", limit=40, offset=5)
                expect = [c.id for c in full if c.id in wanted and ids.index(c.id) >= 10][5:45]
                assert [c.id for c in page] == expect


# -- CLI --------------------------------------------------------------------------------------


def _run(hand: Hand, *args: str) -> Result:
    return CliRunner().invoke(app, ["--repo", str(hand.path), *args], catch_exceptions=False)


def _ids(hand: Hand, result: Result) -> list[str]:
    assert result.exit_code == 0, result.stderr
    return hand.labels([c["id"] for c in json.loads(result.stdout)])


def _one_line_error(result: Result, code: int) -> str:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and len(lines) == 2 and lines[1].startswith("hint: "), lines
    assert "Traceback" not in result.stderr and result.stdout == ""
    return lines[0]


def test_cli_lineage_json(hand: Hand) -> None:
    assert _ids(hand, _run(hand, "lineage", "ancestors", "main", "--json")) == ["m", "r3", "f2", "r2", "f1", "r1",
                                                                                "r0"]
    assert _ids(hand, _run(hand, "lineage", "ancestors", "main", "--kind", "parent", "--depth", "2", "--json")) == [
        "m", "r3"]
    assert _ids(hand, _run(hand, "lineage", "descendants", hand["f2"], "-k", "parent", "-k", "merge", "--json")) == [
        "m", "r5"]
    assert _ids(hand, _run(hand, "lineage", "descendants", hand["r2"], "--kind", "transfer", "--json")) == ["t1"]
    assert _ids(hand, _run(hand, "lineage", "path", hand["f2"], hand["r3"], "--json")) == ["f2", "f1", "r1", "r2",
                                                                                           "r3"]
    bases = _ids(hand, _run(hand, "lineage", "merge-base", hand["A2"], hand["B2"], "--json"))
    assert bases == hand.by_gen_desc("p", "q")
    assert _ids(hand, _run(hand, "lineage", "merge-base", "main", "other", "--json")) == []
    doc = json.loads(_run(hand, "best", "--metric", "val_loss", "-n", "2", "--json").stdout)
    assert [(hand.labels([d["id"]])[0], d["value"]) for d in doc] == [("m", 1.8), ("f2", 1.9)]
    assert _ids(hand, _run(hand, "best", "-m", "val_loss", "--max", "--branch", "feat", "--json")) == ["r0"]
    assert _ids(hand, _run(hand, "best", "-m", "val_loss", "--subtree", "ft", "-n", "5", "--json")) == ["t2"]
    assert _ids(hand, _run(hand, "log", "--where", "val_loss < 2.1 and step >= 300", "--json")) == ["m", "r3"]
    assert _ids(hand, _run(hand, "log", "feat", "-w", "acc > 0", "--json")) == ["f2", "r1"]


def test_cli_text(hand: Hand) -> None:
    out = _run(hand, "lineage", "path", "main", "feat")
    assert out.exit_code == 0 and [line[:2] for line in out.stdout.splitlines()] == ["* ", "v ", "v "]
    out = _run(hand, "best", "--metric", "val_loss", "-n", "3")
    assert out.exit_code == 0 and "1.8" in out.stdout and "val_loss" in out.stdout
    out = _run(hand, "lineage", "merge-base", "main", "other")
    assert out.exit_code == 1 and "no common ancestor" in out.stderr
    out = _run(hand, "log", "main", "--graph")
    rows = out.stdout.splitlines()
    assert out.exit_code == 0 and sum(r.lstrip("|/\\ ").startswith("*") for r in rows) == 8
    assert rows[0].startswith("* ") and "|\\" in rows[2]


def _json_error(result: Result, code: int) -> str:
    """Under --json a failure is one line of JSON on stderr (error, hint, exit_code); its error."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    failure = json.loads(result.stderr)
    assert failure["exit_code"] == code and failure["hint"] and result.stdout == ""
    return str(failure["error"])


def test_cli_errors(hand: Hand) -> None:
    before = _counts(hand)
    assert "unknown revision" in _one_line_error(_run(hand, "lineage", "ancestors", "nope"), 3).lower()
    _one_line_error(_run(hand, "lineage", "merge-base", "main", "nope~3"), 3)
    assert "share no ancestor" in _one_line_error(_run(hand, "lineage", "path", "main", "other"), 3)
    assert "share no ancestor" in _json_error(_run(hand, "lineage", "path", "main", "other", "--json"), 3)
    assert "edge kind" in _one_line_error(_run(hand, "lineage", "descendants", "main", "--kind", "parent,child"), 2)
    for bad in ("step = 1; DROP TABLE commits", "'x' OR 1=1 --", "val_loss <", "(step > 1"):
        assert "where expression" in _one_line_error(_run(hand, "log", "--where", bad), 2)
        assert "where expression" in _json_error(_run(hand, "log", "--where", bad, "--json"), 2)
    assert "val_loss" in _run(hand, "log", "--where", "val_los < 2").stderr
    _one_line_error(_run(hand, "best", "--metric", "nope"), 2)
    assert _counts(hand) == before


# -- the graph drawing ------------------------------------------------------------------------


def _c(cid: str, *parents: str) -> Any:
    commit = ckptrepo.types.Commit(
        id=cid, message=cid, created_at=T0, author="", host="", branch=None, step=None, epoch=None,
        parents=tuple(Parent(p, "parent" if i == 0 else "merge") for i, p in enumerate(parents)), metrics={},
        config=None, code_version=None, n_tensors=0, logical_bytes=0, new_bytes=0, stored_bytes=0, stall_s=0.0,
        wait_s=0.0, persist_s=0.0,
    )  # fmt: skip
    return commit


def _draw(*commits: Any) -> list[str]:
    return [f"{prefix} {c.id}" if c else prefix for prefix, c in graph_rows(list(commits))]


def test_graph_drawing() -> None:
    assert _draw(_c("m", "a2", "b2"), _c("b2", "b1"), _c("a2", "a1"), _c("b1", "a1"), _c("a1")) == [
        "* m", "|\\", "| * b2", "* | a2", "| * b1", "|/", "* a1"]
    assert _draw(_c("x2", "x1"), _c("y1", "x1"), _c("x1")) == ["* x2", "| * y1", "|/", "* x1"]
    assert _draw(_c("z", "w"), _c("o", "a", "b", "c"), _c("c", "w"), _c("b", "w"), _c("a", "w"), _c("w")) == [
        "* z", "| *-. o", "| |\\ \\", "| | | * c", "| | * | b", "| * | | a", "|/ / /", "|/ /", "|/", "* w"]
    # Parents outside the listing (another page, filtered out) end their lane; children always come first.
    assert _draw(_c("t1"), _c("t2", "t1", "gone"), _c("u1")) == ["* t2", "* t1", "* u1"]
    assert _draw(_c("r1"), _c("s1", "r1"), _c("u1")) == ["* s1", "* r1", "* u1"]
