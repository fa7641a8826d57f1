"""Handing commits on, in one run: following a branch and the read-only view of a commit.

- bytes a follower reads per update / TRL's int32-index + bf16-value encoding of the same change,
  at 1%, 2% and 5% of elements changed and for a CPU fine-tune at lr 3e-6 (goal <= 0.7);
- commit durable -> follower updated / reading the new chunks' bytes (goal <= 1.5);
- the fsspec view: ``from_pretrained`` through it / from an exported folder (goal <= 1.3).

    python benchmarks/bench_follow.py [--quick] [--only delta,latency,view]

The parts are ``bench_follow_delta.py``, ``bench_follow_latency.py`` and ``bench_follow_view.py``
(each also runs alone); their RATIO rows are printed together. A part whose module is missing is
reported and skipped.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _common import run_parts

PARTS = {"delta": "bench_follow_delta", "latency": "bench_follow_latency", "view": "bench_follow_view"}


def main() -> None:
    run_parts("bench_follow", PARTS, __doc__)


if __name__ == "__main__":
    main()
