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

import argparse
import importlib
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _common import report

PARTS = {"delta": "bench_follow_delta", "latency": "bench_follow_latency", "view": "bench_follow_view"}


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
    print(f"# bench_follow on {cpu}, {time.strftime('%Y-%m-%d', time.gmtime())}")
    rows: list[tuple[str, float, str]] = []
    for part in chosen:
        started = time.perf_counter()
        try:
            module = importlib.import_module(PARTS[part])
        except ModuleNotFoundError as exc:
            if exc.name != PARTS[part]:
                raise
            print(f"# {part}: {PARTS[part]}.py is missing, skipped")
            continue
        got = module.run(args.quick)
        rows += got
        print(f"# {part}: {time.perf_counter() - started:.0f} s")
        for name, value, note in got:
            print(f"  {name}: {value:.3f}  {note}", flush=True)
    report("bench_follow", rows)
    for name, value, note in rows:
        if note.startswith("goal"):
            print(f"RATIO {name}: {value:.3f}  {note}")


if __name__ == "__main__":
    main()
