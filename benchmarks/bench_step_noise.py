"""How noisy the training benchmark's two overhead estimates are on this machine, with no
checkpoint at all.

Runs the training loop of ``bench_training_paired.py`` for ``--steps`` steps with nothing else
going on, times every step, cuts the series into consecutive blocks of k steps and pairs each
block with the next, as a round pairs a checkpoint's block with its none block. With no
checkpoint both estimates of a pair's difference should be zero; their spread over the pairs is
the noise a round carries:
  - the block estimate: the difference of the two blocks' sums (``overhead`` in
    ``bench_training_paired.py``),
  - the local estimate: the difference of the two blocks' ``local_loss`` (the first ``HEAD``
    steps' excess over the mean of the next ``BASELINE``), which leaves out how fast the
    machine ran in each block.
Printed as the standard deviation over pairs, in % of a block, for k = 50 and 200 and for
the local estimate's 10- and 20-step heads. A shared VM whose speed drifts over seconds shows
a block spread many times the local one.

    python benchmarks/bench_step_noise.py [--steps 4000]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report
from _training import Trainer, add_model_args
from bench_training_paired import CHECK_HEAD, HEAD, Block, local_loss


def pairs(steps: list[float], k: int) -> list[tuple[Block, Block]]:
    """Consecutive blocks of ``k`` steps, each with the next (no call, wait or collection)."""
    blocks = [Block(wall=sum(steps[i:i + k]), cpu=0.0, steps=steps[i:i + k]) for i in range(0, len(steps) - k + 1, k)]
    return list(itertools.pairwise(blocks))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4000, help="training steps timed (~0.06-0.1 s each)")
    add_model_args(ap)
    args = ap.parse_args()
    trainer = Trainer.warmed(args)
    steps = []
    for _ in range(args.steps):
        start = time.perf_counter()
        trainer.step()
        steps.append(time.perf_counter() - start)
    mean = statistics.mean(steps)
    rows: list[tuple[str, float, str]] = [
        ("s/step", mean, f"{args.steps} steps, median {statistics.median(steps):.3f} s")]
    for k in (50, 200):
        paired = pairs(steps, k)
        if len(paired) < 2:
            continue
        block = k * mean
        spread = statistics.pstdev(b.wall - a.wall for a, b in paired)
        rows.append((f"k={k} block estimate: spread of a round, % of a block", 100 * spread / block,
                     f"{len(paired)} pairs of consecutive blocks"))
        for head in (HEAD, CHECK_HEAD):
            local = statistics.pstdev(local_loss(b, head) - local_loss(a, head) for a, b in paired)
            rows.append((f"k={k} local estimate ({head}-step head): spread of a round, % of a block",
                         100 * local / block, f"{spread / local:.1f}x narrower than the block estimate"))
    report("noise of the training benchmark's estimates, with no checkpoint", rows,
           {"steps": args.steps, "step_s": mean})


if __name__ == "__main__":
    main()
