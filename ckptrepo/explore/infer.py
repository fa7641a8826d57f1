"""Where a model came from, from its weights alone: the parent (a fine-tune, a fork) or the
transfer source (a frozen body under a new head) of one model among a repository's commits
(``propose``), or a tree over many models at once (``tree``), after MoTHer (Horwitz et al., ICLR
2025: model trees recovered from weights by a minimum directed spanning tree whose edges are
oriented by how weight statistics evolve with training).

**An edge** ``p -> c`` (``score_edge``) costs ``D(p -> c)`` (``distance.directed``: the relative L2
distance over ``c``'s weights, a weight ``p`` lacks counting whole), raised when the weights say the
edge points the wrong way:

- *steps*: both models' training progress is known (an optimizer step counter in the state, else
  the recorded step) and ``p``'s is not below ``c``'s: cost ``2 D + STEP_PENALTY``. A child has
  trained longer than its parent; a fork at another learning rate may be nearer to a later
  checkpoint of the line it left than to its fork point (it moved further along the same
  direction), and the step counter is what rules those out;
- *names*, when steps do not tell: ``c`` lacks weights ``p`` has and adds none: ``2 D +
  NAME_PENALTY`` (a fine-tune or transfer keeps its source's tensors and may add a head; the
  reverse drops them);
- *tail*, when neither tells: MoTHer's observation that a weight distribution's tail grows with
  training (kurtosis there; here the stored ``log(abs_max / std)`` over the weights both hold,
  ``weights.tail_index``): when ``p``'s tail is the heavier, ``2 D``.

**Its kind**: ``transfer`` when ``c`` has weights ``p`` lacks (a new head) or took ``p``'s under other
names (``mapping``), and at least ``FROZEN_TRANSFER`` of the bytes of the weights both hold are
identical (a frozen body: equal chunks); else ``parent`` (a fine-tune changes every weight it
shares; a later checkpoint of a frozen-body run adds no weight).

**One model** (``propose``): the cheapest edge from the candidates ``similar.search`` found; none
cheaper than ``ROOT_COST`` (1: as far as a model that explains nothing of it) makes it a root. The
runner-up is the next cheapest edge. **Many models** (``tree``): the costs of the edges between them
(exact, every pair up to ``EXACT_ALL`` models; beyond, the cheapest few per model by their cost over
the statistics' bound, which is never above the exact cost) and from
the repository's commits that ``search`` finds near each, a virtual root reaching each model at
``ROOT_COST`` and each commit at 0, then the minimum spanning arborescence (``arborescence``): the
tree whose edges cost least in all, every model with one source, no cycle. A proposal's score is
``1 - cost`` (0 at ``ROOT_COST`` and beyond).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from ckptrepo.explore import distance
from ckptrepo.explore.arborescence import arborescence
from ckptrepo.explore.weights import Model, tail_index

ROOT_COST = 1.0
STEP_PENALTY = 0.1
NAME_PENALTY = 0.5
FROZEN_TRANSFER = 0.9
TIE = 1e-12  # per weight the source has and the child lacks: which of two equally near sources (a base and a
# frozen-body transfer of it are equally near a fine-tune of the base) is the source
EXACT_ALL = 24  # up to this many models in a tree, every edge between them is measured exactly
EXACT_LEAST = 4  # beyond: sources measured exactly per model, at least (then on while a bound may win)
EXACT_MOST = 16


@dataclass(frozen=True)
class Edge:
    """``source -> child``: its kind, the distance it rests on, its cost and what oriented it
    (``direction``: ``steps``, ``names``, ``tail`` or ``none``; ``against``: the cue says it points the
    wrong way, and ``cost`` carries the penalty)."""

    source: Model
    child: Model
    kind: str
    measured: distance.Directed
    cost: float
    direction: str
    against: bool

    @property
    def score(self) -> float:
        return max(0.0, min(1.0, 1.0 - self.cost))


def score_edge(source: Model, child: Model, measured: distance.Directed) -> Edge:
    """The edge ``source -> child`` over ``measured`` (``D(source -> child)``); see the module docstring."""
    d = measured.distance
    kind = "transfer" if (measured.new or measured.mapping) and measured.frozen_fraction >= FROZEN_TRANSFER \
        else "parent"
    mine, theirs = child.progress(), source.progress()
    if mine is not None and theirs is not None and mine != theirs:
        against = theirs > mine
        return Edge(source, child, kind, measured, 2 * d + STEP_PENALTY if against else d, "steps", against)
    if mine is not None and theirs is not None:  # equal: a child has trained longer than its parent
        return Edge(source, child, kind, measured, 2 * d + STEP_PENALTY, "steps", True)
    if measured.dropped and not measured.new:
        return Edge(source, child, kind, measured, 2 * d + NAME_PENALTY, "names", True)
    shared = [c for c in child.weights() if c in source.tensors and c not in measured.mapping]
    tail_c, tail_p = tail_index(child, shared), tail_index(source, shared)
    if tail_c is not None and tail_p is not None and tail_c != tail_p:
        against = tail_p > tail_c
        return Edge(source, child, kind, measured, 2 * d if against else d, "tail", against)
    return Edge(source, child, kind, measured, d, "none", False)


@dataclass(frozen=True)
class Placement:
    """Where a model goes: its chosen edge (None: a root) and the runner-up edge (None: no other)."""

    model: Model
    edge: Edge | None
    runner_up: Edge | None


def propose(child: Model, sources: Sequence[tuple[Model, distance.Directed]]) -> Placement:
    """One model's placement among ``sources`` (each with its exact ``D(source -> child)``)."""
    edges = sorted((score_edge(m, child, d) for m, d in sources),
                   key=lambda e: (e.cost + TIE * e.measured.dropped, e.source.label))
    if not edges or edges[0].cost >= ROOT_COST:
        return Placement(child, None, edges[0] if edges else None)
    return Placement(child, edges[0], edges[1] if len(edges) > 1 else None)


class PairCache:
    """Exact ``pair_sums`` between models, each unordered pair of tensors read once: the reverse edge
    of a measured one reuses its sums (the squared difference is symmetric)."""

    def __init__(self, pool: Executor) -> None:
        self._pool = pool
        self._sums: dict[tuple[str, str, str, str], distance.TensorSums] = {}

    def directed(self, source: Model, child: Model) -> distance.Directed:
        pairs = distance.matched_names(source, child)
        missing = [(c, p) for c, p in pairs if self._key(child, c, source, p) not in self._sums]
        if missing:
            for (c, p), sums in distance.pair_sums(source, child, self._pool, missing).items():
                self._sums[self._key(child, c, source, p)] = sums
        return distance.directed(source, child, {(c, p): self._sums[self._key(child, c, source, p)]
                                                 for c, p in pairs})

    @staticmethod
    def _key(a: Model, a_name: str, b: Model, b_name: str) -> tuple[str, str, str, str]:
        return (a.label, a_name, b.label, b_name) if a.label <= b.label else (b.label, b_name, a.label, a_name)


def tree(models: Sequence[Model], pool: Executor,
         outside: Callable[[Model], Sequence[tuple[Model, distance.Directed]]] = lambda m: ()) -> list[Placement]:
    """Placements of ``models`` as one tree (see the module docstring), parents before children
    (a line of parents kept together, in order of cost). ``outside(model)``: stored commits that may
    be its source, each with its exact distance (none by default)."""
    cache = PairCache(pool)
    edges: dict[tuple[str, str], Edge] = {}
    fixed: dict[str, Model] = {}
    for child in models:
        # Each source's cost over the statistics' bound (direction cues included) is a lower bound of
        # its exact cost: measure in that order; with more than EXACT_ALL models, stop after
        # EXACT_MOST, or after EXACT_LEAST once no bound can beat the second cheapest exact cost of
        # an edge its cues do not oppose (an opposed edge is often the reverse of a true one, which
        # the tree cannot use both ways).
        bounds = sorted((score_edge(m, child, distance.directed(m, child)) for m in models if m is not child),
                        key=lambda e: (e.cost, e.source.label))
        agreed: list[float] = []
        for i, bound in enumerate(bounds):
            if len(models) > EXACT_ALL and (i >= EXACT_MOST or (i >= EXACT_LEAST and len(agreed) >= 2
                                                                and bound.cost >= sorted(agreed)[1])):
                break
            e = score_edge(bound.source, child, cache.directed(bound.source, child))
            edges[(bound.source.label, child.label)] = e
            if not e.against:
                agreed.append(e.cost)
        for commit, measured in outside(child):
            fixed[commit.label] = commit
            edges[(commit.label, child.label)] = score_edge(commit, child, measured)
    labels = ["", *sorted(fixed), *[m.label for m in models]]
    index = {label: i for i, label in enumerate(labels)}
    cost = {(0, index[c]): 0.0 for c in fixed}
    cost.update({(0, index[m.label]): ROOT_COST for m in models})
    cost.update({(index[s], index[c]): e.cost + TIE * e.measured.dropped for (s, c), e in edges.items()})
    parents = arborescence(len(labels), 0, cost)
    by_label = {m.label: m for m in models}
    placed: dict[str, Placement] = {}
    for m in models:
        src = labels[parents[index[m.label]]]
        incoming = sorted((e for (s, c), e in edges.items() if c == m.label), key=lambda e: (e.cost, e.source.label))
        chosen = edges[(src, m.label)] if src else None
        others = [e for e in incoming if e is not chosen]
        placed[m.label] = Placement(m, chosen, others[0] if others else None)
    return _in_order(placed, by_label)


def _in_order(placed: dict[str, Placement], by_label: dict[str, Model]) -> list[Placement]:
    """Parents before children, depth first from the roots (those placed under a commit, or none),
    each node's children cheapest first, so a line of parents stays together."""
    children: dict[str, list[Placement]] = {}
    roots: list[Placement] = []
    for p in placed.values():
        src = p.edge.source.label if p.edge is not None else None
        if src is not None and src in by_label:
            children.setdefault(src, []).append(p)
        else:
            roots.append(p)
    order: list[Placement] = []

    def key(p: Placement) -> tuple[float, str]:
        return (p.edge.cost if p.edge is not None else math.inf, p.model.label)

    stack = sorted(roots, key=key, reverse=True)
    while stack:
        p = stack.pop()
        order.append(p)
        stack.extend(sorted(children.get(p.model.label, []), key=key, reverse=True))
    return order
