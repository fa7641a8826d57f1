"""Lineage inferred from the weights (``Repo.infer_lineage``, what ``ckpt import-run DIR --infer-lineage``
runs) on a lineage built from a released small model, against the lineage's true edges.

The lineage is ``lineage_minilm.py``'s (cached where ``bench_storage.py`` caches it, trained on
first use): the released all-MiniLM-L6-v2 as ``base``, full fine-tunes of it (``finetune_*``, a
chain), frozen-encoder transfers under a new head (``transfer_*``: the first a transfer from the
base, the others its chain), and a fork of the second fine-tune at another learning rate
(``fork_*``), every checkpoint but the base with its AdamW state (``optim.<param>.exp_avg``,
``.exp_avg_sq``, ``.step``): 16 files, ~3.3 GB (``--quick``: 3 checkpoints per branch, 10 files).

The checkpoints are given without their lineage: linked under random names, in a shuffled order,
into a folder of their own, and ``infer_lineage`` proposes each one's source (parent or transfer)
among the others. A true edge is right when the proposal for its model names the same source and
kind; the figure is true edges right / true edges (goal >= 0.9; a root proposed for a model that
has a source, or another source, misses its edge). Also reported, without a goal: the same with
the model weights alone (the optimizer state left out of copies of the files, so no step counter
orients an edge: only the names and the weights' tail index do), the seconds each inference took,
and whether committing the accepted proposals (``commit_lineage``) records the proposed edges.

    python benchmarks/bench_explore_lineage.py [--quick] [--data DIR] [--dir PATH]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import goal_note, report, scratch_dir

import ckptrepo


def lineage(quick: bool, data: Path | None = None) -> tuple[Path, list[Any]]:
    """The MiniLM lineage's folder and entries (trained on first use, then reused)."""
    import lineage_minilm

    folder = data or Path(tempfile.gettempdir()) / ("ckptrepo-bench-storage-minilm" + ("-quick" if quick else ""))
    entries, _ = lineage_minilm.make_lineage(folder, lineage_minilm.QUICK if quick else lineage_minilm.MiniLMConfig())
    return folder, entries


def shuffled(entries: list[Any], data: Path, into: Path, *, weights_only: bool = False) -> dict[str, str]:
    """Each checkpoint under a random name in ``into`` (a link, or with ``weights_only`` a copy without
    the optimizer state); path -> the entry's name."""
    from safetensors.torch import load_file, save_file

    into.mkdir(parents=True)
    rng = random.Random(11)
    names = rng.sample(range(10_000, 100_000), len(entries))
    out: dict[str, str] = {}
    for e, n in zip(entries, names, strict=True):
        path = into / f"model_{n}.safetensors"
        if weights_only:
            save_file({k: v for k, v in load_file(str(data / e.file)).items() if not k.startswith("optim.")}, str(path))
        else:
            os.symlink(data / e.file, path)
        out[str(path)] = e.name
    return out


def truth(entries: list[Any]) -> dict[str, tuple[str, str] | None]:
    return {e.name: ("parent", e.parent) if e.parent else ("transfer", e.transfer_from) if e.transfer_from else None
            for e in entries}


def infer(repo_dir: Path, paths: dict[str, str],
          true: dict[str, tuple[str, str] | None]) -> tuple[float, float, list[Any]]:
    """(true edges right / true edges, seconds, proposals) of one inference over ``paths`` in shuffled order."""
    order = list(paths)
    random.Random(5).shuffle(order)
    with ckptrepo.Repo.open(repo_dir) as repo:
        started = time.perf_counter()
        proposals = repo.infer_lineage(order)
        took = time.perf_counter() - started
    right = 0
    for p in proposals:
        got = (p.kind, paths[p.parent]) if p.kind and p.parent else None
        want = true[paths[p.model]]
        right += want is not None and got == want
        mark = "ok" if got == want else f"WRONG, true: {want}"
        print(f"    {paths[p.model]:<12} <- {got}  score {p.score:.4f}  {mark}", flush=True)
    return right / sum(1 for v in true.values() if v is not None), took, proposals


def recorded_right(repo_dir: Path, proposals: list[Any], paths: dict[str, str]) -> float:
    """Commit the proposals as ``--accept`` does; the share of commits whose recorded edge is the proposed one."""
    with ckptrepo.Repo.open(repo_dir) as repo:
        made = repo.commit_lineage(proposals, branch="inferred")
        by_path = {p.model: c.id for p, c in zip(proposals, made, strict=True)}
        good = 0
        for p, c in zip(proposals, made, strict=True):
            edges = [(e.kind, e.id) for e in repo.get_commit(c.id).parents]
            want = [(p.kind, by_path.get(p.parent, p.parent))] if p.kind and p.parent else []
            good += edges == want
    return good / len(made)


def run(quick: bool, data: Path | None = None, parent: Path | None = None) -> list[tuple[str, float, str]]:
    """The benchmark's rows (name, value, note)."""
    folder, entries = lineage(quick, data)
    true = truth(entries)
    edges = sum(1 for v in true.values() if v is not None)
    print(f"  lineage: {len(entries)} checkpoints, {edges} edges, "
          f"{sum(e.bytes for e in entries) / 2**30:.2f} GiB ({folder})", flush=True)
    with scratch_dir(parent) as base:
        repo_dir = base / "repo"
        ckptrepo.Repo.init(repo_dir).close()
        print("  with optimizer state:", flush=True)
        full = shuffled(entries, folder, base / "given")
        right, took, proposals = infer(repo_dir, full, true)
        print("  model weights only:", flush=True)
        bare = shuffled(entries, folder, base / "weights", weights_only=True)
        right_w, took_w, _ = infer(repo_dir, bare, true)
        recorded = recorded_right(repo_dir, proposals, full)
    n = len(entries)
    return [
        ("lineage: edges right / total", right, goal_note(right, 0.9, at_most=False)),
        ("lineage: edges right / total, weights only", right_w, "no optimizer step counters: names and tail index"),
        ("lineage: inference seconds", took, f"{n} checkpoints, {took / n:.2f} s each"),
        ("lineage: inference seconds, weights only", took_w, f"{n} checkpoints"),
        ("lineage: accepted edges recorded / proposed", recorded, "commit_lineage of the proposals"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 checkpoints per branch (10 files)")
    parser.add_argument("--data", type=Path, default=None, help="the lineage's folder (default: bench_storage's cache)")
    parser.add_argument("--dir", type=Path, default=None, help="where the repository goes (default: under /work)")
    args = parser.parse_args()
    report("bench_explore_lineage", run(args.quick, args.data, args.dir), {"quick": args.quick})


if __name__ == "__main__":
    main()
