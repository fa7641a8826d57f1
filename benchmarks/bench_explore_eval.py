"""Evaluation and bisect (``ckpt eval``, ``ckpt bisect``): two figures with goals.

(a) Bisect with a statistics predicate (``--stat 'layers.2.*:nan'``) over a 10,000-commit branch
    whose ``layers.2.weight`` gains a NaN at a known commit: seconds of ``Repo.bisect`` from the
    root to the head (the line read, about 16 predicate queries, the diff at the commit found),
    median of ``--repeat`` calls on a warm database; goal <= 1 s. The branch's rows (commits,
    edges, 4 fresh tensors per commit with their statistics, one chunk each, entries, entry runs,
    a metric) are inserted through SQLAlchemy Core into the repository's own tables, placed on
    first-parent lines by ``db.lines`` as a commit would be (the ingest pipeline is not what is
    measured). For context, ``ckpt bisect`` as a process (its start included), no goal.
(b) ``ckpt eval`` per commit against the same command run on an already exported file: ten
    commits of a 4 MiB state (four 512x512 float32 tensors), each evaluated by a Python script that
    loads the safetensors file and runs the tensors as a small MLP on a batch (``safetensors.torch``
    and torch, as an evaluation of a PyTorch checkpoint does); ``ckpt eval REV... --run CMD`` as
    one process (start, export, run, record per commit) over the ten, against the command run ten
    times on one file exported beforehand, 7 rounds (3 with --quick), the order alternating,
    medians; goal <= 1.3. Beside it the same ratio in CPU time (user + system of the processes),
    which other processes on a shared machine disturb less. The same with a lighter script
    (``safetensors.numpy``, no torch in the command), no goal: there the fixed cost of the
    ``ckpt`` process (its start, and the torch import the export needs) weighs more.

    python benchmarks/bench_explore_eval.py [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import insert

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import goal_note, report

import ckptrepo
import ckptrepo.types
from ckptrepo.db import lines
from ckptrepo.db.engine import write_connection
from ckptrepo.db.models import Chunk, Commit, Edge, Entry, EntryRun, Metric, Pack, Ref, Tensor, TensorChunk
from ckptrepo.testing import parts

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
NAMES = [f"layers.{i}.weight" for i in range(4)]
BATCH = 5000
CKPT = [sys.executable, "-m", "ckptrepo.cli.app"]
_SOURCES = itertools.count()  # each timed `ckpt eval` labels its results anew, so that none is skipped

TORCH_SCRIPT = r'''
import json, sys, torch
from safetensors.torch import load_file
state = load_file(sys.argv[1])
x = torch.linspace(-1, 1, 64 * 512).reshape(64, 512)
for name in sorted(state):
    x = torch.tanh(x @ state[name] / 16)
print(json.dumps({"out_mean": float(x.mean()), "out_std": float(x.std())}))
'''
NUMPY_SCRIPT = r'''
import json, sys
import numpy as np
from safetensors.numpy import load_file
state = load_file(sys.argv[1])
x = np.linspace(-1, 1, 64 * 512, dtype=np.float32).reshape(64, 512)
for name in sorted(state):
    x = np.tanh(x @ state[name] / 16)
print(json.dumps({"out_mean": float(x.mean()), "out_std": float(x.std())}))
'''


def _hex(*parts: object) -> str:
    return hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()


# -- (a) bisect over a 10,000-commit branch -----------------------------------------------------------


def load_branch(repo: ckptrepo.Repo, n: int, nan_at: int) -> list[str]:
    """Insert a ``main`` of ``n`` commits (oldest first), each with 4 fresh tensors; ``layers.2.weight``
    holds one NaN from commit ``nan_at`` on. Returns the commit ids, oldest first."""
    ids = [_hex("commit", i) for i in range(n)]
    commits: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    tensors: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    metrics: list[dict[str, Any]] = []
    key = 0
    by_commit: dict[str, dict[str, str]] = {}
    keys: dict[str, int] = {}
    for i, cid in enumerate(ids):
        named = {}
        for name in NAMES:
            key += 1
            tid = _hex("tensor", cid, name)
            keys[tid] = key
            named[name] = tid
            h = int(tid[:8], 16) / 2**32
            nan = int(name == "layers.2.weight" and i >= nan_at)
            tensors.append({"key": key, "id": tid, "lead_key": key, "dtype": "float32", "shape": [512, 512],
                            "nbytes": 1 << 20, "chunk_size": 1 << 20, "n_chunks": 1, "numel": 512 * 512,
                            "mean": h - 0.5, "std": 1 + h, "min": -3 - h, "max": 3 + h, "l2_norm": 512 * (1 + h),
                            "abs_max": 3 + h, "nan_count": nan, "inf_count": 0})
        by_commit[cid] = named
        parent = ids[i - 1] if i else None
        commits.append({
            "id": cid, "message": f"step {10 * i}", "created_at": T0 + timedelta(minutes=i), "author": "bench",
            "host": "bench", "branch": "main", "step": 10 * i, "epoch": None, "generation": i + 1, "config": None,
            "code_version": None, "first_parent_id": parent,
            "skeleton": {"d": [x for name in NAMES for x in (name, {"t": name})]}, "n_tensors": len(NAMES),
            "logical_bytes": 4 << 20, "new_bytes": 0, "stored_bytes": 0, "stall_s": 0.0, "wait_s": 0.0,
            "persist_s": 0.0, "nonfinite": 1 if i >= nan_at else 0,
        })
        if parent is not None:
            edges.append({"child_id": cid, "parent_id": parent, "kind": "parent", "position": 0, "mapping": None})
        entries += [{"commit_id": cid, "name": name, "tensor_key": keys[tid]} for name, tid in named.items()]
        metrics.append({"commit_id": cid, "name": "loss", "value": 4.0 / (1 + i / 1000)})
    placed = lines.assign_all((c["id"], c["first_parent_id"], False) for c in commits)
    for c in commits:
        c.update(placed[c["id"]]._asdict())
    edges = lines.with_forks(edges, {c["id"]: (c["line_id"], c["fp_depth"]) for c in commits})
    runs = []
    for c in commits:
        before = by_commit[c["first_parent_id"]] if c["first_parent_id"] else None
        for run in lines.runs_of(c["line_id"], c["fp_depth"], by_commit[c["id"]], before):
            runs.append({"name": run["name"], "line_id": run["line_id"], "fp_depth": run["fp_depth"],
                         "tensor_key": keys[run["tensor_id"]], "changed_chunks": int(before is not None)})
    pack = _hex("pack")
    rows: list[tuple[Any, list[dict[str, Any]]]] = [
        (Pack, [{"id": pack, "size": 0, "n_chunks": key, "created_at": T0}]),
        (Chunk, [{"key": t["key"], "id": t["id"], "pack_id": pack, "offset": 0, "length": 1 << 20,
                  "raw_length": 1 << 20, "encoding": 0, "base_key": None, "depth": 0} for t in tensors]),
        (Tensor, tensors),
        (TensorChunk, [{"tensor_key": t["key"], "seq": 0, "chunk_key": t["key"]} for t in tensors]),
        (Commit, commits), (Entry, entries), (EntryRun, runs), (Edge, edges), (Metric, metrics),
        (Ref, [{"kind": "branch", "name": "main", "commit_id": ids[-1], "updated_at": T0}]),
    ]
    engine = parts(repo).engine
    for model, batch_rows in rows:
        with write_connection(engine) as conn:
            for start in range(0, len(batch_rows), BATCH):
                conn.execute(insert(model), batch_rows[start : start + BATCH])
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE")
    return ids


def bench_bisect(root: Path, n: int, repeat: int) -> list[tuple[str, float, str]]:
    nan_at = n * 73 // 100
    path = root / "bisect"
    with ckptrepo.Repo.init(path) as repo:
        started = time.perf_counter()
        ids = load_branch(repo, n, nan_at)
        print(f"bisect: loaded {n:,} commits in {time.perf_counter() - started:.1f} s", flush=True)
    with ckptrepo.Repo.open(path) as repo:
        def call() -> ckptrepo.types.BisectResult:
            return repo.bisect(ids[0], "main", stat="layers.2.*:nan")

        result = call()  # warm-up
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            result = call()
            times.append(time.perf_counter() - started)
    right = result.first_bad == ids[nan_at] and result.changed[0].name == "layers.2.weight"
    seconds = statistics.median(times)
    cli = []
    for _ in range(max(3, repeat // 2)):
        started = time.perf_counter()
        done = subprocess.run([*CKPT, "--repo", str(path), "bisect", ids[0], "main", "--stat", "layers.2.*:nan",
                               "--json"], capture_output=True, text=True)
        cli.append(time.perf_counter() - started)
        assert done.returncode == 0, done.stderr
    return [
        (f"bisect --stat, {n:,}-commit branch (s)", seconds,
         f"{goal_note(seconds, 1.0)}  {result.steps} queries, {'found' if right else 'WRONG'} "
         f"step {result.first_bad_step}"),
        ("ckpt bisect --stat, as a process (s)", statistics.median(cli), "(no goal) start of the CLI included"),
    ]


# -- (b) eval per commit against the command alone ----------------------------------------------------


def bench_eval(root: Path, commits: int, rounds: int) -> list[tuple[str, float, str]]:
    import torch

    path = root / "eval"
    g = torch.Generator().manual_seed(0)
    with ckptrepo.Repo.init(path) as repo:
        ids = [repo.commit({name: torch.randn(512, 512, generator=g) for name in NAMES}, step=100 * i,
                           blocking=True).wait().id for i in range(commits)]
        exported = root / "exported.safetensors"
        repo.export(ids[-1], exported)
    rows = []
    for label, script, goal in (("torch", TORCH_SCRIPT, True), ("numpy", NUMPY_SCRIPT, False)):
        file = root / f"eval_{label}.py"
        file.write_text(script)
        cmd = f"{shlex.quote(sys.executable)} {shlex.quote(str(file))} {{path}}"
        bare = cmd.replace("{path}", shlex.quote(str(exported)))

        def eval_all(cmd: str = cmd, label: str = label, counter: Iterator[int] = _SOURCES) -> None:
            done = subprocess.run([*CKPT, "--repo", str(path), "eval", *ids, "--run", cmd, "--source",
                                   f"bench {label} {next(counter)}", "--json"], capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["counts"]["ok"] == len(ids), done.stdout  # none skipped

        def alone(bare: str = bare) -> None:
            for _ in ids:
                done = subprocess.run(bare, shell=True, capture_output=True, text=True)
                assert done.returncode == 0, done.stderr

        times, cpu = _rounds({"eval": eval_all, "alone": alone}, rounds)
        per_eval, per_run = times["eval"] / commits, times["alone"] / commits
        ratio = per_eval / per_run
        note = (goal_note(ratio, 1.3) if goal else "(no goal)") + \
            f"  {per_eval:.3f} s vs {per_run:.3f} s per commit, {commits} commits of 4 MiB"
        rows.append((f"eval / command alone, {label} script", ratio, note))
        rows.append((f"  the same in CPU time, {label} script", cpu["eval"] / cpu["alone"],
                     "(context) user + system of the processes, which other load disturbs less"))
    return rows


def _rounds(fns: dict[str, Callable[[], None]], rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median wall seconds and median CPU seconds (user + system of the child processes) of each
    function over ``rounds`` rounds, the order alternating, after one warm-up each."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names[r % 2:] + names[: r % 2]:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - started)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[name].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return ({name: statistics.median(t) for name, t in times.items()},
            {name: statistics.median(t) for name, t in cpu.items()})


def run(quick: bool) -> list[tuple[str, float, str]]:
    """Both parts' rows (name, value, note); ``quick``: fewer repeats and rounds."""
    root = Path(tempfile.mkdtemp(prefix="ckptbench-explore-", dir="/work" if Path("/work").is_dir() else None))
    try:
        rows = bench_bisect(root, 10_000, 3 if quick else 7)
        rows += bench_eval(root, 10, 3 if quick else 7)
        return rows
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repeats and rounds")
    args = ap.parse_args()
    report("eval and bisect", run(args.quick))


if __name__ == "__main__":
    main()
