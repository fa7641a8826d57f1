"""Exploring a lineage, in one run: bisect, evaluation runs, weight merges and lineage inference.

Each part measures ckptrepo against its peer on the same data, in this run:

- bisect with a statistics predicate over a 10,000-commit branch: seconds (goal <= 1 s);
- ``ckpt eval`` per commit / the same command run on an already exported file (goal <= 1.3);
- merge of two ~500 MB models: time / a plain torch merge that loads both whole (goal <= 1.0), and
  peak RSS / that merge's (goal <= 0.5), each in a fresh process;
- lineage inference on a lineage built from a released small model (all-MiniLM-L6-v2: base, full
  fine-tunes, frozen-encoder transfers, a fork at another learning rate, with optimizer states):
  edges right / total (goal >= 0.9).

    python benchmarks/bench_explore.py [--quick] [--only eval,merge,lineage]

The parts are ``bench_explore_eval.py``, ``bench_explore_merge.py`` and
``bench_explore_lineage.py`` (each also runs alone); their RATIO rows are printed together.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _common import run_parts

PARTS = {"eval": "bench_explore_eval", "merge": "bench_explore_merge", "lineage": "bench_explore_lineage"}


def main() -> None:
    run_parts("bench_explore", PARTS, __doc__)


if __name__ == "__main__":
    main()
