"""Training overhead of checkpointing every k steps: ckptrepo commit vs torch.save+fsync vs none.

A real CPU training loop: a small decoder-only transformer (``nn.TransformerEncoder`` with a
causal mask, ~10M parameters) on synthetic tokens, AdamW. A configuration with interval k runs
max(k, ``--steps``) steps of that loop and checkpoints the state ``{"model": model, "optim": opt}``
at the start of every k-th step (steps 0, k, 2k, ...: each checkpoint is followed by one
full interval of training):
  - none: no checkpointing, ``--none-steps`` steps before and after every other segment;
    a segment's baseline is the mean step time of its two neighbours (load from other
    processes that drifts over minutes cancels out),
  - torch.save every k: ``torch.save`` of the same state dicts to a new file + fsync of file
    and directory, blocking,
  - ckptrepo every k: ``repo.commit(...)`` without waiting in the loop; the segment's time
    includes the final flush (``wait()`` of the last commit, reported on its own), so no
    commit's background work is left out. With the default settings (``encode="auto"``) a
    commit stores its new chunks raw and the encoding is deferred: a background repack at
    idle priority runs between commits, and what it has not done when the segment ends is
    done by ``repo.repack()`` right after it, outside the timed segment but reported: its
    wall and CPU time, the stored bytes before and after, and "overhead incl. repack", the
    overhead had that repack run on the training cores before training went on.
    ``--inline`` adds every k with ``encode="inline"`` (encoding while committing).
    Run with the default ``CKPT_WORKERS`` (all cores) and with
    ``CKPT_WORKERS=1`` (k=10, 50); with ``--nice`` also with ckptrepo's threads at nice 19.
Each ckptrepo segment uses a fresh repository whose staging arena was allocated by an
untimed warm-up commit (steady state). The model keeps training across segments; the order
of segments rotates from round to round, and every figure is the median over ``--rounds``.
Other processes share this machine: a segment starts when they leave the CPU and the disk alone
and is run again (``--retries``) when they took more than ``--max-foreign`` of the CPU or wrote
more than ``--max-write`` MiB/s meanwhile.

Overhead % = segment time / (steps x its neighbours' no-checkpoint s/step) - 1. "fits" says whether one
commit's background work (persist_s) finished within its interval (k x step time). The
"during phase 2" column is the median time of training steps that overlapped some commit's
phase 2, against the median of steps that did not: the slowdown phase 2 inflicts on the
training thread (GIL and CPU contention together). "attrib %" estimates the overhead from
inside each segment (checkpoint calls + final flush + the extra time of overlapped steps, over
the segment's other steps): robust to load from other processes, but blind to a slowdown
that lasts the whole segment (e.g. while a repository's idle threads exist), which only the
wall column shows. "CPU %" is the process's CPU time over the segment against its
neighbours' CPU per step: every CPU-second checkpointing took, whether or not it delayed a
step (an upper bound for two saturated cores, steady where the wall time drifts with the
machine; idle-priority work that only filled idle moments counts here, not in the wall).
Each figure is shown with its spread (min..max over rounds).

    python benchmarks/bench_training.py [--steps 100] [--rounds 5] [--quick] [--nice] [--normal-priority]
        [--no-compression] [--inline] [--no-idle-repack] [--only-ckpt] [--ks 10 50 200] [--dir PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ForeignLoad, fsync_path, goal_note, median, report, scratch_dir, wait_quiet
from _training import MIB, Trainer, add_model_args

import ckptrepo

KS = (10, 50, 200)


@dataclass(frozen=True)
class Config:
    name: str
    k: int = 0
    kind: str = "none"  # none | save | ckpt
    workers: int | None = None  # CKPT_WORKERS for ckpt (None: default)
    nice: bool = False
    init: dict[str, Any] = field(default_factory=dict)  # Repo.init settings (default: the defaults)


@dataclass
class Segment:
    """One timed run of a configuration."""

    total: float
    steps: list[tuple[float, float]]  # (start, end) of every training step
    ckpt_times: list[float] = field(default_factory=list)  # blocking time of each checkpoint call
    windows: list[tuple[float, float]] = field(default_factory=list)  # (staged, durable) of each commit
    persist: list[float] = field(default_factory=list)
    wait: list[float] = field(default_factory=list)
    new_bytes: list[int] = field(default_factory=list)
    flush: float = 0.0
    cpu: float = 0.0  # process CPU seconds over the timed segment (all threads)
    repack_s: float = 0.0  # the repack after the segment (untimed for the overhead)
    repack_cpu: float = 0.0
    stored_deferred: int = 0  # stored bytes before that repack
    stored_after: int = 0
    pending_after: int = 0  # bytes still stored raw when the segment ended
    load: ForeignLoad = field(default_factory=ForeignLoad)  # what other processes took meanwhile


def renice_new_threads(before: set[int], niceness: int) -> int:
    """Set ``niceness`` on the threads of this process not in ``before``; how many."""
    count = 0
    for tid in {int(t) for t in os.listdir("/proc/self/task")} - before:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, niceness)
            count += 1
        except OSError:
            pass
    return count


def open_repo(where: Path, cfg: Config, trainer: Trainer) -> ckptrepo.Repo:
    """A fresh repository with the configuration's worker count, its staging arena allocated
    by an untimed warm-up commit (and its threads reniced when asked)."""
    before = {int(t) for t in os.listdir("/proc/self/task")}
    saved = os.environ.get("CKPT_WORKERS")
    if cfg.workers is not None:
        os.environ["CKPT_WORKERS"] = str(cfg.workers)
    try:
        repo = ckptrepo.Repo.init(where, **cfg.init)  # CKPT_WORKERS is read here
    finally:
        if saved is None:
            os.environ.pop("CKPT_WORKERS", None)
        else:
            os.environ["CKPT_WORKERS"] = saved
    repo.commit(trainer.state, message="warm-up").wait()
    if cfg.nice:
        renice_new_threads(before, 19)
    return repo


def run_segment(cfg: Config, trainer: Trainer, steps: int, base: Path) -> Segment:
    where = base / f"seg-{cfg.name.replace(' ', '_').replace('=', '')}"
    where.mkdir()
    repo = open_repo(where / "repo", cfg, trainer) if cfg.kind == "ckpt" else None
    trainer.step()  # untimed, in every segment: the first commit must not repeat the warm-up's bytes
    handles: list[tuple[float, ckptrepo.CommitHandle]] = []
    seg = Segment(total=0.0, steps=[])
    load = ForeignLoad().start()
    try:
        cpu0 = time.process_time()
        start = time.perf_counter()
        for s in range(steps):
            if cfg.kind != "none" and s % cfg.k == 0:
                t0 = time.perf_counter()
                if repo is not None:
                    handle = repo.commit(trainer.state, step=trainer.n)
                    handles.append((time.perf_counter(), handle))  # phase 2 runs from here
                else:
                    path = where / f"step-{trainer.n}.pt"
                    torch.save({"model": trainer.model.state_dict(), "optim": trainer.opt.state_dict()}, path)
                    fsync_path(path)  # file and directory: durable, as a commit is
                seg.ckpt_times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            trainer.step()
            seg.steps.append((t0, time.perf_counter()))
        flush_start = time.perf_counter()
        commits = [h.wait() for _, h in handles]  # the final flush: no background work left out
        end = time.perf_counter()
        seg.cpu = time.process_time() - cpu0
        seg.total = end - start
        seg.flush = end - flush_start
        load.stop()
        seg.load = load
        if repo is not None:  # the deferred encoding: done now, measured, reported
            seg.pending_after = repo.repack_pending()[1]
            seg.stored_deferred = repo.stats().stored_bytes
            cpu1, t1 = time.process_time(), time.perf_counter()
            repo.repack()
            seg.repack_s = time.perf_counter() - t1
            seg.repack_cpu = time.process_time() - cpu1
            seg.stored_after = repo.stats().stored_bytes
        for (staged, _), c in zip(handles, commits, strict=True):
            seg.windows.append((staged, staged + c.persist_s))
            seg.persist.append(c.persist_s)
            seg.wait.append(c.wait_s)
            seg.new_bytes.append(c.new_bytes)
    finally:
        if repo is not None:
            repo.close()
        shutil.rmtree(where, ignore_errors=True)
    return seg


def split_steps(seg: Segment) -> tuple[list[float], list[float]]:
    """Step durations that overlapped some commit's phase 2, and those that did not."""
    during, outside = [], []
    for a, b in seg.steps:
        (during if any(a < hi and b > lo for lo, hi in seg.windows) else outside).append(b - a)
    return during, outside


def attributed(seg: Segment, fallback_step: float) -> float:
    """Overhead % from inside the segment: checkpoint calls, the final flush and the extra
    time of steps that overlapped phase 2, over the segment's own undisturbed step time.
    Steps compared are interleaved in time, so load from other processes largely cancels."""
    during, outside = split_steps(seg)
    base = statistics.mean(outside) if outside else fallback_step
    extra = sum(seg.ckpt_times) + seg.flush + sum(d - base for d in during)
    return 100.0 * extra / (len(seg.steps) * base)


def spread(values: list[float]) -> tuple[float, float]:
    return (min(values), max(values)) if values else (float("nan"), float("nan"))


def fmt_spread(sp: tuple[float, float]) -> str:
    return f"{sp[0]:.1f}..{sp[1]:.1f}"


def configs(args: argparse.Namespace) -> list[Config]:
    out = [Config("none")]
    for k in args.ks if not args.only_ckpt else ():
        out.append(Config(f"torch.save k={k}", k, "save"))
    for k in args.ks:
        out.append(Config(f"ckptrepo k={k}", k, "ckpt"))
    if not args.quick:
        out.extend(Config(f"ckptrepo k={k} workers=1", k, "ckpt", workers=1) for k in (10, 50) if k in args.ks)
    if args.nice:
        out.extend(Config(f"ckptrepo k={k} nice19", k, "ckpt", nice=True) for k in (10, 50) if k in args.ks)
    if args.normal_priority:
        out.extend(Config(f"ckptrepo k={k} normal-priority", k, "ckpt", init={"background_priority": "normal"})
                   for k in args.ks)
    if args.no_compression:
        out.extend(Config(f"ckptrepo k={k} no-compression", k, "ckpt", init={"compression": False}) for k in args.ks)
    if args.inline:
        out.extend(Config(f"ckptrepo k={k} inline", k, "ckpt", init={"encode": "inline"}) for k in args.ks)
    if args.no_idle_repack:
        out.extend(Config(f"ckptrepo k={k} no-idle-repack", k, "ckpt", init={"idle_repack": False}) for k in args.ks)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100, help="training steps per segment, at least k (default 100)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of every configuration (default 5; --quick 1)")
    ap.add_argument("--none-steps", type=int, default=30, help="steps of each no-checkpoint segment (default 30)")
    ap.add_argument("--quick", action="store_true", help="~1.5 minutes: one round, no CKPT_WORKERS=1 variant")
    ap.add_argument("--max-foreign", type=float, default=0.10,
                    help="run a segment again when other processes took more than this share of the CPU (0.10)")
    ap.add_argument("--max-write", type=float, default=20.0,
                    help="... or when they wrote more than this many MiB/s to disk (default 20)")
    ap.add_argument("--retries", type=int, default=2, help="at most this many re-runs per segment (default 2)")
    ap.add_argument("--nice", action="store_true", help="also k=10/50 with ckptrepo's threads at nice 19")
    ap.add_argument("--normal-priority", action="store_true",
                    help="also every k with background_priority='normal' (phase 2 threads not in SCHED_IDLE)")
    ap.add_argument("--no-compression", action="store_true",
                    help="also every k with a repository made with compression=False (hash, dedup, raw chunks)")
    ap.add_argument("--inline", action="store_true",
                    help="also every k with encode='inline' (chunks encoded while committing, no repack)")
    ap.add_argument("--no-idle-repack", action="store_true",
                    help="also every k without the background repack between commits (all of it after the segment)")
    ap.add_argument("--ks", type=int, nargs="+", default=list(KS), help=f"checkpoint intervals (default {KS})")
    ap.add_argument("--only-ckpt", action="store_true", help="skip the torch.save segments (A/B runs of settings)")
    add_model_args(ap)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir under /work)")
    args = ap.parse_args()
    # Five rounds: at k=50 and 200 a segment holds one or two commits, and single segments
    # differ by ±5 points with the machine; the median of five is what the goals are read from.
    args.rounds = args.rounds if args.rounds is not None else (1 if args.quick else 5)
    with scratch_dir(args.dir) as base:
        run(base, args)


def run(base: Path, args: argparse.Namespace) -> None:
    trainer = Trainer.warmed(args)
    state_mib = trainer.state_mib()
    cfgs = configs(args)
    print(f"load average at start {os.getloadavg()[0]:.1f} (other processes share these cores)")
    print(f"model: {trainer.params() / 1e6:.1f}M params, state {state_mib:.0f} MiB (model + AdamW); "
          f"max(k, {args.steps}) steps/segment, k in {tuple(args.ks)}, {args.rounds} round(s); "
          f"torch threads {torch.get_num_threads()}, cpus {os.cpu_count()}, "
          f"CKPT_WORKERS default {os.environ.get('CKPT_WORKERS') or os.cpu_count()}; dir={base}", flush=True)

    thrown: dict[str, int] = {c.name: 0 for c in cfgs}

    def measure(cfg: Config, steps: int) -> Segment:
        """One segment, started when the machine is quiet and run again (up to --retries
        times) when other processes took more than --max-foreign of the CPU or wrote more than
        --max-write MiB/s meanwhile."""
        for _ in range(args.retries):
            wait_quiet(args.max_foreign, args.max_write)
            seg = run_segment(cfg, trainer, steps, base)
            if not seg.load.noisy(args.max_foreign, args.max_write):
                return seg
            thrown[cfg.name] += 1
        wait_quiet(args.max_foreign, args.max_write)
        return run_segment(cfg, trainer, steps, base)

    results: dict[str, list[Segment]] = {c.name: [] for c in cfgs}
    overheads: dict[str, list[float]] = {c.name: [] for c in cfgs}
    attrib: dict[str, list[float]] = {c.name: [] for c in cfgs}
    cpu_over: dict[str, list[float]] = {c.name: [] for c in cfgs}
    with_repack: dict[str, list[float]] = {c.name: [] for c in cfgs}
    none_steps: list[float] = []  # s/step of every no-checkpoint segment
    none_cpu: list[float] = []  # CPU-s/step of every no-checkpoint segment
    foreign: list[ForeignLoad] = []  # what other processes took during each kept segment
    started = time.perf_counter()
    for r in range(args.rounds):
        # none, c1, none, c2, ..., none: each configuration is compared with the no-checkpoint
        # segments right before and after it, so load from other processes that drifts over
        # minutes cancels out; the configurations' order rotates from round to round.
        others = cfgs[1:]
        others = others[r % len(others):] + others[: r % len(others)]
        none_seg = measure(cfgs[0], args.none_steps)
        before = none_seg.total / args.none_steps
        before_cpu = none_seg.cpu / args.none_steps
        none_steps.append(before)
        none_cpu.append(before_cpu)
        foreign.append(none_seg.load)
        for cfg in others:
            steps = max(cfg.k, args.steps)
            seg = measure(cfg, steps)
            none_seg = measure(cfgs[0], args.none_steps)
            after = none_seg.total / args.none_steps
            after_cpu = none_seg.cpu / args.none_steps
            none_steps.append(after)
            none_cpu.append(after_cpu)
            foreign.extend([seg.load, none_seg.load])
            results[cfg.name].append(seg)
            overheads[cfg.name].append(100.0 * (seg.total / (steps * (before + after) / 2) - 1.0))
            attrib[cfg.name].append(attributed(seg, (before + after) / 2))
            cpu_over[cfg.name].append(100.0 * (seg.cpu / (steps * (before_cpu + after_cpu) / 2) - 1.0))
            with_repack[cfg.name].append(100.0 * ((seg.total + seg.repack_s) / (steps * (before + after) / 2) - 1.0))
            before, before_cpu = after, after_cpu
        recent = foreign[-2 * len(others) - 1:]
        print(f"  round {r + 1}/{args.rounds} done ({time.perf_counter() - started:.0f} s; other processes took "
              f"{100 * median([x.share for x in recent]):.0f}% of the CPU, wrote "
              f"{median([x.write_mib_s for x in recent]):.0f} MiB/s): overhead % wall/attributed: "
              + ", ".join(f"{c.name} {overheads[c.name][-1]:.1f}/{attrib[c.name][-1]:.1f}" for c in cfgs[1:])
              + "; CPU %: " + ", ".join(f"{c.name} {cpu_over[c.name][-1]:.1f}" for c in cfgs[1:]),
              flush=True)

    step_none = median(none_steps)
    shares, writes = [x.share for x in foreign], [x.write_mib_s for x in foreign]
    extra: dict[str, Any] = {"steps": args.steps, "rounds": args.rounds, "state_mib": state_mib,
                             "params": trainer.params(), "step_none_s": step_none, "none_s_per_step": none_steps,
                             "none_cpu_s_per_step": none_cpu,
                             "foreign_cpu": shares, "foreign_write_mib_s": writes, "thrown": thrown,
                             "configs": {}}
    print(f"\nother processes took {100 * median(shares):.0f}% of the CPU and wrote {median(writes):.0f} MiB/s "
          f"(medians over kept segments; max {100 * max(shares):.0f}%, {max(writes):.0f} MiB/s); "
          f"{sum(thrown.values())} segments run again because they exceeded {100 * args.max_foreign:.0f}% or "
          f"{args.max_write:g} MiB/s: wall overheads are only as good as that is small")
    print(f"{'config':<28}{'s/step':>8}{'overh %':>9}{'attrib %':>9}{'ckpts':>6}{'stall s':>9}{'wait s':>8}"
          f"{'persist s':>10}{'interval s':>11}{'fits':>6}{'flush s':>8}{'step ms during/outside p2':>28}")
    print(f"{'none':<28}{step_none:8.4f}{0.0:9.1f}{0.0:9.1f}{0:6d}  ({len(none_steps)} segments of "
          f"{args.none_steps} steps between the others, {min(none_steps):.4f}..{max(none_steps):.4f} s/step)")
    for cfg in cfgs[1:]:
        segs = results[cfg.name]
        per_step = median([s.total / len(s.steps) for s in segs])
        over = median(overheads[cfg.name])
        att = median(attrib[cfg.name])
        n_ck = len(segs[0].ckpt_times)
        stall = median([statistics.mean(s.ckpt_times) for s in segs])
        info: dict[str, Any] = {"s_per_step": per_step, "overhead_pct": over, "attributed_pct": att,
                                "checkpoints": n_ck, "stall_mean_s": stall, "overheads": overheads[cfg.name],
                                "attributed": attrib[cfg.name], "cpu_pct": median(cpu_over[cfg.name]),
                                "cpu_overheads": cpu_over[cfg.name],
                                "spread_wall": spread(overheads[cfg.name]),
                                "spread_attributed": spread(attrib[cfg.name]),
                                "spread_cpu": spread(cpu_over[cfg.name])}
        line = f"{cfg.name:<28}{per_step:8.4f}{over:9.1f}{att:9.1f}{n_ck:6d}{stall:9.3f}"
        if cfg.kind == "ckpt":
            wait = median([statistics.mean(s.wait) for s in segs])
            persist = median([statistics.mean(s.persist) for s in segs])
            interval = cfg.k * step_none
            fits = persist < interval
            flush = median([s.flush for s in segs])
            during = [d for s in segs for d in split_steps(s)[0]]
            outside = [o for s in segs for o in split_steps(s)[1]]
            line += (f"{wait:8.3f}{persist:10.3f}{interval:11.2f}{'yes' if fits else 'no':>6}{flush:8.3f}"
                     f"{1000 * median(during):14.1f} / {1000 * median(outside):5.1f}")
            info.update(wait_mean_s=wait, persist_mean_s=persist, interval_s=interval, fits=fits, flush_s=flush,
                        step_during_p2_s=median(during), step_outside_p2_s=median(outside),
                        new_mib=median([statistics.mean(s.new_bytes) for s in segs]) / MIB,
                        with_repack_pct=median(with_repack[cfg.name]), spread_with_repack=spread(with_repack[cfg.name]),
                        repack_s=median([s.repack_s for s in segs]),
                        repack_cpu_per_commit=median([s.repack_cpu / max(1, len(s.persist)) for s in segs]),
                        cpu_per_commit=median([(s.cpu - len(s.steps) * median(none_cpu)) / max(1, len(s.persist))
                                               for s in segs]),
                        pending_mib=median([s.pending_after for s in segs]) / MIB,
                        stored_deferred_mib=median([s.stored_deferred for s in segs]) / MIB,
                        stored_after_mib=median([s.stored_after for s in segs]) / MIB)
        print(line)
        print(f"{'':<28}wall {fmt_spread(info['spread_wall'])}, attributed {fmt_spread(info['spread_attributed'])}, "
              f"CPU {info['cpu_pct']:.1f} ({fmt_spread(info['spread_cpu'])})"
              + (f"; incl. repack {info['with_repack_pct']:.1f} ({fmt_spread(info['spread_with_repack'])}); "
                 f"CPU-s per commit ~{info['cpu_per_commit']:.2f}; left raw at the end {info['pending_mib']:.0f} MiB, "
                 f"repack {info['repack_s']:.2f} s ({info['repack_cpu_per_commit']:.2f} CPU-s per commit), stored "
                 f"{info['stored_deferred_mib']:.0f} -> {info['stored_after_mib']:.0f} MiB"
                 if cfg.kind == "ckpt" else ""))
        extra["configs"][cfg.name] = info

    rows: list[tuple[str, float, str]] = [("no checkpointing, s/step", step_none, "")]
    for k in args.ks:
        c = extra["configs"][f"ckptrepo k={k}"]
        ts = extra["configs"].get(f"torch.save k={k}")
        fits = "fits" if c["fits"] else "does not fit"
        for label, key, sp in (("wall", "overhead_pct", "spread_wall"), ("attributed", "attributed_pct",
                                                                           "spread_attributed"),
                               ("CPU", "cpu_pct", "spread_cpu")):
            goal = goal_note(c[key], 3.5) if c["fits"] else "goal <= 3.5 applies where phase 2 fits"
            rows.append((f"ckptrepo k={k} overhead % ({label})", c[key],
                         f"{goal}; {fmt_spread(c[sp])}; phase 2 {fits} ({c['persist_mean_s']:.2f} s vs "
                         f"{c['interval_s']:.2f} s)"))
            if ts is None:
                continue
            rows.append((f"torch.save k={k} overhead % ({label})", ts[key], fmt_spread(ts[sp])))
            if label == "CPU":
                # torch.save + fsync mostly waits for the disk, which no CPU figure counts: a
                # comparison of what each takes from the cores, not the goal (which is time).
                note = "not a goal: torch.save's cost is mostly waiting for the disk, outside CPU time"
            else:
                note = goal_note(c[key] / ts[key], 1.0) if ts[key] > 0 else "torch.save overhead <= 0: noise"
            rows.append((f"RATIO ckptrepo / torch.save overhead, k={k} ({label})",
                         c[key] / ts[key] if ts[key] else float("nan"), note))
        rows.append((f"ckptrepo k={k} overhead % incl. the repack after it (wall)", c["with_repack_pct"],
                     f"{fmt_spread(c['spread_with_repack'])}; deferred work: {c['repack_s']:.2f} s, "
                     f"{c['repack_cpu_per_commit']:.2f} CPU-s per commit; stored {c['stored_deferred_mib']:.0f} -> "
                     f"{c['stored_after_mib']:.0f} MiB"))
    for name in [c.name for c in cfgs if c.kind == "ckpt" and c.init]:
        info = extra["configs"][name]
        for label, key, sp in (("wall", "overhead_pct", "spread_wall"), ("attributed", "attributed_pct",
                                                                         "spread_attributed"),
                               ("CPU", "cpu_pct", "spread_cpu")):
            rows.append((f"{name} overhead % ({label})", info[key], f"{fmt_spread(info[sp])}; for comparison"))
    for name in [c.name for c in cfgs if c.workers is not None or c.nice]:
        info = extra["configs"][name]
        rows.append((f"{name} overhead % (wall)", info["overhead_pct"], "knob comparison"))
        rows.append((f"{name} overhead % (attributed)", info["attributed_pct"], "knob comparison"))
    report(f"training overhead of checkpointing every k steps (max(k, {args.steps}) steps/segment, median of "
           f"{args.rounds} round(s); final flush included)", rows, extra)


if __name__ == "__main__":
    main()
