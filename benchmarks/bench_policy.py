"""Commit policies on the small-transformer training loop: what each costs, how often it commits.

The loop is ``_training.Trainer`` (~10M-parameter transformer, AdamW, state ~117 MiB, CPU),
checkpointed by ``ckptrepo.Checkpointer`` (model, optimizer and RNG states; two-phase
commits) under each policy:
  - ``Every(k)`` for a sweep of k (``--ks``),
  - ``Adaptive(0.035)`` (CheckFreq's rule: the smallest interval whose cost fits 3.5%),
  - ``YoungDaly(mtbf_s=M)`` for the simulated failure rate below,
  - ``DenseEarly()`` (COCI's idea: dense early, sparser later, within 3.5%),
and without checkpointing ("none"). Each round runs one *segment* of ``--steps`` steps per
kind, back to back in an order drawn at random (a paired design: the machine's drift falls on
all kinds of a round alike). Every kind keeps its policy, its step count and its commits
across rounds, as one long run would; its repository is emptied between rounds (untimed)
so the disk does not fill.

Per kind and round:
  - *wall overhead*: (segment wall - the none segment's) / the none segment's wall; unbiased,
    but this VM's speed moves by several % between segments, so its interval is wide;
  - *local overhead* (CheckFreq's own cost measure): the time spent in ``after_step`` (the
    policy and each commit's stall), plus what each step that overlapped a commit's background
    phase took beyond the segment's median clean step, plus the wait for the last commit at
    the segment's end, over the segment's steps at that median: each segment against itself;
  - *blocking share*: time in ``after_step`` / segment wall; commits made; and for Adaptive
    the steps between its commits;
  - *clean steps vs none*: the median step no commit overlapped against the round's none
    segment's median step: the local measure's premise (checkpointing slows only the steps
    its commits overlap) holds when this is ~0 within its interval.
Means over rounds with 95% bootstrap intervals (resampling rounds).

Goals (issue 37): Adaptive's local overhead <= 3.5% while its interval is within 1.5x the
smallest ``Every(k)`` of the sweep whose local overhead is <= 3.5%; YoungDaly's expected
waste (checkpoint cost plus work lost to failures, per hour) within 1.1x the best ``Every(k)``
of the sweep. Waste per hour for a kind, from its own measured timeline (its segments end to
end): ``3600 * (overhead + (lost + R) / M)`` s, where ``lost`` is the time-average of the
work since the newest commit that was durable at that moment (a failure at a uniformly random
time loses that much; before the first commit, everything since the start), ``M`` the mean
time between failures and ``R`` the restart time (``--restart``). ``M`` defaults to the
value that puts Young's optimum (``sqrt(2 C M)``, from a probe of the commit cost C here)
at the geometric middle of the sweep, so the sweep brackets it; it is printed.

Cold start (issue 46), in rounds of fresh processes (``--cold-rounds``; 0: none): the loop of
``tests/integration/test_adaptive_cold_start.py``, a 2.1M-parameter MLP with AdamW (a 25 MB
state, one torch thread), its batch sized once so that a step takes about 23 ms here, 300 steps,
committed to a new repository with no commit before, under ``Adaptive(0.05)`` and under
``Every(50)``, one process each per round in random order. Processes differ in speed by up to
2x here, so each is its own reference: 150 steps without a checkpointer before the loop and
150 after. Per kind and round: commits; the *wall overhead*, the loop's wall (first step to
the last commit durable and the repository closed) against 300 steps at the reference's mean
step (the first commit's one-time costs included); for Adaptive its own measured overhead
(``Adaptive.overhead``), its one-time cost (``meter.one_time_s``), also taken off the wall
overhead; and each kind's median clean step (no commit in flight) against the reference's
median step: what a cost measure of commits cannot see (the loop slowed between commits).
Means over rounds with 95% bootstrap intervals. Goals: at least 10 commits, measured overhead
<= 5%.

    python benchmarks/bench_policy.py [--rounds 6] [--steps 200] [--ks 5 7 10 14 20 28 40]
        [--mtbf SECONDS] [--restart 0] [--quick] [--seed 0] [--dir PATH] [--cold-rounds 5] [--cold-only]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ForeignLoad, bootstrap, goal_note, report, scratch_dir, wait_quiet
from _training import Trainer, add_model_args

import ckptrepo
from ckptrepo import Checkpointer
from ckptrepo.policy import Adaptive, DenseEarly, Every, Policy, YoungDaly

BUDGET = 0.035
COLD_BUDGET = 0.05  # the cold-start loop's, as issue 46 ran it
COLD_STEPS = 300
COLD_STEP_S = 0.023
COLD_REF = 150  # uncheckpointed steps before and after the loop: each process's own reference
COLD_KINDS = ("adaptive", "every(50)")


@dataclass
class Segment:
    """One kind's segment of a round, as measured."""

    wall: float
    steps: list[float]  # each training step's seconds
    calls: list[float]  # each after_step's seconds
    busy: list[bool]  # a commit's background phase ran during the step
    end_wait: float  # the wait for the last commit after the last step
    commits: list[tuple[int, float, float]]  # (step, capture time, durable time), s from the segment's start

    def local_cost(self, clean_floor: float) -> tuple[float, float]:
        """(cost seconds, reference step seconds) by CheckFreq's measure; ``clean_floor``: the
        round's none-segment median, used when too few of this segment's steps were clean."""
        clean = [t for t, b in zip(self.steps, self.busy, strict=True) if not b]
        ref = statistics.median(clean) if len(clean) >= max(5, len(self.steps) // 5) else clean_floor
        slow = sum(max(0.0, t - ref) for t, b in zip(self.steps, self.busy, strict=True) if b)
        return sum(self.calls) + slow + self.end_wait, ref


@dataclass
class Kind:
    name: str
    policy: Policy | None  # None: no checkpointing
    step: int = 0
    segments: list[Segment] = field(default_factory=list)
    commit_steps: list[int] = field(default_factory=list)


def run_segment(kind: Kind, trainer: Trainer, steps: int, where: Path) -> Segment:
    """``steps`` training steps of ``kind`` (a fresh repository in ``where``, warmed untimed)."""
    repo = None
    ckpt = None
    if kind.policy is not None:
        shutil.rmtree(where, ignore_errors=True)
        repo = ckptrepo.Repo.init(where)
        state = {"model": trainer.model, "optim": trainer.opt}
        repo.commit(state, branch="warm-up").wait()  # staging, pools and database made, untimed
        repo.repack()  # and its deferred encoding done, not left to the segment's idle windows
        ckpt = Checkpointer(repo, model=trainer.model, optimizer=trainer.opt, policy=kind.policy)
    times: list[float] = []
    calls: list[float] = []
    busy: list[bool] = []
    handles: list[tuple[int, float, Any]] = []
    pending: list[Any] = []
    durable: dict[int, float] = {}
    start = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        trainer.step()
        t1 = time.perf_counter()
        kind.step += 1
        busy.append(bool(pending))  # a commit was in flight when the step began
        for h in pending:  # when each commit became durable (seen at a step's end)
            if h.done():
                durable[id(h)] = t1 - start
        pending = [h for h in pending if not h.done()]
        if ckpt is not None:
            handle = ckpt.after_step(kind.step)
            if handle is not None:
                handles.append((kind.step, t1 - start, handle))
                pending.append(handle)
                kind.commit_steps.append(kind.step)
        calls.append(time.perf_counter() - t1)
        times.append(t1 - t0)
    t_end = time.perf_counter()
    if ckpt is not None:
        ckpt.flush()
    wall = time.perf_counter() - start
    commits = [(s, at, durable.get(id(h), wall)) for s, at, h in handles]
    if ckpt is not None and repo is not None:  # untimed
        ckpt.close()
        repo.close()
    return Segment(wall=wall, steps=times, calls=calls, busy=busy, end_wait=start + wall - t_end, commits=commits)


def mean_lost(kind: Kind) -> float:
    """The time-average of the work since the newest durable commit, over the kind's segments
    end to end: what a failure at a uniformly random moment loses, s."""
    offset = 0.0
    events: list[tuple[float, float]] = []  # (durable at, captured at), on the kind's own clock
    for seg in kind.segments:
        events += [(offset + d, offset + c) for _, c, d in seg.commits]
        offset += seg.wall
    total = offset
    events.sort()
    area, t, last_capture = 0.0, 0.0, 0.0
    for durable_at, captured_at in [*events, (total, 0.0)]:
        # until durable_at, the newest state a restart can load was captured at last_capture
        area += ((durable_at - last_capture) ** 2 - (t - last_capture) ** 2) / 2
        t = durable_at
        last_capture = max(last_capture, captured_at)
    return area / total


def probe_cost(trainer: Trainer, where: Path) -> tuple[float, float]:
    """(commit cost C, step seconds) of this loop, as Adaptive measures them, from a short run."""
    policy = Adaptive(BUDGET)
    kind = Kind("probe", policy)
    run_segment(kind, trainer, 40, where)
    step_s, cost_s = policy.meter.step_s, policy.meter.cost_s
    if step_s is None or cost_s is None:
        raise SystemExit("the probe measured no commit cost: run more steps")
    return cost_s, step_s


def summarize(kinds: list[Kind], none: Kind, rng: random.Random, mtbf: float, restart: float
              ) -> tuple[list[tuple[str, float, str]], dict[str, Any]]:
    rounds = len(none.segments)
    rows: list[tuple[str, float, str]] = []
    info: dict[str, Any] = {}
    floors = [statistics.median(s.steps) for s in none.segments]
    for kind in kinds:
        local = []
        for seg, floor in zip(kind.segments, floors, strict=True):
            cost, ref = seg.local_cost(floor)
            local.append(100 * cost / (len(seg.steps) * ref))
        wall = [100 * (s.wall - n.wall) / n.wall for s, n in zip(kind.segments, none.segments, strict=True)]
        block = [100 * sum(s.calls) / s.wall for s in kind.segments]
        # Its clean steps against the round's none steps: what the local measure cannot see (work
        # between commits, e.g. the idle repack, slowing steps no commit overlapped) shows here.
        clean = [100 * (statistics.median([t for t, b in zip(s.steps, s.busy, strict=True) if not b] or [f]) / f - 1)
                 for s, f in zip(kind.segments, floors, strict=True)]
        clo, chi = bootstrap(lambda idx, v=clean: statistics.fmean(v[i] for i in idx), rounds, rng)
        commits = sum(len(s.commits) for s in kind.segments)
        lo, hi = bootstrap(lambda idx, v=local: statistics.fmean(v[i] for i in idx), rounds, rng)
        wlo, whi = bootstrap(lambda idx, v=wall: statistics.fmean(v[i] for i in idx), rounds, rng)
        lost = mean_lost(kind)
        overhead = statistics.fmean(local) / 100
        waste = 3600 * (overhead + (lost + restart) / mtbf)
        gaps = [b - a for a, b in zip(kind.commit_steps, kind.commit_steps[1:], strict=False)]
        interval = statistics.median(gaps) if gaps else math.nan
        info[kind.name] = {"local": statistics.fmean(local), "local_ci": [lo, hi], "wall": statistics.fmean(wall),
                           "wall_ci": [wlo, whi], "blocking": statistics.fmean(block), "commits": commits,
                           "interval": interval, "lost_s": lost, "waste_s_per_h": waste,
                           "clean_vs_none": statistics.fmean(clean), "clean_vs_none_ci": [clo, chi]}
        rows.append((f"{kind.name}: local overhead %", statistics.fmean(local),
                     f"[{lo:.2f}, {hi:.2f}]; wall {statistics.fmean(wall):.2f} [{wlo:.2f}, {whi:.2f}]; "
                     f"blocking {statistics.fmean(block):.2f}% of the loop; {commits} commits, median interval "
                     f"{interval:g} steps; waste {waste:.0f} s/h (lost {lost:.2f} s per failure); clean steps vs "
                     f"none {statistics.fmean(clean):+.1f}% [{clo:+.1f}, {chi:+.1f}]"))
    return rows, info


def goals(info: dict[str, Any], ks: list[int]) -> list[tuple[str, float, str]]:
    rows: list[tuple[str, float, str]] = []
    fitting = [k for k in ks if info[f"every({k})"]["local"] <= 100 * BUDGET]
    adaptive = info["adaptive"]
    rows.append(("RATIO Adaptive overhead % (budget 3.5)", adaptive["local"],
                 f"[{adaptive['local_ci'][0]:.2f}, {adaptive['local_ci'][1]:.2f}]  "
                 + goal_note(adaptive["local"], 100 * BUDGET)))
    if fitting:
        k_min = min(fitting)
        rows.append((f"RATIO Adaptive interval / smallest fitting Every(k) (k={k_min})", adaptive["interval"] / k_min,
                     goal_note(adaptive["interval"] / k_min, 1.5)))
    else:
        rows.append(("RATIO Adaptive interval / smallest fitting Every(k)", math.nan,
                     f"no Every(k) of {ks} fits 3.5%: sweep larger k  MISSED"))
    best = min(ks, key=lambda k: info[f"every({k})"]["waste_s_per_h"])
    ratio = info["young-daly"]["waste_s_per_h"] / info[f"every({best})"]["waste_s_per_h"]
    rows.append((f"RATIO YoungDaly waste / best Every(k) (k={best})", ratio, goal_note(ratio, 1.1)))
    return rows


class ColdLoop:
    """Issue 46's loop: a 2.1M-parameter MLP (1024 -> 1024 -> 1024) and AdamW on batches of ``rows``."""

    def __init__(self, rows: int) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.batch = torch.randn(rows, 1024)

    def step(self) -> None:
        loss = self.model(self.batch).square().mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()


def cold_rows() -> int:
    """The batch rows for which a step of the cold-start loop takes about ``COLD_STEP_S`` here."""
    loop = ColdLoop(16)

    def seconds(rows: int) -> float:
        loop.batch = torch.randn(rows, 1024)
        times = []
        for _ in range(10):
            start = time.perf_counter()
            loop.step()
            times.append(time.perf_counter() - start)
        return statistics.median(times[3:])  # the first steps at a new size allocate

    small, large = seconds(16), seconds(256)
    per_row = max((large - small) / 240, 1e-6)
    return min(1024, max(8, round(16 + (COLD_STEP_S - small) / per_row)))


def cold_child(kind: str, rows: int, repo: Path, out: Path) -> None:
    """One fresh process's run of the cold-start loop under ``kind``, between two stretches of
    ``COLD_REF`` steps without a checkpointer (its reference); what it measured goes to ``out``."""
    torch.set_num_threads(1)
    loop = ColdLoop(rows)
    policy: Policy = Adaptive(COLD_BUDGET) if kind == "adaptive" else Every(50)

    def uncheckpointed() -> list[float]:
        times = []
        for _ in range(COLD_REF):
            t0 = time.perf_counter()
            loop.step()
            times.append(time.perf_counter() - t0)
        return times

    before = uncheckpointed()  # AdamW's state made here; nothing committed
    commits: list[tuple[int, str]] = []
    clean: list[float] = []  # the loop's steps no commit overlapped
    pending: list[Any] = []
    with ForeignLoad() as load:
        start = time.perf_counter()
        with Checkpointer(repo, model=loop.model, optimizer=loop.opt, policy=policy) as ckpt:
            for step in range(1, COLD_STEPS + 1):
                pending = [h for h in pending if not h.done()]
                t0 = time.perf_counter()
                loop.step()
                if not pending:
                    clean.append(time.perf_counter() - t0)
                handle = ckpt.after_step(step)
                if handle is not None:
                    commits.append((step, ckpt.last_rule or ""))
                    pending.append(handle)
        wall = time.perf_counter() - start  # the last commit durable, the repository closed
    reference = before + uncheckpointed()
    got: dict[str, Any] = {"wall": wall, "none": COLD_STEPS * statistics.fmean(reference), "commits": commits,
                           "step": statistics.median(reference), "clean": statistics.median(clean),
                           "foreign": load.share}
    if isinstance(policy, Adaptive):
        got |= {"overhead": policy.overhead, "one_time": policy.meter.one_time_s, "cost": policy.meter.cost_s}
    out.write_text(json.dumps(got))


def cold_start(rounds: int, rng: random.Random, base: Path) -> tuple[list[tuple[str, float, str]], dict[str, Any]]:
    """Issue 46's loop from a cold start, in ``rounds`` of fresh processes (see the module docstring)."""
    rows = cold_rows()
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in COLD_KINDS}
    for r in range(rounds):
        waited = wait_quiet(0.25)
        order = list(COLD_KINDS)
        rng.shuffle(order)
        for kind in order:
            out = base / "cold.json"
            shutil.rmtree(base / "cold", ignore_errors=True)
            subprocess.run([sys.executable, __file__, "--cold-child", kind, str(rows), str(base / "cold"), str(out)],
                           check=True, timeout=600)
            runs[kind].append(json.loads(out.read_text()))
        a = runs["adaptive"][-1]
        print(f"cold round {r + 1}/{rounds} (waited {waited:.0f} s for a quiet machine): Adaptive step "
              f"{a['step'] * 1e3:.1f} ms, {len(a['commits'])} commits at {[s for s, _ in a['commits']]}, overhead "
              f"{100 * a['overhead']:.2f}%, wall {100 * (a['wall'] / a['none'] - 1):.1f}%, one-time "
              f"{a['one_time']:.2f} s; others' CPU {100 * max(x[-1]['foreign'] for x in runs.values()):.0f}%",
              flush=True)

    def mean_ci(values: list[float]) -> tuple[float, str]:
        lo, hi = bootstrap(lambda idx: statistics.fmean(values[i] for i in idx), len(values), rng)
        return statistics.fmean(values), f"[{lo:.2f}, {hi:.2f}]"

    adaptive = runs["adaptive"]
    commits = [len(a["commits"]) for a in adaptive]
    measured, measured_ci = mean_ci([100 * a["overhead"] for a in adaptive])
    walled, wall_ci = mean_ci([100 * (a["wall"] / a["none"] - 1) for a in adaptive])
    steady, steady_ci = mean_ci([100 * ((a["wall"] - a["one_time"]) / a["none"] - 1) for a in adaptive])
    every, every_ci = mean_ci([100 * (e["wall"] / e["none"] - 1) for e in runs["every(50)"]])
    clean, clean_ci = mean_ci([100 * (a["clean"] / a["step"] - 1) for a in adaptive])
    every_clean, every_clean_ci = mean_ci([100 * (e["clean"] / e["step"] - 1) for e in runs["every(50)"]])
    steps = [a["step"] * 1e3 for a in adaptive]
    one_time = [a["one_time"] for a in adaptive]
    gaps = [b - a for run in adaptive for (a, _), (b, _) in zip(run["commits"][2:], run["commits"][3:], strict=False)]
    rows_out = [
        ("cold start: Adaptive(0.05) commits in 300 steps", statistics.fmean(commits),
         f"rounds {min(commits)}-{max(commits)}; median interval after the probe {statistics.median(gaps or [0]):g} "
         f"steps; steps {min(steps):.1f}-{max(steps):.1f} ms ({rows} rows)  "
         + goal_note(min(commits), 10, at_most=False)),
        ("cold start: Adaptive(0.05) measured overhead %", measured, f"{measured_ci}  " + goal_note(measured, 5.0)),
        ("cold start: Adaptive(0.05) wall overhead vs none %", walled,
         f"{wall_ci}; less its one-time cost ({statistics.fmean(one_time):.2f} s, rounds {min(one_time):.2f}-"
         f"{max(one_time):.2f}): {steady:.2f} {steady_ci}; its clean steps vs none {clean:+.1f}% {clean_ci}"),
        ("cold start: Every(50) wall overhead vs none %", every,
         f"{every_ci}; {statistics.fmean(len(e['commits']) for e in runs['every(50)']):g} commits; its clean steps "
         f"vs none {every_clean:+.1f}% {every_clean_ci}"),
    ]
    return rows_out, {"rows": rows, "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", type=int, nargs="+", default=[5, 7, 10, 14, 20, 28, 40], help="the Every(k) sweep")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=200, help="steps per segment")
    ap.add_argument("--mtbf", type=float, default=None, help="simulated mean time between failures, s "
                    "(default: Young's optimum at the sweep's geometric middle)")
    ap.add_argument("--restart", type=float, default=0.0, help="simulated restart time, s")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 2 rounds of 60 steps, a smaller model")
    ap.add_argument("--seed", type=int, default=0)
    add_model_args(ap)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir under /work)")
    ap.add_argument("--cold-rounds", type=int, default=5, help="rounds of the cold-start processes (0: none)")
    ap.add_argument("--cold-only", action="store_true", help="only the cold-start rounds")
    ap.add_argument("--cold-child", nargs=4, metavar=("KIND", "ROWS", "REPO", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cold_child:
        kind, rows, repo, out = args.cold_child
        cold_child(kind, int(rows), Path(repo), Path(out))
        return
    if args.quick:
        args.rounds, args.steps, args.ks, args.cold_rounds = 2, 60, [4, 8, 16, 32], min(args.cold_rounds, 1)
        args.d_model, args.layers = 128, 2
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    if args.cold_only:
        with scratch_dir(args.dir) as base:
            rows, info = cold_start(args.cold_rounds, rng, base)
        report("Adaptive from a cold start (fresh processes; mean over rounds, 95% bootstrap interval)", rows,
               {"cold_start": info})
        return
    trainer = Trainer.warmed(args)
    print(f"load average at start {os.getloadavg()[0]:.1f}; model {trainer.params() / 1e6:.1f}M params, state "
          f"{trainer.state_mib():.0f} MiB; {args.rounds} rounds of {args.steps} steps per kind", flush=True)
    with scratch_dir(args.dir) as base:
        cost_s, step_s = probe_cost(trainer, base / "probe")
        middle = math.sqrt(min(args.ks) * max(args.ks)) * step_s
        mtbf = args.mtbf or middle**2 / (2 * cost_s)
        print(f"probe: commit cost {cost_s * 1e3:.1f} ms, step {step_s * 1e3:.1f} ms; simulated MTBF {mtbf:.1f} s "
              f"(Young's interval {math.sqrt(2 * cost_s * mtbf):.2f} s), restart {args.restart:g} s", flush=True)
        none = Kind("none", None)
        kinds = [Kind(f"every({k})", Every(k)) for k in args.ks]
        kinds += [Kind("adaptive", Adaptive(BUDGET)), Kind("young-daly", YoungDaly(mtbf, args.restart)),
                  Kind("dense-early", DenseEarly(max_overhead=BUDGET))]
        for r in range(args.rounds):
            order = [none, *kinds]
            rng.shuffle(order)
            t0 = time.perf_counter()
            for kind in order:
                kind.segments.append(run_segment(kind, trainer, args.steps, base / "repo"))
            print(f"round {r + 1}/{args.rounds}: {time.perf_counter() - t0:.0f} s; none step "
                  f"{statistics.median(none.segments[-1].steps) * 1e3:.1f} ms", flush=True)
        rows, info = summarize(kinds, none, rng, mtbf, args.restart)
        cold_rows_out, cold_info = cold_start(args.cold_rounds, rng, base) if args.cold_rounds else ([], {})
    rows += goals(info, args.ks) + cold_rows_out
    report("commit policies on the training loop (mean over rounds, 95% bootstrap interval)", rows,
           {"mtbf_s": mtbf, "restart_s": args.restart, "cost_probe_s": cost_s, "step_probe_s": step_s,
            "rounds": args.rounds, "steps": args.steps, "kinds": info, "cold_start": cold_info})


if __name__ == "__main__":
    main()
