"""Commit policies driven by a simulated loop: intervals, re-tuning, composition, Young/Daly."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import pytest

from ckptrepo.policy import (
    Adaptive,
    Any,
    DenseEarly,
    Every,
    Policy,
    YoungDaly,
    expected_loss_rate,
    young_daly_interval,
)


@dataclass
class Loop:
    """A loop whose steps take ``step_s``; a commit blocks ``stall_s`` and slows ``busy_steps`` steps by ``slow_s``."""

    step_s: float = 0.1
    stall_s: float = 0.02
    slow_s: float = 0.05
    busy_steps: int = 4
    commits: list[tuple[int, str]] = field(default_factory=list)

    @property
    def cost_s(self) -> float:
        return self.stall_s + self.busy_steps * self.slow_s

    def run(self, policy: Policy, steps: int, start: int = 1) -> None:
        busy = 0
        for step in range(start, start + steps):
            seconds = self.step_s + (self.slow_s if busy else 0.0)
            policy.step(step, seconds, busy > 0)
            busy = max(0, busy - 1)
            rule = policy.due(step)
            if rule is not None:
                self.commits.append((step, rule))
                policy.committed(step, self.stall_s)
                busy = self.busy_steps

    def gaps(self) -> list[int]:
        steps = [s for s, _ in self.commits]
        return [b - a for a, b in itertools.pairwise(steps)]


def test_every_commits_at_multiples_of_k() -> None:
    loop = Loop()
    loop.run(Every(7), 30)
    assert loop.commits == [(7, "every(7)"), (14, "every(7)"), (21, "every(7)"), (28, "every(7)")]


def test_adaptive_probes_once_then_commits_at_the_smallest_interval_within_budget() -> None:
    loop, policy = Loop(), Adaptive(max_overhead=0.035)
    loop.run(policy, 2000)
    first_step, first_rule = loop.commits[0]
    assert first_rule == "probe" and first_step == 5  # after the 5-step warm-up
    expected = math.ceil(loop.cost_s / (0.035 * loop.step_s))  # 0.22 s / 3.5 ms -> 63
    assert policy.interval == expected == 63
    assert set(loop.gaps()[1:]) == {expected}
    assert all(rule == f"adaptive({expected})" for _, rule in loop.commits[1:])
    # the interval fits the budget, and one step less would not
    assert loop.cost_s / (expected * loop.step_s) <= 0.035 < loop.cost_s / ((expected - 1) * loop.step_s)
    assert policy.meter.cost_s == pytest.approx(loop.cost_s) and policy.meter.step_s == pytest.approx(loop.step_s)


def test_adaptive_retunes_when_the_step_time_or_the_cost_drifts() -> None:
    loop, policy = Loop(), Adaptive()
    loop.run(policy, 500)
    assert policy.interval == 63
    loop.step_s = 0.2  # the steps get slower: half as many of them pay for a commit
    loop.run(policy, 1000, start=501)
    assert policy.interval == 32
    loop.slow_s = 0.15  # the commit's background work gets dearer
    loop.run(policy, 1000, start=1501)
    assert policy.interval == math.ceil((0.02 + 4 * 0.15) / (0.035 * 0.2))


def test_adaptive_bounds() -> None:
    loop, policy = Loop(), Adaptive(max_interval=20)
    loop.run(policy, 200)
    assert policy.interval == 20 and set(loop.gaps()[1:]) == {20}
    loop, policy = Loop(stall_s=0.0, slow_s=0.0), Adaptive(min_interval=50)
    loop.run(policy, 200)
    assert policy.interval == 50


def test_young_daly_interval_is_youngs_for_cheap_checkpoints_and_minimises_the_loss() -> None:
    assert young_daly_interval(1.0, 86_400) == pytest.approx(math.sqrt(2 * 86_400), rel=0.01)
    assert young_daly_interval(100.0, 10.0) == 10.0  # C >= 2M: every M
    for cost, mtbf in [(0.2, 3600.0), (30.0, 86_400.0), (60.0, 600.0)]:
        best = young_daly_interval(cost, mtbf)
        at_best = expected_loss_rate(best, cost, mtbf)
        assert at_best <= expected_loss_rate(best * 0.7, cost, mtbf)
        assert at_best <= expected_loss_rate(best * 1.4, cost, mtbf)
    assert expected_loss_rate(100.0, 1.0, 1000.0, restart_s=50.0) > expected_loss_rate(100.0, 1.0, 1000.0)


def test_young_daly_policy_converts_the_interval_to_steps() -> None:
    loop, policy = Loop(), YoungDaly(mtbf_s=3600.0)
    loop.run(policy, 2000)
    expected = round(young_daly_interval(loop.cost_s, 3600.0) / loop.step_s)
    assert policy.interval == expected
    assert set(loop.gaps()[1:]) == {expected}
    assert loop.commits[1][1] == f"young-daly({expected})"
    rate = policy.loss_rate()
    assert rate is not None and rate == pytest.approx(
        expected_loss_rate(expected * loop.step_s, loop.cost_s, 3600.0), rel=1e-9)


def test_dense_early_spacing_grows_and_never_exceeds_the_budget() -> None:
    loop, policy = Loop(stall_s=0.005, slow_s=0.005, busy_steps=2), DenseEarly(first=10, growth=1.5)
    loop.run(policy, 3000)
    budget = math.ceil(loop.cost_s / (0.035 * loop.step_s))  # 0.015 s / 3.5 ms -> 5
    steps = [s for s, _ in loop.commits]
    assert steps[0] == 10 and loop.commits[0][1] == "probe"
    gaps = loop.gaps()
    assert all(g >= budget for g in gaps)
    assert gaps == sorted(gaps) and gaps[-1] > 10 * gaps[0]
    assert steps[-1] > 1000 and len(steps) < 25


def test_dense_early_max_interval_caps_the_spacing() -> None:
    loop, policy = Loop(stall_s=0.005, slow_s=0.005, busy_steps=2), DenseEarly(max_interval=100)
    loop.run(policy, 1000)
    assert max(loop.gaps()) == 100


def test_any_commits_when_either_wants_and_intervals_count_from_every_commit() -> None:
    loop, policy = Loop(), Any(Every(100), Adaptive())
    loop.run(policy, 400)
    rules = dict(loop.commits)
    assert rules[5] == "probe" and rules[100] == "every(100)" and rules[68] == "adaptive(63)"
    assert rules[163] == "adaptive(63)"  # 63 steps after the every(100) commit at 100, not after 131
    assert 131 not in rules


@pytest.mark.parametrize("make", [
    lambda: Every(0), lambda: Adaptive(0.0), lambda: Adaptive(1.5), lambda: Adaptive(min_interval=10, max_interval=5),
    lambda: YoungDaly(0.0), lambda: YoungDaly(restart_s=-1.0), lambda: DenseEarly(first=0),
    lambda: DenseEarly(growth=1.0), lambda: Any(), lambda: Adaptive(warmup=0),
])
def test_bad_arguments_are_refused(make: object) -> None:
    with pytest.raises(ValueError):
        make()  # type: ignore[operator]
