"""Commit policies driven by a simulated loop: warm-up, cost estimate, budget, intervals, re-tuning,
composition, Young/Daly."""

from __future__ import annotations

import itertools
import math
import random
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
    """A loop whose steps take ``step_s``; a commit blocks ``stall_s`` and slows ``busy_steps`` steps by
    ``slow_s``. ``extra``: seconds added to the stall of the n-th commit (0: the first, a cold start's)."""

    step_s: float = 0.1
    stall_s: float = 0.02
    slow_s: float = 0.05
    busy_steps: int = 4
    extra: dict[int, float] = field(default_factory=dict)
    commits: list[tuple[int, str]] = field(default_factory=list)
    busy: int = 0  # steps the last commit's background phase has still to slow

    @property
    def cost_s(self) -> float:
        return self.stall_s + self.busy_steps * self.slow_s

    def run(self, policy: Policy, steps: int, start: int = 1) -> None:
        for step in range(start, start + steps):
            seconds = self.step_s + (self.slow_s if self.busy else 0.0)
            policy.step(step, seconds, self.busy > 0)
            self.busy = max(0, self.busy - 1)
            rule = policy.due(step)
            if rule is not None:
                policy.committed(step, self.stall_s + self.extra.get(len(self.commits), 0.0))
                self.commits.append((step, rule))
                self.busy = self.busy_steps

    def gaps(self) -> list[int]:
        steps = [s for s, _ in self.commits]
        return [b - a for a, b in itertools.pairwise(steps)]


def test_every_commits_at_multiples_of_k() -> None:
    loop = Loop()
    loop.run(Every(7), 30)
    assert loop.commits == [(7, "every(7)"), (14, "every(7)"), (21, "every(7)"), (28, "every(7)")]


def test_adaptive_warms_up_probes_then_commits_at_the_smallest_interval_within_budget() -> None:
    loop, policy = Loop(extra={0: 0.6}), Adaptive(max_overhead=0.035)  # a cold first commit: 0.62 s stall
    loop.run(policy, 2000)
    # after the 5-step warm-up: a warm-up commit, and a probe as soon as its background phase ends
    assert loop.commits[:2] == [(5, "warm-up"), (10, "probe")]
    expected = math.ceil(loop.cost_s / (0.035 * loop.step_s))  # 0.22 s / 3.5 ms -> 63
    assert policy.interval == expected == 63  # the warm commit's cost sets it, not the cold one's
    # the budget earned since the first step pays for three commits first: the warm-up (charged as
    # a warm one), the probe and the next
    assert loop.commits[2] == (math.ceil(3 * loop.cost_s / (0.035 * loop.step_s)), "adaptive(63)")
    assert set(loop.gaps()[2:]) == {expected}
    # the interval fits the budget, and one step less would not
    assert loop.cost_s / (expected * loop.step_s) <= 0.035 < loop.cost_s / ((expected - 1) * loop.step_s)
    assert policy.meter.cost_s == pytest.approx(loop.cost_s) and policy.meter.step_s == pytest.approx(loop.step_s)
    assert policy.meter.one_time_s == pytest.approx(0.6)  # reported apart, not charged
    assert policy.meter.spent_s == pytest.approx(len(loop.commits) * loop.cost_s)
    assert policy.overhead is not None and 0.03 < policy.overhead <= 0.035


def test_adaptive_from_a_cold_start_commits_often_within_budget() -> None:
    """The loop of issue 46, on a simulated clock: 23 ms steps, a warm commit stalls 7 ms and slows
    two steps by 10 ms, the first stalls half a second more."""
    loop, policy = Loop(step_s=0.023, stall_s=0.007, slow_s=0.01, busy_steps=2, extra={0: 0.5}), Adaptive(0.05)
    loop.run(policy, 300)
    assert [rule for _, rule in loop.commits[:3]] == ["warm-up", "probe", "adaptive(24)"]
    assert len(loop.commits) >= 10 and set(loop.gaps()[2:]) == {24}
    assert policy.overhead is not None and 0.04 < policy.overhead <= 0.05
    assert policy.meter.one_time_s == pytest.approx(0.5)


def test_a_first_commit_trusted_when_asked() -> None:
    loop, policy = Loop(), Adaptive(warmup_commits=0)
    loop.run(policy, 200)
    # its cost trusted, the probe is the first of the commits the budget pays for
    assert loop.commits[:2] == [(5, "probe"), (math.ceil(2 * loop.cost_s / 0.0035), "adaptive(63)")]
    loop, policy = Loop(extra={0: 1.0, 1: 0.5}), Adaptive(warmup_commits=2)
    loop.run(policy, 400)
    assert [r for _, r in loop.commits[:3]] == ["warm-up", "warm-up", "probe"]
    assert policy.interval == 63 and policy.meter.one_time_s == pytest.approx(1.5)


def test_the_cost_estimate_shrugs_off_one_slow_commit_and_the_budget_repays_it() -> None:
    loop, policy = Loop(extra={10: 2.0}), Adaptive()  # the 11th commit stalls 2 s more
    loop.run(policy, 3000)
    gaps = loop.gaps()
    # the slow commit delays the next one until the budget has earned it back and holds a dear
    # commit's cost again (three medians while the outlier is among the last five), less what it
    # had saved (at most one commit's cost); then the interval is the warm one's again: the
    # median of the last five costs ignores one outlier (their mean would have doubled the
    # interval for ten commits)
    repaid = (2.0 + 3 * loop.cost_s) / (0.035 * loop.step_s)
    assert repaid - 63 <= gaps[10] <= math.ceil(repaid)
    assert set(gaps[2:10]) == set(gaps[11:]) == {63} and policy.interval == 63
    assert policy.overhead is not None and policy.overhead <= 0.035


def test_the_overhead_stays_within_the_budget_as_commit_costs_vary() -> None:
    rng = random.Random(0)
    loop = Loop(extra={0: 0.6} | {i: rng.uniform(-0.02, 0.2) for i in range(1, 200)})  # costs 0.20-0.42 s
    policy = Adaptive()
    for step in range(1, 5001):
        loop.run(policy, 1, start=step)
        if len(loop.commits) > 2:  # the warm-up and the probe, made on credit, have been paid for
            assert policy.overhead is not None and policy.overhead <= 0.035
    assert policy.overhead is not None and policy.overhead > 0.03 and len(loop.commits) > 40


def test_the_slow_down_is_summed_with_its_sign_and_floored_at_zero() -> None:
    policy = Adaptive(warmup_commits=0)
    for step in range(1, 6):
        policy.step(step, 0.1, False)
    policy.committed(5, 0.02)
    for step, seconds in zip(range(6, 10), [0.13, 0.07, 0.12, 0.08], strict=True):  # noise, no slow-down
        policy.step(step, seconds, True)
    policy.step(10, 0.1, False)
    assert policy.meter.cost_s == pytest.approx(0.02)  # each step's excess alone would say 0.07
    policy.committed(10, 0.02)
    for step in range(11, 14):
        policy.step(step, 0.09, True)  # faster than the step time: no negative cost
    policy.step(14, 0.1, False)
    assert policy.meter.cost_s == pytest.approx(0.02)
    # the loop's time counts each busy step at the step time
    assert policy.meter.loop_s == pytest.approx(14 * 0.1)


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
    assert set(loop.gaps()[-5:]) == {policy.interval}


def test_cheaper_commits_buy_no_burst() -> None:
    loop, policy = Loop(), Adaptive()
    loop.run(policy, 1000)
    loop.slow_s = 0.0  # commits get cheap at once: cost 0.02 s, interval 6
    for start in range(1001, 1400):
        loop.run(policy, 1, start=start)
        cost, dear = policy.meter.cost_s, policy.meter.dear_s
        assert cost is not None and dear is not None and policy.balance <= dear + cost  # the rest is forfeited
    assert policy.interval == 6
    gaps = loop.gaps()
    assert min(gaps[2:]) == 6  # never closer together than the interval, as the estimate fell


def test_adaptive_bounds() -> None:
    loop, policy = Loop(), Adaptive(max_interval=20)
    loop.run(policy, 200)
    assert policy.interval == 20 and set(loop.gaps()[1:]) == {20}
    loop, policy = Loop(stall_s=0.0, slow_s=0.0), Adaptive(min_interval=50)
    loop.run(policy, 200)
    assert policy.interval == 50 and set(loop.gaps()[1:]) == {50}


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
    assert loop.commits[:2] == [(5, "warm-up"), (10, "probe")]  # its interval from the warm cost
    assert set(loop.gaps()[1:]) == {expected}
    assert loop.commits[2][1] == f"young-daly({expected})"
    rate = policy.loss_rate()
    assert rate is not None and rate == pytest.approx(
        expected_loss_rate(expected * loop.step_s, loop.cost_s, 3600.0), rel=1e-9)


def test_dense_early_spacing_grows_and_never_exceeds_the_budget() -> None:
    loop, policy = Loop(stall_s=0.005, slow_s=0.005, busy_steps=2), DenseEarly(first=10, growth=1.5)
    loop.run(policy, 3000)
    budget = math.ceil(loop.cost_s / (0.035 * loop.step_s))  # 0.015 s / 3.5 ms -> 5
    steps = [s for s, _ in loop.commits]
    assert loop.commits[:2] == [(10, "warm-up"), (15, "probe")]
    gaps = loop.gaps()
    assert all(g >= budget for g in gaps)
    assert gaps == sorted(gaps) and gaps[-1] > 10 * gaps[0]
    assert steps[-1] > 1000 and len(steps) < 25
    assert policy.overhead is not None and policy.overhead <= 0.035


def test_dense_early_max_interval_caps_the_spacing() -> None:
    loop, policy = Loop(stall_s=0.005, slow_s=0.005, busy_steps=2), DenseEarly(max_interval=100)
    loop.run(policy, 1000)
    assert max(loop.gaps()) == 100


def test_any_commits_when_either_wants_and_every_commit_counts_against_the_budget() -> None:
    loop, adaptive = Loop(), Adaptive()
    loop.run(Any(Every(100), adaptive), 1200)
    rules = dict(loop.commits)
    assert rules[5] == "warm-up" and rules[10] == "probe"
    assert all(rules[s] == "every(100)" for s in range(100, 1201, 100))
    mine = [i for i, (_, rule) in enumerate(loop.commits) if rule == "adaptive(63)"]
    assert len(mine) >= 5  # what the budget has left beside every(100)'s commits (2.2% of the loop)
    # 63 steps after the last commit, whoever asked for it; every commit paid from the budget
    assert all(loop.commits[i][0] - loop.commits[i - 1][0] >= 63 for i in mine)
    assert adaptive.overhead is not None and 0.03 < adaptive.overhead <= 0.035 + 1e-12  # (rounding)


@pytest.mark.parametrize("make", [
    lambda: Every(0), lambda: Adaptive(0.0), lambda: Adaptive(1.5), lambda: Adaptive(min_interval=10, max_interval=5),
    lambda: YoungDaly(0.0), lambda: YoungDaly(restart_s=-1.0), lambda: DenseEarly(first=0),
    lambda: DenseEarly(growth=1.0), lambda: Any(), lambda: Adaptive(warmup=0), lambda: YoungDaly(warmup_commits=-1),
])
def test_bad_arguments_are_refused(make: object) -> None:
    with pytest.raises(ValueError):
        make()  # type: ignore[operator]
