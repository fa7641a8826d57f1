"""Commit policies: at which optimizer steps a training loop commits.

A policy is driven by the loop's checkpointer through three calls, all on the loop's thread:

- ``step(step, seconds, busy)`` after every optimizer step: ``step`` is the count of completed
  steps, ``seconds`` the step's wall time, ``busy`` whether a commit's background phase was
  running during it;
- ``due(step)`` before deciding to commit after that step: the name of the rule that wants a
  commit now, or ``None``;
- ``committed(step, stall_s)`` after a commit was started at ``step``, with the seconds it
  blocked the loop (two-phase: the copy).

A commit's *cost* to the loop is its stall plus what its background phase slowed the steps it
overlapped (each busy step's time beyond the loop's step time), as CheckFreq measures it. The
step time is the median of recent steps that overlapped no commit. Policies that need the cost
commit once to measure it (rule ``"probe"``) as soon as the step time is known.

Policies compose: ``Any(Every(1000), Adaptive())`` commits when either wants to, and every
policy hears of every commit (an interval counts from the last commit, whoever asked for it).
Every policy works without arguments.

A policy whose answers depend on the step count alone sets ``by_step = True`` (``Every``; ``Any``
of such policies). On several ranks, each rank then decides alone and all agree; any other
policy's answer is taken from rank 0 and broadcast (the checkpointer does it: one one-element
message per step), since measured times differ between ranks.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Protocol

__all__ = [
    "Adaptive",
    "Any",
    "DenseEarly",
    "Every",
    "Policy",
    "YoungDaly",
    "expected_loss_rate",
    "young_daly_interval",
]


class Policy(Protocol):
    """What a checkpointer calls; see the module docstring for the contract."""

    def step(self, step: int, seconds: float, busy: bool) -> None: ...

    def due(self, step: int) -> str | None: ...

    def committed(self, step: int, stall_s: float) -> None: ...


class _Meter:
    """The loop's step time and the cost of its commits, measured online."""

    def __init__(self, window: int = 50, warmup: int = 5) -> None:
        self._steps: deque[float] = deque(maxlen=window)
        self._costs: deque[float] = deque(maxlen=10)
        self._warmup = warmup
        self._open: float | None = None  # the cost so far of the commit whose background runs
        self.last_commit: int | None = None

    @property
    def step_s(self) -> float | None:
        """Median seconds of recent steps that overlapped no commit; None during the warm-up."""
        return statistics.median(self._steps) if len(self._steps) >= self._warmup else None

    @property
    def cost_s(self) -> float | None:
        """Mean cost of the last 10 commits (stall + slow-down of overlapped steps); None before one
        finished. The mean, not the median: what the loop loses over many commits is their mean
        cost, and the occasional slow commit (a staging slot still busy, a collection) counts."""
        return statistics.fmean(self._costs) if self._costs else None

    def step(self, seconds: float, busy: bool) -> None:
        if busy and self._open is not None:
            base = self.step_s
            self._open += max(0.0, seconds - base) if base is not None else 0.0
            return
        if self._open is not None:  # the commit's background phase ended before this step
            self._costs.append(self._open)
            self._open = None
        if not busy:
            self._steps.append(seconds)

    def committed(self, step: int, stall_s: float) -> None:
        if self._open is not None:  # the previous commit's background was still running
            self._costs.append(self._open)
        self._open = stall_s
        self.last_commit = step

    def since_last(self, step: int) -> int:
        return step if self.last_commit is None else step - self.last_commit

    def in_flight(self) -> bool:
        return self._open is not None

    def interval_for(self, max_overhead: float) -> int | None:
        """The fewest steps between commits whose cost stays within ``max_overhead`` of the loop's time."""
        step_s, cost_s = self.step_s, self.cost_s
        if step_s is None or cost_s is None:
            return None
        return max(1, math.ceil(cost_s / (max_overhead * max(step_s, 1e-9))))


class _Measured:
    """Shared plumbing of the policies that measure the loop."""

    by_step = False

    def __init__(self, warmup: int) -> None:
        if warmup < 1:
            raise ValueError(f"warmup must be at least 1 step, got {warmup}")
        self.meter = _Meter(warmup=warmup)

    def step(self, step: int, seconds: float, busy: bool) -> None:
        self.meter.step(seconds, busy)

    def committed(self, step: int, stall_s: float) -> None:
        self.meter.committed(step, stall_s)

    def _probe(self) -> str | None:
        """``"probe"`` when the step time is known but no commit cost is (and none is being measured)."""
        m = self.meter
        if m.step_s is not None and m.cost_s is None and not m.in_flight():
            return "probe"
        return None


class Every:
    """Commit every ``k`` completed steps (steps k, 2k, 3k, ...)."""

    by_step = True

    def __init__(self, k: int = 1000) -> None:
        if k < 1:
            raise ValueError(f"Every(k) needs k >= 1, got {k}")
        self.k = k

    def step(self, step: int, seconds: float, busy: bool) -> None:
        pass

    def due(self, step: int) -> str | None:
        return f"every({self.k})" if step > 0 and step % self.k == 0 else None

    def committed(self, step: int, stall_s: float) -> None:
        pass


class Adaptive(_Measured):
    """CheckFreq's rule: the smallest interval whose measured commit cost fits ``max_overhead``.

    After ``warmup`` steps it commits once to measure a commit's cost, then commits every
    ``ceil(cost / (max_overhead * step time))`` steps (within ``[min_interval, max_interval]``),
    re-tuned from the latest measurements at every step, so the interval follows drift in the
    step time or the commit cost.
    """

    def __init__(self, max_overhead: float = 0.035, *, min_interval: int = 1, max_interval: int | None = None,
                 warmup: int = 5) -> None:
        super().__init__(warmup)
        if not 0 < max_overhead < 1:
            raise ValueError(f"max_overhead is a fraction of the loop's time in (0, 1), got {max_overhead}")
        if min_interval < 1 or (max_interval is not None and max_interval < min_interval):
            raise ValueError(f"need 1 <= min_interval <= max_interval, got {min_interval}, {max_interval}")
        self.max_overhead = max_overhead
        self.min_interval = min_interval
        self.max_interval = max_interval

    @property
    def interval(self) -> int | None:
        """Steps between commits as tuned now; None until a commit's cost has been measured."""
        k = self.meter.interval_for(self.max_overhead)
        if k is None:
            return None
        k = max(k, self.min_interval)
        return k if self.max_interval is None else min(k, self.max_interval)

    def due(self, step: int) -> str | None:
        k = self.interval
        if k is None:
            return self._probe()
        return f"adaptive({k})" if self.meter.since_last(step) >= k else None


def young_daly_interval(cost_s: float, mtbf_s: float) -> float:
    """Daly's optimum seconds between checkpoints for a checkpoint cost and a mean time between failures.

    ``sqrt(2 C M) * (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C`` for ``C < 2M`` (Young's
    ``sqrt(2 C M)`` with Daly's higher-order terms), else ``M``.
    """
    if cost_s < 0 or mtbf_s <= 0:
        raise ValueError(f"need cost_s >= 0 and mtbf_s > 0, got {cost_s}, {mtbf_s}")
    if cost_s >= 2 * mtbf_s:
        return mtbf_s
    r = cost_s / (2 * mtbf_s)
    return math.sqrt(2 * cost_s * mtbf_s) * (1 + math.sqrt(r) / 3 + r / 9) - cost_s


def expected_loss_rate(interval_s: float, cost_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """Fraction of wall time lost to checkpoints and failures, to first order.

    Each interval of ``interval_s`` seconds of work pays ``cost_s``; a failure, every ``mtbf_s``
    seconds on average, loses half an interval (plus its checkpoint) of work and ``restart_s``.
    """
    if interval_s <= 0 or mtbf_s <= 0:
        raise ValueError(f"need interval_s > 0 and mtbf_s > 0, got {interval_s}, {mtbf_s}")
    return cost_s / interval_s + ((interval_s + cost_s) / 2 + restart_s) / mtbf_s


class YoungDaly(_Measured):
    """Commit at the Young/Daly interval for a failure rate, from the measured commit cost.

    ``mtbf_s``: the job's mean time between failures (default one day); ``restart_s``: what a
    restart costs (reported by :meth:`loss_rate`; it does not move the optimum).
    """

    def __init__(self, mtbf_s: float = 86_400.0, restart_s: float = 0.0, *, warmup: int = 5) -> None:
        super().__init__(warmup)
        if mtbf_s <= 0 or restart_s < 0:
            raise ValueError(f"need mtbf_s > 0 and restart_s >= 0, got {mtbf_s}, {restart_s}")
        self.mtbf_s = mtbf_s
        self.restart_s = restart_s

    @property
    def interval(self) -> int | None:
        """Steps between commits for the measured cost and step time; None until both are known."""
        step_s, cost_s = self.meter.step_s, self.meter.cost_s
        if step_s is None or cost_s is None:
            return None
        return max(1, round(young_daly_interval(cost_s, self.mtbf_s) / max(step_s, 1e-9)))

    def loss_rate(self) -> float | None:
        """The expected fraction of time lost at the current interval (see :func:`expected_loss_rate`)."""
        k, step_s, cost_s = self.interval, self.meter.step_s, self.meter.cost_s
        if k is None or step_s is None or cost_s is None:
            return None
        return expected_loss_rate(k * step_s, cost_s, self.mtbf_s, self.restart_s)

    def due(self, step: int) -> str | None:
        k = self.interval
        if k is None:
            return self._probe()
        return f"young-daly({k})" if self.meter.since_last(step) >= k else None


class DenseEarly(_Measured):
    """COCI's idea: commits dense early in a run and sparser as it progresses, within a budget.

    Commits aim at steps ``first, first*growth, first*growth**2, ...`` (capped at
    ``max_interval`` apart when set), but never closer together than the interval that keeps
    the measured commit cost within ``max_overhead`` (Adaptive's interval): early on the run
    commits as often as the budget allows, later ever more rarely.
    """

    def __init__(self, first: int = 10, growth: float = 1.5, *, max_overhead: float = 0.035,
                 max_interval: int | None = None, warmup: int = 5) -> None:
        super().__init__(warmup)
        if first < 1 or growth <= 1:
            raise ValueError(f"need first >= 1 and growth > 1, got {first}, {growth}")
        if max_interval is not None and max_interval < 1:
            raise ValueError(f"max_interval must be >= 1, got {max_interval}")
        self._budget = Adaptive(max_overhead, warmup=warmup)
        self._budget.meter = self.meter  # one measurement for both
        self.first = first
        self.growth = growth
        self.max_interval = max_interval
        self._target = float(first)

    def committed(self, step: int, stall_s: float) -> None:
        super().committed(step, stall_s)
        while self._target <= step:
            self._target *= self.growth

    def _next(self) -> float:
        if self.max_interval is None or self.meter.last_commit is None:
            return self._target
        return min(self._target, self.meter.last_commit + self.max_interval)

    def due(self, step: int) -> str | None:
        if step < self._next():
            return None
        k = self._budget.interval
        if k is None:
            return self._probe()
        return f"dense-early({step})" if self.meter.since_last(step) >= k else None


class Any:
    """Commit when any of ``policies`` wants to; the first one's rule names the commit."""

    def __init__(self, *policies: Policy) -> None:
        if not policies:
            raise ValueError("Any() needs at least one policy")
        self.policies = policies
        self.by_step = all(getattr(p, "by_step", False) for p in policies)

    def step(self, step: int, seconds: float, busy: bool) -> None:
        for p in self.policies:
            p.step(step, seconds, busy)

    def due(self, step: int) -> str | None:
        for p in self.policies:
            rule = p.due(step)
            if rule is not None:
                return rule
        return None

    def committed(self, step: int, stall_s: float) -> None:
        for p in self.policies:
            p.committed(step, stall_s)
