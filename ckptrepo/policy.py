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
overlapped (the busy steps' time beyond the loop's step time), as CheckFreq measures it. The
step time is the median of recent steps that overlapped no commit. The loop's *time* is what
its steps took without checkpointing: the clean steps' time, and the step time for each busy
one. A policy's *overhead* is the cost of its commits over the loop's time.

Warm-up, as CheckFreq profiles after it: the first commit of a process pays one-time costs
(the repository opened or created, worker pools and staging buffers started, imports, the
database's first transactions) that are many times a warm commit's. The first
``warmup_commits`` commits a measuring policy hears of (default 1) are therefore *warm-up*: their
cost sets no interval. Each is charged to the overhead at what the first warm commit cost (what
it would have cost warm); the excess is the one-time cost, reported apart (``one_time_s``).
Policies that need the cost commit as soon as the step time is known (rule ``"warm-up"``), then
once more as soon as that commit's background phase ends (rule ``"probe"``), whose cost is the
first one trusted. The estimate of a commit's cost is the median of the last five trusted ones:
one slow commit (a collection, a busy disk) does not move it, a lasting change does after three.

Policies compose: ``Any(Every(1000), Adaptive())`` commits when either wants to, and every
policy hears of every commit (an interval counts from the last commit, whoever asked for it;
a budget pays for every commit). Every policy works without arguments.

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
    """The loop's step time and time, and the cost of its commits, measured online.

    ``warmup``: clean steps before the step time is known; ``warmup_commits``: the first commits
    whose cost is not trusted (see the module docstring). A busy step's time beyond the step
    time, or short of it, is the slow-down of the commit in flight: summed with its sign over the
    commit's busy steps (so the noise of the steps cancels instead of adding up), then floored
    at zero.
    """

    def __init__(self, window: int = 50, warmup: int = 5, warmup_commits: int = 1, costs: int = 5) -> None:
        self._steps: deque[float] = deque(maxlen=window)
        self._costs: deque[float] = deque(maxlen=costs)  # the last trusted commits' costs
        self._warmup = warmup
        self._warmup_commits = warmup_commits
        self._warm: list[float] = []  # the warm-up commits' costs
        self._trusted_s = 0.0  # the cost of the trusted commits whose background phase ended
        self._open: tuple[float, float] | None = None  # (stall, slow-down so far) of the commit in flight
        self._open_trusted = False
        self.commits = 0
        self.last_commit: int | None = None
        self.loop_s = 0.0  # the loop's time: its steps' without the commits' slow-down

    @property
    def step_s(self) -> float | None:
        """Median seconds of recent steps that overlapped no commit; None during the warm-up."""
        return statistics.median(self._steps) if len(self._steps) >= self._warmup else None

    @property
    def cost_s(self) -> float | None:
        """A commit's cost: the median of the last five trusted commits' (stall + slow-down of the
        steps they overlapped); None before one finished. The warm-up commits' costs are left out."""
        return statistics.median(self._costs) if self._costs else None

    @property
    def dear_s(self) -> float | None:
        """What a dear commit costs: the dearest of the last five trusted commits, at most three
        times ``cost_s`` (one outlier moves it, but only so far); None before one finished."""
        cost_s = self.cost_s
        return None if cost_s is None else min(max(self._costs), 3 * cost_s)

    @property
    def warming_up(self) -> bool:
        """Whether the next commit is a warm-up one."""
        return self.commits < self._warmup_commits

    @property
    def spent_s(self) -> float:
        """The cost charged so far: every trusted commit's (the one in flight's up to now), and each
        warm-up commit's up to ``cost_s`` (what it would have cost warm)."""
        spent = self._trusted_s + sum(min(w, self.cost_s or 0.0) for w in self._warm)
        if self._open is not None and self._open_trusted:
            spent += self._open[0] + max(0.0, self._open[1])
        return spent

    @property
    def one_time_s(self) -> float:
        """The warm-up commits' cost beyond ``cost_s``: the one-time costs left out of ``spent_s``
        (all of it while no trusted cost is known)."""
        return sum(max(0.0, w - (self.cost_s or 0.0)) for w in self._warm)

    @property
    def overhead(self) -> float | None:
        """``spent_s`` over the loop's time: the fraction of the loop's time spent on checkpointing."""
        return self.spent_s / self.loop_s if self.loop_s > 0 else None

    def step(self, seconds: float, busy: bool) -> None:
        if self._open is not None and not busy:  # the commit's background phase ended before this step
            self._close()
        base = self.step_s
        if busy and base is not None:
            self.loop_s += base
            if self._open is not None:
                self._open = (self._open[0], self._open[1] + seconds - base)
            return
        self.loop_s += seconds
        if not busy:
            self._steps.append(seconds)

    def committed(self, step: int, stall_s: float) -> None:
        if self._open is not None:  # the previous commit's background was still running
            self._close()
        self._open = (stall_s, 0.0)
        self._open_trusted = not self.warming_up
        self.commits += 1
        self.last_commit = step

    def _close(self) -> None:
        """The cost of the commit in flight is known: keep it with the trusted ones or the warm-up ones."""
        assert self._open is not None
        cost = self._open[0] + max(0.0, self._open[1])
        self._open = None
        if self._open_trusted:
            self._costs.append(cost)
            self._trusted_s += cost
        else:
            self._warm.append(cost)

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

    def __init__(self, warmup: int, warmup_commits: int) -> None:
        if warmup < 1:
            raise ValueError(f"warmup must be at least 1 step, got {warmup}")
        if warmup_commits < 0:
            raise ValueError(f"warmup_commits must be at least 0, got {warmup_commits}")
        self.meter = _Meter(warmup=warmup, warmup_commits=warmup_commits)

    def step(self, step: int, seconds: float, busy: bool) -> None:
        self.meter.step(seconds, busy)

    def committed(self, step: int, stall_s: float) -> None:
        self.meter.committed(step, stall_s)

    @property
    def overhead(self) -> float | None:
        """The fraction of the loop's time its commits cost so far (see ``_Meter.overhead``); None
        before the first step."""
        return self.meter.overhead

    def _probe(self) -> str | None:
        """A commit to measure the cost, when the step time is known but no trusted cost is (and no
        commit is in flight): ``"warm-up"`` for a warm-up commit, else ``"probe"``."""
        m = self.meter
        if m.step_s is not None and m.cost_s is None and not m.in_flight():
            return "warm-up" if m.warming_up else "probe"
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
    """CheckFreq's rule: commit as often as the measured commit cost fits ``max_overhead``.

    ``max_overhead`` is the fraction of the loop's time (its steps without checkpointing) that
    commits may cost. The policy keeps a budget: every step earns ``max_overhead`` of its time,
    every commit (whoever asked for it) spends its measured cost, stall and slow-down. It
    commits ``interval`` = ``ceil(cost / (max_overhead * step time))`` steps after the last
    commit (within ``[min_interval, max_interval]``; ``cost``: the median of recent commits'),
    once the budget holds what a dear commit costs (``meter.dear_s``: the dearest of the recent
    ones, at most three times the median), so that a commit dearer than the median does not
    overdraw it. A dearer one still delays the next until the budget has repaid it. The budget
    keeps at most a dear commit's cost and a median one's (what cheaper commits saved pays for
    dearer ones); the rest is forfeited, so a quiet stretch buys nothing later. The first
    commits (warm-up and probe) are made on credit; from the next one on, ``overhead`` stays
    within the budget unless a commit costs more than a dear one (then until the budget has
    repaid it) or ``max_interval`` forces one. The interval follows drift in the step time and
    the cost.

    Warm-up (see the module docstring): after ``warmup`` steps it commits once to warm up (its
    one-time costs set nothing), then once more to measure a warm commit (``"probe"``), then
    by the budget. ``warmup_commits=0`` trusts the first commit's cost (for a repository this
    process has already committed to).
    """

    def __init__(self, max_overhead: float = 0.035, *, min_interval: int = 1, max_interval: int | None = None,
                 warmup: int = 5, warmup_commits: int = 1) -> None:
        super().__init__(warmup, warmup_commits)
        if not 0 < max_overhead < 1:
            raise ValueError(f"max_overhead is a fraction of the loop's time in (0, 1), got {max_overhead}")
        if min_interval < 1 or (max_interval is not None and max_interval < min_interval):
            raise ValueError(f"need 1 <= min_interval <= max_interval, got {min_interval}, {max_interval}")
        self.max_overhead = max_overhead
        self.min_interval = min_interval
        self.max_interval = max_interval
        self.balance = 0.0  # seconds of budget earned and not spent
        self._seen = (0.0, 0.0)  # the meter's loop time and spent cost when the balance was last settled

    def step(self, step: int, seconds: float, busy: bool) -> None:
        super().step(step, seconds, busy)
        self._settle()

    def committed(self, step: int, stall_s: float) -> None:
        super().committed(step, stall_s)
        self._settle()

    def _settle(self) -> None:
        """Earn and spend what the meter measured since the last call; forfeit beyond a dear
        commit's cost and a median one's."""
        m = self.meter
        loop_s, spent_s = m.loop_s, m.spent_s
        self.balance += self.max_overhead * (loop_s - self._seen[0]) - (spent_s - self._seen[1])
        self._seen = (loop_s, spent_s)
        if m.cost_s is not None and m.dear_s is not None:
            self.balance = min(self.balance, m.dear_s + m.cost_s)

    @property
    def interval(self) -> int | None:
        """Steps between commits at the current estimates; None until a trusted commit's cost has been measured."""
        k = self.meter.interval_for(self.max_overhead)
        if k is None:
            return None
        k = max(k, self.min_interval)
        return k if self.max_interval is None else min(k, self.max_interval)

    def allows(self, step: int) -> bool:
        """Whether ``interval`` steps have passed since the last commit and the budget holds what
        a dear commit costs."""
        k, dear_s = self.interval, self.meter.dear_s
        if k is None or dear_s is None:
            return False
        return self.meter.since_last(step) >= k and self.balance >= dear_s

    def due(self, step: int) -> str | None:
        k = self.interval
        if k is None:
            return self._probe()
        overdue = self.max_interval is not None and self.meter.since_last(step) >= self.max_interval
        return f"adaptive({k})" if self.allows(step) or overdue else None


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
    restart costs (reported by :meth:`loss_rate`; it does not move the optimum). The cost is
    measured after a warm-up commit, as ``Adaptive``'s.
    """

    def __init__(self, mtbf_s: float = 86_400.0, restart_s: float = 0.0, *, warmup: int = 5,
                 warmup_commits: int = 1) -> None:
        super().__init__(warmup, warmup_commits)
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
    ``max_interval`` apart when set), but only when ``Adaptive(max_overhead)`` would allow one
    (its interval passed, its budget holding a dear commit's cost): early on the run commits as often
    as the budget allows, later ever more rarely. Its first commits, at its first targets, warm
    up and measure as ``Adaptive``'s do.
    """

    def __init__(self, first: int = 10, growth: float = 1.5, *, max_overhead: float = 0.035,
                 max_interval: int | None = None, warmup: int = 5, warmup_commits: int = 1) -> None:
        if first < 1 or growth <= 1:
            raise ValueError(f"need first >= 1 and growth > 1, got {first}, {growth}")
        if max_interval is not None and max_interval < 1:
            raise ValueError(f"max_interval must be >= 1, got {max_interval}")
        self._budget = Adaptive(max_overhead, warmup=warmup, warmup_commits=warmup_commits)
        self.meter = self._budget.meter  # one measurement for both
        self.first = first
        self.growth = growth
        self.max_interval = max_interval
        self._target = float(first)

    def step(self, step: int, seconds: float, busy: bool) -> None:
        self._budget.step(step, seconds, busy)

    def committed(self, step: int, stall_s: float) -> None:
        self._budget.committed(step, stall_s)
        while self._target <= step:
            self._target *= self.growth

    def _next(self) -> float:
        if self.max_interval is None or self.meter.last_commit is None:
            return self._target
        return min(self._target, self.meter.last_commit + self.max_interval)

    def due(self, step: int) -> str | None:
        if step < self._next():
            return None
        if self.meter.cost_s is None:
            return self._probe()
        return f"dense-early({step})" if self._budget.allows(step) else None


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
