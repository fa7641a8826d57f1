"""The lineage graph's server-side layout (``ckptrepo.ui.graph``) on hand-made graphs: rows by
generation, one lane per chain of first parents, lanes shared when rows do not overlap, the
default branch first, and the lane each edge's vertical part runs in."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from ckptrepo.types import GraphEdge, GraphNode, LineageGraph, RefInfo
from ckptrepo.ui.graph import layout, newest_first, payload

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


class Builder:
    """Commits named by strings; ``add(name, parent, merge=..., transfer=...)``."""

    def __init__(self) -> None:
        self.nodes: dict[str, GraphNode] = {}
        self.edges: list[GraphEdge] = []
        self.refs: list[RefInfo] = []

    def add(self, name: str, parent: str | None = None, *, merge: str | None = None,
            transfer: str | None = None) -> str:
        parents = [(p, k) for p, k in ((parent, "parent"), (merge, "merge"), (transfer, "transfer")) if p]
        generation = 1 + max((self.nodes[p].generation for p, _ in parents), default=0)
        depth = self.nodes[parent].line_depth + 1 if parent else 0
        self.nodes[name] = GraphNode(name, f"commit {name}", T0 + timedelta(seconds=len(self.nodes)), None, None,
                                     False, generation, name, depth)
        self.edges += [GraphEdge(name, p, k, i) for i, (p, k) in enumerate(parents)]
        return name

    def branch(self, name: str, at: str) -> None:
        self.refs.append(RefInfo(name, "branch", at))

    def graph(self) -> LineageGraph:
        nodes = sorted(self.nodes.values(), key=lambda n: (n.generation, n.created_at))
        return LineageGraph(tuple(nodes), tuple(self.edges), tuple(sorted(self.refs, key=lambda r: r.name)))


def _placed(b: Builder, first: str = "main") -> tuple[dict[str, tuple[int, int]], dict[tuple[str, str], int | None]]:
    g = b.graph()
    placed = layout(g, first)
    where = {n.id: (placed.lanes[i], placed.rows[i]) for i, n in enumerate(g.nodes)}
    vias = {(e.child, e.parent): v for e, v in zip(g.edges, placed.vias, strict=True)}
    return where, vias


def test_a_chain_is_one_lane_and_rows_are_generations() -> None:
    b = Builder()
    prev = None
    for i in range(5):
        prev = b.add(f"m{i}", prev)
    b.branch("main", prev)  # type: ignore[arg-type]
    where, _ = _placed(b)
    assert where == {f"m{i}": (0, i) for i in range(5)}


def test_branches_take_their_own_lanes_and_share_them_when_their_rows_do_not_overlap() -> None:
    b = Builder()
    main = [b.add("m0")]
    for i in range(1, 12):
        main.append(b.add(f"m{i}", main[-1]))
    b.branch("main", main[-1])
    early = b.add("a1", main[1])
    early = b.add("a2", early)  # rows 2..3, forked at row 1
    late = b.add("c1", main[6])  # rows 7..8, forked at row 6: lane 1 is free again
    late = b.add("c2", late)
    overlapping = b.add("d1", main[6])
    b.branch("a", early)
    b.branch("c", late)
    b.branch("d", overlapping)
    where, vias = _placed(b)
    assert {where[m][0] for m in main} == {0}
    assert where["a1"][0] == where["a2"][0] == where["c1"][0] == 1
    assert where["d1"][0] == 2  # overlaps c's rows
    assert vias[("a1", "m1")] == 1 and vias[("c1", "m6")] == 1  # forks run up the child's lane
    assert vias[("m5", "m4")] == 0
    assert len(set(where.values())) == len(where)


def test_the_default_branch_keeps_lane_0_whichever_commit_came_first() -> None:
    b = Builder()
    root = b.add("r")
    side = b.add("s1", root)  # the first child of r: the database's line would continue here
    main = b.add("m1", root)
    main = b.add("m2", main)
    b.branch("main", main)
    b.branch("side", side)
    where, _ = _placed(b)
    assert where["r"][0] == where["m1"][0] == where["m2"][0] == 0 and where["s1"][0] == 1
    where, _ = _placed(b, first="side")
    assert where["r"][0] == where["s1"][0] == 0 and where["m1"][0] == 1


def test_a_merged_branch_keeps_its_lane_up_to_the_merge() -> None:
    b = Builder()
    main = [b.add("m0")]
    for i in range(1, 10):
        main.append(b.add(f"m{i}", main[-1]))
    feature = b.add("f1", main[1])  # row 2; merged at row 9
    merged = b.add("merge", main[-1], merge=feature)
    later = b.add("x1", main[5])  # rows 6..: would fit lane 1 but for the merge's route
    b.branch("main", merged)
    b.branch("x", later)
    where, vias = _placed(b)
    assert where["f1"][0] == 1 and where["x1"][0] == 2
    assert vias[("merge", "f1")] == 1  # up the merged branch's lane, then into the merge
    assert vias[("merge", "m9")] == 0


def test_a_merge_from_inside_a_chain_runs_in_a_lane_of_its_own() -> None:
    b = Builder()
    main = [b.add("m0")]
    for i in range(1, 8):
        main.append(b.add(f"m{i}", main[-1]))
    side = b.add("s1", main[0])
    side = b.add("s2", side, merge=main[1])  # from the next row down: a plain curve
    side = b.add("s3", side)
    side = b.add("s4", side, merge=main[2])  # m2 is inside main's chain, two rows down
    b.branch("main", main[-1])
    b.branch("side", side)
    where, vias = _placed(b)
    assert where["s1"][0] == 1 and {where[m][0] for m in main} == {0}
    assert vias[("s2", "m1")] is None
    assert vias[("s4", "m2")] not in (None, 0, 1)  # neither main's lane nor the side's


def test_transfers_and_unreferenced_commits_are_placed_and_the_payload_names_them() -> None:
    b = Builder()
    base = b.add("base")
    b.branch("base", base)
    main = b.add("m0", transfer=base)
    main = b.add("m1", main)
    b.branch("main", main)
    orphan = b.add("o1", "m0")  # reached by no ref
    g = b.graph()
    placed = layout(g, "main")
    data = payload(placed)
    nodes = {n["id"]: n for n in data["nodes"]}
    # main's history has lane 0 to itself, though the base it was initialised from sits lower;
    # the orphan overlaps the base's route up to m0, so it takes a third lane.
    assert (nodes["m0"]["x"], nodes["m1"]["x"], nodes["base"]["x"], nodes[orphan]["x"]) == (0, 0, 1, 2)
    assert placed.vias[[e.child for e in g.edges].index("m0")] == 1  # up the base's lane
    assert {(e["child"], e["parent"], e["kind"]) for e in data["edges"]} == {
        ("m0", "base", "transfer"), ("m1", "m0", "parent"), ("o1", "m0", "parent")}
    assert nodes["m1"]["refs"] == ["main"] and nodes["base"]["refs"] == ["base"]
    assert data["lanes"] == placed.lane_count and data["rows"] == 3
    assert newest_first(data["nodes"])[0]["id"] == "m1"


def test_an_empty_graph() -> None:
    placed = layout(LineageGraph((), (), ()), "main")
    assert (placed.lane_count, placed.row_count) == (0, 0)
    assert payload(placed)["nodes"] == []
