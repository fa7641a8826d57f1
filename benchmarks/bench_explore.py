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

import argparse
import importlib
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _common import report

PARTS = {"eval": "bench_explore_eval", "merge": "bench_explore_merge", "lineage": "bench_explore_lineage"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--only", default=",".join(PARTS), help="comma-separated parts: " + ", ".join(PARTS))
    args = parser.parse_args()
    chosen = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in PARTS]
    if unknown:
        parser.error(f"unknown parts {unknown}; known: {', '.join(PARTS)}")
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"# bench_explore on {cpu}, {time.strftime('%Y-%m-%d', time.gmtime())}")
    rows: list[tuple[str, float, str]] = []
    for part in chosen:
        started = time.perf_counter()
        module = importlib.import_module(PARTS[part])
        got = module.run(args.quick)
        rows += got
        print(f"# {part}: {time.perf_counter() - started:.0f} s")
        for name, value, note in got:
            print(f"  {name}: {value:.3f}  {note}", flush=True)
    report("bench_explore", rows)
    for name, value, note in rows:
        if note.startswith("goal"):
            print(f"RATIO {name}: {value:.3f}  {note}")


if __name__ == "__main__":
    main()
