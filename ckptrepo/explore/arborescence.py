"""A minimum spanning arborescence (Chu-Liu/Edmonds): the cheapest set of edges giving every node
but the root exactly one incoming edge, with no cycle, so that every node is reached from the root.

Pure and small: nodes are ``0..n-1``, ``costs`` maps ``(source, target)`` to a finite cost, and
ties are broken by the smaller source so results do not depend on dict order. O(n * edges), meant
for the few hundred models of one import.
"""

from __future__ import annotations

from collections.abc import Mapping


class NoArborescence(ValueError):
    """Some node cannot be reached from the root through the given edges."""


def arborescence(n: int, root: int, costs: Mapping[tuple[int, int], float]) -> dict[int, int]:
    """Each node's parent (every node but ``root``) in a minimum-cost spanning arborescence rooted at
    ``root``. NoArborescence when a node other than the root has no incoming edge at all."""
    edges = [(u, v, w) for (u, v), w in sorted(costs.items()) if u != v and v != root]
    chosen = _edmonds(list(range(n)), root, [(u, v, w, (u, v)) for u, v, w in edges])
    return {v: u for u, v in chosen}


def _edmonds(nodes: list[int], root: int,
             edges: list[tuple[int, int, float, tuple[int, int]]]) -> list[tuple[int, int]]:
    """The original edges (the fourth field of each) of a minimum arborescence over ``edges``
    ``(source, target, cost, original)``."""
    best: dict[int, tuple[int, int, float, tuple[int, int]]] = {}
    for e in edges:
        u, v, w, _ = e
        if v == root or u == v:
            continue
        if v not in best or w < best[v][2] or (w == best[v][2] and u < best[v][0]):
            best[v] = e
    for v in nodes:
        if v != root and v not in best:
            raise NoArborescence(f"node {v} has no incoming edge")
    cycle = _find_cycle(nodes, root, {v: e[0] for v, e in best.items()})
    if cycle is None:
        return [best[v][3] for v in nodes if v != root]
    # Contract the cycle into a new node; an edge into it costs what it adds beyond the cycle's edge it replaces.
    merged = max(nodes) + 1
    members = set(cycle)
    inner = {v: best[v][2] for v in cycle}
    contracted: list[tuple[int, int, float, tuple[int, int]]] = []
    origin: dict[tuple[int, int], tuple[int, int, float, tuple[int, int]]] = {}
    for e in edges:
        u, v, w, orig = e
        if u in members and v in members:
            continue
        if v in members:
            new = (u, merged, w - inner[v], orig)
            contracted.append(new)
            origin[orig] = e
        elif u in members:
            contracted.append((merged, v, w, orig))
        else:
            contracted.append(e)
    rest = [v for v in nodes if v not in members] + [merged]
    picked = _edmonds(rest, root, contracted)
    out: list[tuple[int, int]] = []
    entering_target = None
    for orig in picked:
        if orig in origin:  # the edge entering the cycle: it breaks the cycle at its target
            entering_target = origin[orig][1]
        out.append(orig)
    for v in cycle:
        if v != entering_target:
            out.append(best[v][3])
    return out


def _find_cycle(nodes: list[int], root: int, parent: Mapping[int, int]) -> list[int] | None:
    """A cycle of the parent function (nodes in it), or None."""
    state: dict[int, int] = {}  # 1: on the current walk, 2: done
    for start in nodes:
        walk = []
        v = start
        while v != root and state.get(v) is None:
            state[v] = 1
            walk.append(v)
            v = parent[v]
        if v != root and state.get(v) == 1:
            return walk[walk.index(v):]
        for x in walk:
            state[x] = 2
    return None
