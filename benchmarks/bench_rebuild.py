"""The store as the source of truth: what the commit manifests cost, and how fast ``db rebuild``
recreates a lost database.

1. Manifest bytes per commit of the training benchmark's state (``_training.Trainer``: the
   small transformer and its AdamW state, ~117 MiB): ``--train-commits`` commits, a few
   training steps apart, each one's manifest size against the bytes the commit stored
   (goal: <= 2% of them; the worst commit counts).
2. Rebuild per 1,000 commits: a lineage of ``--commits`` commits (a small state with one
   changed tensor each, metrics, a branch every 100 commits and a tag every 250), its database
   deleted, ``Repo.rebuild_database`` timed; the peer is the time the same commits took to make.
3. Rebuild per GB of store: ``--gib`` GiB of packs in ``--big-commits`` commits of incompressible
   tensors (the footers are what a rebuild reads of them); the peer is restic rebuilding a lost
   index (its ``index/`` folder emptied) from its packs' headers, ``repair index``
   (``rebuild-index`` before 0.16), over a restic repository holding the same bytes (when
   restic is installed).

    python benchmarks/bench_rebuild.py [--commits 2000] [--gib 1.0] [--train-commits 6] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import goal_note, report
from _training import Trainer, add_model_args

import ckptrepo
from ckptrepo.ledger import manifest
from ckptrepo.testing import parts

MIB = 1 << 20


def manifest_sizes(base: Path, args: argparse.Namespace) -> list[tuple[int, int]]:
    """(manifest bytes, commit stored bytes) of each commit of the training state."""
    trainer = Trainer.warmed(args)
    out = []
    with ckptrepo.Repo.init(base / "train") as repo:
        for i in range(args.train_commits):
            for _ in range(3):
                trainer.step()
            c = repo.commit(trainer.state, step=i, metrics={"loss": 1.0 / (i + 1)}, blocking=True).wait()
            size = parts(repo).backend.size(manifest.key_of(c.id))
            out.append((size, c.stored_bytes))
    return out


def lineage(base: Path, n: int) -> tuple[Path, float]:
    """A repository of ``n`` small commits; returns its folder and the seconds its commits took."""
    g = torch.Generator().manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(64, 64, generator=g) for i in range(8)}
    state["step"] = torch.zeros((), dtype=torch.int64)
    started = time.perf_counter()
    with ckptrepo.Repo.init(base / "lineage", chunk_size=16 * 1024) as repo:
        branch = "main"
        for i in range(n):
            if i and i % 100 == 0:
                branch = f"run{i // 100}"
                repo.branch(branch, at="main")
            state[f"layer{i % 8}.weight"].add_(0.01)
            state["step"].fill_(i)
            repo.commit(state, branch=branch, step=i, metrics={"loss": 1.0 / (i + 1), "acc": i / n}).wait()
            if i % 250 == 249:
                repo.tag(f"t{i}", at=branch)
        path = repo.repo_dir
    return path, time.perf_counter() - started


def big_store(base: Path, gib: float, commits: int) -> tuple[Path, Path]:
    """A repository of ``gib`` GiB of incompressible tensors, and a folder of the same bytes as files."""
    files = base / "files"
    files.mkdir()
    per = int(gib * (1 << 30) / commits)
    g = torch.Generator().manual_seed(1)
    with ckptrepo.Repo.init(base / "big", compression=False) as repo:
        for i in range(commits):
            t = torch.randint(0, 256, (per,), dtype=torch.uint8, generator=g)
            repo.commit({"blob": t}, step=i, blocking=True).wait()
            (files / f"blob{i}.bin").write_bytes(t.numpy().tobytes())
        return repo.repo_dir, files


def lose_and_rebuild(repo_dir: Path) -> tuple[float, ckptrepo.RebuildReport]:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{repo_dir / 'db.sqlite'}{suffix}").unlink(missing_ok=True)
    os.sync()
    started = time.perf_counter()
    result = ckptrepo.Repo.rebuild_database(repo_dir)
    return time.perf_counter() - started, result


def restic_repair(base: Path, files: Path) -> float | None:
    if shutil.which("restic") is None:
        return None
    env = {**os.environ, "RESTIC_REPOSITORY": str(base / "restic"), "RESTIC_PASSWORD": "bench"}
    subprocess.run(["restic", "init", "--repository-version", "2"], env=env, check=True, capture_output=True)
    subprocess.run(["restic", "backup", "--compression", "off", str(files)], env=env, check=True,
                   capture_output=True)
    os.sync()
    # Its index lost, as our database: restic rebuilds it from the headers of its packs, as a
    # rebuild here reads pack footers. ``repair index`` since restic 0.16; ``rebuild-index`` before.
    shutil.rmtree(base / "restic" / "index")
    (base / "restic" / "index").mkdir()
    version = subprocess.run(["restic", "version"], capture_output=True, text=True).stdout.split()[1]
    new = tuple(int(x) for x in version.split(".")[:2]) >= (0, 16)
    command = ["repair", "index"] if new else ["rebuild-index"]
    started = time.perf_counter()
    subprocess.run(["restic", *command], env=env, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", type=int, default=2000)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--big-commits", type=int, default=8)
    ap.add_argument("--train-commits", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3, help="rebuilds timed per repository (median)")
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--quick", action="store_true")
    add_model_args(ap)
    args = ap.parse_args()
    if args.quick:
        args.commits, args.gib, args.train_commits, args.rounds = 200, 0.125, 3, 1
    base = Path(tempfile.mkdtemp(prefix="bench-rebuild-", dir=args.dir))
    try:
        run(base, args)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run(base: Path, args: argparse.Namespace) -> None:
    sizes = manifest_sizes(base, args)
    later = [m / s for m, s in sizes if s]
    worst = max(later) if later else float("nan")
    print("manifest bytes, commit stored bytes:", sizes)

    repo_dir, made = lineage(base, args.commits)
    times, result = [], None
    for _ in range(args.rounds):
        seconds, result = lose_and_rebuild(repo_dir)
        times.append(seconds)
    assert result is not None and result.commits == args.commits and not result.skipped, result
    per_k = statistics.median(times) * 1000 / args.commits
    with ckptrepo.Repo.open(repo_dir) as repo:
        assert repo.verify().ok

    big_dir, files = big_store(base, args.gib, args.big_commits)
    big_times, big = [], None
    for _ in range(args.rounds):
        seconds, big = lose_and_rebuild(big_dir)
        big_times.append(seconds)
    assert big is not None and big.commits == args.big_commits
    store_gib = sum(p.stat().st_size for p in (big_dir / "store").rglob("*") if p.is_file()) / (1 << 30)
    per_gib = statistics.median(big_times) / store_gib
    restic = restic_repair(base, files)

    rows = [
        ("manifest bytes per commit, median", statistics.median(m for m, _ in sizes), "training state"),
        ("RATIO manifest / commit stored bytes, worst, %", 100 * worst, goal_note(100 * worst, 2.0)),
        ("rebuild s per 1,000 commits", per_k, f"{args.commits} commits, {result.branches} branches, "
         f"{result.tags} tags"),
        ("RATIO rebuild / making the commits", statistics.median(times) / made, "same lineage"),
        ("rebuild s per GiB of store", per_gib, f"{store_gib:.2f} GiB in {big.packs} packs"),
    ]
    if restic is not None:
        rows.append(("RATIO rebuild / restic index rebuild from its packs", statistics.median(big_times) / restic,
                     "same bytes"))
    report("db rebuild from the store", rows, {"sizes": sizes, "rebuild_s": times, "big_rebuild_s": big_times,
                                                "restic_s": restic})


if __name__ == "__main__":
    main()
