"""The pieces lineage inference scores with: weight names, distances and their statistics' bound,
edge kinds and directions, the minimum spanning arborescence and where accepted commits go."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from ckptrepo import types as t
from ckptrepo.errors import UsageError
from ckptrepo.explore import distance, infer
from ckptrepo.explore.arborescence import NoArborescence, arborescence
from ckptrepo.explore.recover import branch_plan
from ckptrepo.explore.weights import Model, is_optimizer_state, state_model
from ckptrepo.ingest.sources import Source

CHUNK = 4096  # bytes: the larger tensors below span several chunks


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2) as p:
        yield p


def model(label: str, tensors: Mapping[str, np.ndarray], pool: ThreadPoolExecutor, step: int | None = None) -> Model:
    sources = [Source(name, str(a.dtype), a.shape, memoryview(np.ascontiguousarray(a).tobytes()))
               for name, a in tensors.items()]
    return state_model(label, sources, CHUNK, pool, step=step)


def test_optimizer_state_is_told_from_weights_by_its_names() -> None:
    for name in ("optim.encoder.w.exp_avg", "optimizer/state/0/exp_avg_sq", "optimizer_states/0/state/1/step",
                 "opt.layer.momentum_buffer", "optimizer/param_groups/0/lr"):
        assert is_optimizer_state(name), name
    for name in ("model/encoder.layer.0.weight", "classifier.bias", "state_dict/fc.weight", "stepper.weight"):
        assert not is_optimizer_state(name), name


def test_a_models_weights_leave_out_optimizer_state_and_integers(pool: ThreadPoolExecutor) -> None:
    m = model("m", {"w": np.ones((4, 4), np.float32), "ids": np.arange(4), "optim.w.exp_avg": np.zeros(16, np.float32),
                    "optim.w.step": np.array(7.0, np.float32)}, pool)
    assert list(m.weights()) == ["w"]
    assert m.optimizer_step() == 7.0 and m.progress() == 7.0
    assert model("n", {"w": np.ones(3, np.float32)}, pool, step=12).progress() == 12.0


def test_the_exact_distance_reads_differing_chunks_and_the_bound_stays_below_it(pool: ThreadPoolExecutor) -> None:
    rng = np.random.default_rng(0)
    big = rng.standard_normal(8192).astype(np.float32)  # 8 chunks of 4 KiB
    changed = big.copy()
    changed[:1024] += 0.01 * rng.standard_normal(1024).astype(np.float32)  # the first chunk only
    head = rng.standard_normal(64).astype(np.float32)
    parent = model("p", {"w": big, "b": np.ones(8, np.float32)}, pool)
    child = model("c", {"w": changed, "b": np.ones(8, np.float32), "head": head}, pool)

    sums = distance.pair_sums(parent, child, pool)
    exact = distance.directed(parent, child, sums)
    head_sq = float(np.sum(head.astype(np.float64) ** 2))
    want = math.sqrt(float(np.sum((changed.astype(np.float64) - big) ** 2)) + head_sq)
    norm = math.sqrt(float(np.sum(changed.astype(np.float64) ** 2)) + 8 + head_sq)
    assert exact.distance == pytest.approx(want / norm, rel=1e-5)
    assert (exact.matched, exact.new, exact.dropped) == (2, 1, 0)
    assert exact.frozen_fraction == pytest.approx((7 * 4096 + 32) / (8192 * 4 + 32))  # 7 of 8 chunks, and b
    assert exact.per_tensor["b"] == 0.0 and exact.per_tensor["w"] > 0
    assert distance.directed(parent, child).distance <= exact.distance  # the statistics' bound
    same = distance.directed(parent, parent, distance.pair_sums(parent, parent, pool))
    assert same.distance == 0.0 and same.frozen_fraction == 1.0


def test_a_tensor_taken_under_another_name_is_matched_by_its_content(pool: ThreadPoolExecutor) -> None:
    body = np.arange(300, dtype=np.float32)
    source = model("s", {"encoder.w": body}, pool)
    child = model("c", {"backbone.w": body, "head.w": np.ones(10, np.float32)}, pool)
    d = distance.directed(source, child, distance.pair_sums(source, child, pool))
    assert d.mapping == {"backbone.w": "encoder.w"} and d.frozen_fraction == 1.0 and d.new == 1
    assert infer.score_edge(source, child, d).kind == "transfer"


def test_edge_kinds_and_directions(pool: ThreadPoolExecutor) -> None:
    rng = np.random.default_rng(1)
    body = rng.standard_normal(5000).astype(np.float32)
    base = model("base", {"body": body}, pool)
    tuned = model("tuned", {"body": body + 1e-3, "classifier": np.ones(4, np.float32)}, pool)
    probe = model("probe", {"body": body, "head": np.ones(4, np.float32)}, pool)

    def edge(p: Model, c: Model) -> infer.Edge:
        return infer.score_edge(p, c, distance.directed(p, c, distance.pair_sums(p, c, pool)))

    assert edge(base, tuned).kind == "parent"  # every shared weight changed: a fine-tune
    assert edge(base, probe).kind == "transfer"  # the body frozen, a new head
    backwards = edge(tuned, base)  # the base would have dropped the classifier
    assert (backwards.direction, backwards.against) == ("names", True)
    assert backwards.cost == pytest.approx(2 * backwards.measured.distance + infer.NAME_PENALTY)

    early = model("early", {"body": body, "optim.body.step": np.array(10.0, np.float32)}, pool)
    late = model("late", {"body": body + 1e-3, "optim.body.step": np.array(20.0, np.float32)}, pool)
    forward, reverse = edge(early, late), edge(late, early)
    assert (forward.direction, forward.against, forward.cost) == ("steps", False, forward.measured.distance)
    assert reverse.against and reverse.cost == pytest.approx(2 * reverse.measured.distance + infer.STEP_PENALTY)
    assert forward.score > reverse.score


def test_a_model_nothing_explains_is_a_root(pool: ThreadPoolExecutor) -> None:
    rng = np.random.default_rng(2)
    a = model("a", {"w": rng.standard_normal(100).astype(np.float32)}, pool)
    b = model("b", {"v": rng.standard_normal(100).astype(np.float32)}, pool)  # no weight in common
    placed = infer.propose(b, [(a, distance.directed(a, b, distance.pair_sums(a, b, pool)))])
    assert placed.edge is None and placed.runner_up is not None and placed.runner_up.cost >= infer.ROOT_COST
    assert infer.propose(b, []).edge is None


def test_the_tree_recovers_a_chain_and_its_fork(pool: ThreadPoolExecutor) -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal(2000).astype(np.float32)
    steps = {"m0": 0.0, "m1": 10.0, "m2": 20.0, "f1": 20.0}
    values = {"m0": w, "m1": w + 0.01, "m2": w + 0.02}
    values["f1"] = values["m1"] - 0.03 * rng.standard_normal(2000).astype(np.float32)
    models = [model(n, {"w": v, "optim.w.step": np.array(steps[n], np.float32)}, pool) for n, v in values.items()]
    placed = infer.tree(list(reversed(models)), pool)
    got = {p.model.label: (p.edge.source.label if p.edge else None) for p in placed}
    assert got == {"m0": None, "m1": "m0", "m2": "m1", "f1": "m1"}
    order = [p.model.label for p in placed]
    assert order.index("m0") < order.index("m1") < min(order.index("m2"), order.index("f1"))


def test_arborescence_breaks_the_cycle_of_cheapest_edges() -> None:
    # 1 and 2 are each other's cheapest source; the root reaches 1 dearer than 2.
    costs = {(0, 1): 5.0, (0, 2): 6.0, (1, 2): 1.0, (2, 1): 1.0, (2, 3): 2.0, (1, 3): 4.0}
    assert arborescence(4, 0, costs) == {1: 0, 2: 1, 3: 2}
    assert arborescence(3, 0, {(0, 1): 1.0, (1, 2): 1.0, (0, 2): 3.0}) == {1: 0, 2: 1}
    with pytest.raises(NoArborescence):
        arborescence(3, 0, {(0, 1): 1.0})


def _proposal(model: str, kind: str | None, parent: str | None) -> t.LineageProposal:
    return t.LineageProposal(model=model, kind=kind, parent=parent, score=0.5, runner_up=None, evidence=None)


def test_branch_plan_keeps_a_line_on_one_branch_and_starts_one_per_fork_and_transfer() -> None:
    plan = branch_plan([_proposal("d/base.pt", None, None), _proposal("d/a1.pt", "parent", "d/base.pt"),
                        _proposal("d/a2.pt", "parent", "d/a1.pt"), _proposal("d/f1.pt", "parent", "d/a1.pt"),
                        _proposal("d/t1.pt", "transfer", "d/base.pt")], "run", None, ["main"])
    assert [(s.path, s.branch, s.parents, s.transfer_from) for s in plan] == [
        ("d/base.pt", "run", None, None), ("d/a1.pt", "run", ["d/base.pt"], None),
        ("d/a2.pt", "run", ["d/a1.pt"], None), ("d/f1.pt", "run-f1", ["d/a1.pt"], None),
        ("d/t1.pt", "run-t1", None, "d/base.pt")]
    head = "ab" * 32
    plan = branch_plan([_proposal("x.pt", "parent", head), _proposal("y.pt", None, None)], "main", head, ["main"])
    assert [(s.branch, s.parents) for s in plan] == [("main", [head]), ("main-y", None)]
    with pytest.raises(UsageError, match="comes after it"):
        branch_plan([_proposal("a.pt", "parent", "b.pt"), _proposal("b.pt", None, None)], "main", None, [])


def test_the_exact_stage_stops_once_no_bound_can_beat_the_best(pool: ThreadPoolExecutor) -> None:
    from ckptrepo.explore.similar import Found, measure

    rng = np.random.default_rng(4)
    w = rng.standard_normal(3000).astype(np.float32)
    query = model("q", {"w": w}, pool)
    found = []
    for i in range(10):  # candidates ever farther from the query, in scale (so the bound sees it too)
        m = model(f"c{i}", {"w": w * (1 + 0.05 * (i + 1))}, pool)
        found.append(Found(m, 0, 0.0, distance.directed(m, query)))
    found.sort(key=lambda f: f.bound.distance)
    measure(found, query, pool, n=1)
    done = [f for f in found if f.exact is not None]
    assert [f.model.label for f in done] == ["c0", "c1", "c2"]  # max(n, 3), then no bound below the best
    best = min(f.exact.distance for f in done if f.exact is not None)
    assert all(f.bound.distance >= best for f in found if f.exact is None)
    assert all(f.bound.distance <= f.exact.distance * (1 + 1e-6) for f in done if f.exact is not None)
