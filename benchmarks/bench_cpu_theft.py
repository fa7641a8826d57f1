"""What a CPU-second of other work costs the training loop on this machine.

The training benchmark's overheads are, to first order, what a commit's background threads
take from the trainer's cores; how much loop time one CPU-second of them costs depends on the
machine (the OpenMP barriers of both intra-op threads wait for a preempted one; execution
units or caches may be shared on the host). This script calibrates that exchange rate, so
that the per-commit CPU of ``bench_commit_cpu.py`` can be read as loop time:

The training loop of ``_training.py`` (both cores) runs blocks of ``--steps`` steps, in
rounds whose order is drawn at random:
  - none: the steps alone,
  - blake3: beside them a helper *process* (no shared interpreter lock) hashes a 1 MiB
    buffer with BLAKE3 (the ``blake3`` package, as ckptrepo calls it) for ``--duty`` of
    every 0.2 s, sleeping the rest,
  - scalar: the same helper running a scalar integer loop instead (no SIMD, no memory
    traffic): CPU time alone.
The helper's CPU is read over the block only (it starts before the block and waits for a
signal). Printed per helper: the loop time lost per CPU-second the helper used (mean over
rounds of the block's excess over the none block of its round, over the mean helper CPU,
with a 95% bootstrap interval over the rounds). 1.0 means the loop lost exactly the CPU
taken; more means each stolen second stalls the trainer's other thread too.

    python benchmarks/bench_cpu_theft.py [--rounds 12] [--steps 25] [--duty 0.25] [--seed 0]
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import random
import statistics
import sys
import time
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path

import blake3
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bootstrap, report
from _training import Trainer, add_model_args

PERIOD = 0.2
HELPERS = ("blake3", "scalar")


def _work(kind: str, buf: bytes) -> None:
    if kind == "blake3":
        blake3.blake3(buf).digest()
    else:
        x = 0
        for i in range(20000):
            x += i * i


def helper(kind: str, duty: float, ready: Event, go: Event, stop: Event, cpu_s: Synchronized) -> None:  # type: ignore[type-arg]
    """Busy ``duty`` of every ``PERIOD`` seconds from ``go`` until ``stop``; its CPU seconds
    over that span go to ``cpu_s``."""
    buf = bytes(1 << 20)
    _work(kind, buf)  # first touch before the block
    ready.set()
    go.wait()
    c0 = time.process_time()
    while not stop.is_set():
        t = time.perf_counter()
        while time.perf_counter() - t < duty * PERIOD:
            _work(kind, buf)
        time.sleep(max(0.0, PERIOD - (time.perf_counter() - t)))
    cpu_s.value = time.process_time() - c0


def block(trainer: Trainer, steps: int, kind: str | None, duty: float) -> tuple[float, float]:
    """Wall seconds of ``steps`` training steps beside a helper of ``kind`` (None: alone),
    and the helper's CPU seconds over them."""
    # Spawned, not forked: a forked child shares the trainer's pages copy-on-write, and the
    # trainer's writes would then pay page faults that no helper's CPU causes.
    ctx = mp.get_context("spawn")
    ready, go, stop, cpu_s = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Value("d", 0.0)
    proc = None
    if kind is not None:
        proc = ctx.Process(target=helper, args=(kind, duty, ready, go, stop, cpu_s))
        proc.start()
        if not ready.wait(120):
            raise SystemExit(f"the {kind} helper did not start")
    go.set()
    start = time.perf_counter()
    for _ in range(steps):
        trainer.step()
    wall = time.perf_counter() - start
    stop.set()
    if proc is not None:
        proc.join()
    return wall, float(cpu_s.value)


def rate(excess: list[float], cpu: list[float], idx: list[int]) -> float:
    """Loop seconds lost per helper CPU-second over the rounds ``idx``."""
    c = statistics.mean(cpu[i] for i in idx)
    return statistics.mean(excess[i] for i in idx) / c if c > 0 else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=25, help="training steps per block")
    ap.add_argument("--duty", type=float, default=0.25, help="share of one core the helper tries to take")
    ap.add_argument("--seed", type=int, default=0, help="seed of the block order and the bootstrap")
    add_model_args(ap)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    trainer = Trainer.warmed(args)
    print(f"torch threads {torch.get_num_threads()}; {args.rounds} rounds of {args.steps} steps, "
          f"helper duty {args.duty:.2f}", flush=True)
    walls: dict[str, list[float]] = {k: [] for k in ("none", *HELPERS)}
    cpus: dict[str, list[float]] = {k: [] for k in HELPERS}
    for _ in range(args.rounds):
        order = ["none", *HELPERS]
        rng.shuffle(order)
        for kind in order:
            wall, cpu_s = block(trainer, args.steps, None if kind == "none" else kind, args.duty)
            walls[kind].append(wall)
            if kind != "none":
                cpus[kind].append(cpu_s)
    none = walls["none"]
    n = len(none)
    rows = [("none block, s", statistics.mean(none), f"{n} rounds of {args.steps} steps")]
    extra: dict[str, object] = {"rounds": n, "steps": args.steps, "duty": args.duty}
    for kind in HELPERS:
        excess = [w - b for w, b in zip(walls[kind], none, strict=True)]
        lo, hi = bootstrap(functools.partial(rate, excess, cpus[kind]), n, rng)
        r = rate(excess, cpus[kind], list(range(n)))
        rows.append((f"loop seconds lost per helper CPU-second: {kind}", r,
                     f"95% CI {lo:.2f}..{hi:.2f}; helper CPU {statistics.mean(cpus[kind]):.2f} s per block, "
                     f"block +{statistics.mean(excess):.2f} s"))
        extra[kind] = {"rate": r, "ci95": (lo, hi), "cpu_s": statistics.mean(cpus[kind]),
                       "excess_s": statistics.mean(excess)}
    report("loop time lost per CPU-second of other work beside training (mean, 95% bootstrap interval)",
           rows, extra)


if __name__ == "__main__":
    main()
