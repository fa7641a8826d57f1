"""What the background repack between commits costs a CPU training loop, and how often its
spare-CPU gate lets it start there.

Asynchronous commits store their new chunks raw; a repack at idle priority (``SCHED_IDLE``)
encodes them between commits, but only after a window in which the machine had at least
``CKPT_IDLE_REPACK_SPARE`` percent of a core idle (``ckptrepo.ingest.spare``). The training
benchmark's repositories run that repack, and it may land in any kind's block, which muddles
their comparison. This script measures it on its own, with the training loop of
``_training.py`` (~117 MiB state) in blocks of k steps, rounds in random order:
  - quiet: k steps; the gate's window is measured over the block (its reading of idle cores),
  - repack: the repository's own idle repack (``ingest.idle.IdleRepack.run``, as the committer
    thread runs it, started at once as if the gate had just opened) beside k steps; at the
    end it is stopped and the block lasts until it has wound down, so the block pays for
    all of it. Since it gives way to a busy machine (``spare.BusyWatch``), this is the cost
    of a repack that started in a pause of training and finds training resumed.
The repository holds a backlog of raw commits made beforehand (``--backlog``, topped up
untimed when it runs low). Printed: the repack blocks' overhead over the quiet ones (mean
and 95% bootstrap interval over the rounds, paired), the MiB the repack encoded per block
and its process CPU, and the gate's readings in the quiet blocks: the idle cores it saw and
the share of windows it would have passed at the configured threshold.

    python benchmarks/bench_idle_repack.py [--k 50] [--rounds 30] [--backlog 40] [--seed 0]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bootstrap, report, scratch_dir
from _training import MIB, Trainer, add_model_args
from bench_commit_cpu import nudge

import ckptrepo
from ckptrepo.ingest.spare import SpareCpuGate
from ckptrepo.testing import parts


def fill(repo: ckptrepo.Repo, trainer: Trainer, commits: int) -> None:
    """Add ``commits`` raw commits of the state (every tensor changed) to the repack backlog."""
    for _ in range(commits):
        nudge(trainer)
        repo.commit(trainer.state, step=trainer.n).wait()


def quiet_block(trainer: Trainer, k: int, gate: SpareCpuGate) -> tuple[float, float, float]:
    """k steps; (wall s, process CPU s, idle cores the gate saw over them)."""
    cpu0, start = time.process_time(), time.perf_counter()
    gate.start()
    for _ in range(k):
        trainer.step()
    gate.passed()
    gc.collect()
    spare = gate.last_spare if gate.last_spare is not None else float("nan")
    return time.perf_counter() - start, time.process_time() - cpu0, spare


def repack_block(repo: ckptrepo.Repo, trainer: Trainer, k: int) -> tuple[float, float, int]:
    """k steps beside the idle repack, until it has wound down; (wall s, process CPU s, bytes encoded)."""
    before = repo.repack_pending()[1]
    stop = threading.Event()
    cpu0, start = time.process_time(), time.perf_counter()
    runner = threading.Thread(target=parts(repo).writer._idle.run, args=(stop.is_set,), name="bench-idle-repack")
    runner.start()
    for _ in range(k):
        trainer.step()
    stop.set()
    runner.join()
    parts(repo).writer._idle.wait()
    gc.collect()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    return wall, cpu, before - repo.repack_pending()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=50, help="training steps per block")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--backlog", type=int, default=40, help="raw commits made before the rounds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", type=Path, default=None)
    add_model_args(ap)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    trainer = Trainer.warmed(args, 3)
    gate = SpareCpuGate()
    quiet: list[tuple[float, float, float]] = []
    busy: list[tuple[float, float, int]] = []
    with scratch_dir(args.dir) as base, ckptrepo.Repo.init(base / "repo", idle_repack=False) as repo:
        fill(repo, trainer, args.backlog)
        low = 3 * trainer.state_mib() * MIB
        print(f"state {trainer.state_mib():.0f} MiB; backlog {repo.repack_pending()[1] / MIB:.0f} MiB; "
              f"gate threshold {gate.min_spare:.2f} idle cores", flush=True)
        for r in range(args.rounds):
            if repo.repack_pending()[1] < low:
                fill(repo, trainer, args.backlog // 2)
            order = ["quiet", "repack"]
            rng.shuffle(order)
            for kind in order:
                if kind == "quiet":
                    quiet.append(quiet_block(trainer, args.k, gate))
                else:
                    busy.append(repack_block(repo, trainer, args.k))
            if (r + 1) % 10 == 0:
                over = 100 * (sum(b[0] for b in busy) / sum(q[0] for q in quiet) - 1)
                print(f"  {r + 1}/{args.rounds} rounds: repack blocks {over:+.1f}%", flush=True)
    n = len(quiet)

    def over(idx: list[int]) -> float:
        return 100 * (sum(busy[i][0] - quiet[i][0] for i in idx) / sum(quiet[i][0] for i in idx))

    lo, hi = bootstrap(over, n, rng)
    mib = [b[2] / MIB for b in busy]
    extra_cpu = statistics.mean(b[1] - q[1] for b, q in zip(busy, quiet, strict=True))
    spares = [q[2] for q in quiet]
    passed = sum(1 for s in spares if s >= gate.min_spare) / n
    block = statistics.mean(q[0] for q in quiet)
    rows = [
        (f"quiet block (k={args.k}), s", block, f"{block / args.k:.3f} s per step"),
        ("repack blocks over quiet ones, % (wall)", over(list(range(n))), f"95% CI {lo:.1f}..{hi:.1f}"),
        ("MiB encoded per repack block", statistics.mean(mib), f"min {min(mib):.0f}, max {max(mib):.0f}"),
        ("process CPU per repack block over a quiet one, s", extra_cpu, ""),
        ("training time lost per MiB encoded, ms", 1e3 * statistics.mean(b[0] - q[0] for b, q in
                                                                            zip(busy, quiet, strict=True))
         / statistics.mean(mib) if sum(mib) else float("nan"), "nan: nothing was encoded"),
        ("idle cores in quiet blocks (the gate's reading), median", statistics.median(spares),
         f"min {min(spares):.2f}, max {max(spares):.2f}"),
        ("share of quiet blocks the gate would pass", passed, f"threshold {gate.min_spare:.2f} idle cores"),
    ]
    report("the idle repack beside a CPU training loop, paired blocks", rows,
           {"k": args.k, "rounds": n, "quiet": quiet, "repack": busy})


if __name__ == "__main__":
    main()
