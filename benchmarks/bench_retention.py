"""Retention that keeps the lineage: ``prune`` then ``gc`` on a 2,000-commit lineage, against the
old way of freeing space (delete branches, then ``gc``) on a copy of the same repository.

The lineage is made through the real commit path (blocking commits, deltas on, 4 KiB chunks):
``main`` and four branches forking from it (``--commits`` in all, about a fifth on each branch
after the fork), every commit a small model (8 tensors of 64x64 fp32, 2 of them moved a little
from the parent's, so chunks deduplicate and deltas pay), its ``step`` and a ``val_loss`` that
falls with noise. The repository is then copied:

- **prune**: ``prune(keep_last=50, keep_every=100, keep_best="val_loss:5")`` timed (keep_last is
  ``--commits`` / 40: 50 at 2,000 commits), then the
  ``gc(grace=0)`` that frees what only pruned commits used; bytes freed and their fraction of
  the pack bytes; every commit kept restores (checked on a sample) and ``verify`` is clean.
- **delete branches** (the peer): the four side branches deleted, then ``gc(grace=0)`` timed.

The figure compared is seconds per commit whose data goes: (prune + gc) / commits pruned against
gc / commits removed by deleting branches. The branch way cannot free main's old commits at all
(main is kept whole), which is what prune is for; the bytes each way frees are printed beside.

    python benchmarks/bench_retention.py [--commits 2000] [--repeat 3] [--quick]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _common import goal_note, report

import ckptrepo

CHUNK = 4096
BRANCHES = 4


def _pack_bytes(repo: ckptrepo.Repo) -> int:
    return sum(p.stat().st_size for p in (repo.repo_dir / "store" / "packs").rglob("*.pack"))


def build(path: Path, n: int) -> tuple[float, dict[str, dict[str, torch.Tensor]]]:
    """The lineage of ``n`` commits (see the module docstring); returns the seconds its commits
    took and a sample of states by commit id (for the restore check)."""
    g = torch.Generator().manual_seed(0)
    names = [f"layers.{i}.weight" for i in range(8)]
    per_branch = n // (BRANCHES + 1)
    main_n = n - BRANCHES * per_branch
    forks = [main_n * (b + 1) // (BRANCHES + 2) for b in range(BRANCHES)]
    sample: dict[str, dict[str, torch.Tensor]] = {}
    started = time.perf_counter()
    with ckptrepo.Repo.init(path, chunk_size=CHUNK) as repo:
        state = {name: torch.randn(64, 64, generator=g) for name in names}
        at_fork: dict[int, tuple[str, dict[str, torch.Tensor]]] = {}

        def step_on(state: dict[str, torch.Tensor], step: int, branch: str) -> tuple[str, dict[str, torch.Tensor]]:
            state = dict(state)
            for name in (names[step % 8], names[(step * 3 + 1) % 8]):
                state[name] = state[name] + 1e-3 * torch.randn(64, 64, generator=g)
            loss = 2.0 / (1 + step / 200) + 0.05 * float(torch.rand(1, generator=g))
            c = repo.commit(state, branch=branch, step=step, metrics={"val_loss": loss}, blocking=True).wait()
            if step % 97 == 0:
                sample[c.id] = state
            return c.id, state

        for step in range(main_n):
            cid, state = step_on(state, step, "main")
            if step in forks:
                at_fork[step] = (cid, state)
        for b, fork in enumerate(forks):
            cid, bstate = at_fork[fork]
            repo.branch(f"b{b}", at=cid)
            for i in range(per_branch):
                _, bstate = step_on(bstate, fork + 1 + i, f"b{b}")
    return time.perf_counter() - started, sample


def prune_way(path: Path, keep_last: int, sample: dict[str, dict[str, torch.Tensor]],
              check: bool) -> tuple[float, float, Any, Any, int, int]:
    """prune + gc on the repository at ``path``: (prune s, gc s, prune report, gc report, pack
    bytes before, after); with ``check``, kept commits of the sample restore and verify is clean."""
    with ckptrepo.Repo.open(path) as repo:
        before = _pack_bytes(repo)
        t0 = time.perf_counter()
        pr = repo.prune(keep_last=keep_last, keep_every=100, keep_best="val_loss:5")
        t1 = time.perf_counter()
        gc = repo.gc(grace=0)
        t2 = time.perf_counter()
        after = _pack_bytes(repo)
        if check:
            kept = {c.id for c in repo.log() if not c.pruned}
            for cid, state in sample.items():
                if cid in kept:
                    got = repo.checkout(cid)
                    assert all(torch.equal(got[k], v) for k, v in state.items()), cid
            assert repo.verify().ok
    return t1 - t0, t2 - t1, pr, gc, before, after


def branch_way(path: Path) -> tuple[float, Any, int, int]:
    """The peer: delete the side branches, then gc: (gc s, gc report, pack bytes before, after)."""
    with ckptrepo.Repo.open(path) as repo:
        before = _pack_bytes(repo)
        for b in range(BRANCHES):
            repo.delete_branch(f"b{b}", force=True)
        t0 = time.perf_counter()
        old = repo.gc(grace=0)
        seconds = time.perf_counter() - t0
        return seconds, old, before, _pack_bytes(repo)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3, help="rounds, each on fresh copies (alternating order)")
    ap.add_argument("--quick", action="store_true", help="300 commits, one round")
    args = ap.parse_args()
    n, repeat = (300, 1) if args.quick else (args.commits, args.repeat)
    new_s: list[float] = []
    old_s: list[float] = []
    prune_s: list[float] = []
    gc_s: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-retention-") as tmp:
        base = Path(tmp)
        made, sample = build(base / "built", n)
        print(f"{n} commits made in {made:.1f} s")
        for r in range(repeat):
            shutil.copytree(base / "built", base / f"prune{r}")
            shutil.copytree(base / "built", base / f"branches{r}")
            for way in (("prune", "branches") if r % 2 == 0 else ("branches", "prune")):
                if way == "prune":
                    p_s, g_s, pr, gc, before, after = prune_way(base / f"prune{r}", n // 40, sample, check=r == 0)
                    prune_s.append(p_s)
                    gc_s.append(g_s)
                    new_s.append((p_s + g_s) / len(pr.pruned))
                else:
                    o_s, old, before_b, after_b = branch_way(base / f"branches{r}")
                    old_s.append(o_s / old.commits_removed)
            shutil.rmtree(base / f"prune{r}")
            shutil.rmtree(base / f"branches{r}")

    n_pruned, n_removed = len(pr.pruned), old.commits_removed
    ratio = statistics.median(new_s) / statistics.median(old_s)
    rows = [
        ("commits", float(n), f"main and {BRANCHES} branches, made in {made:.1f} s; {repeat} rounds, medians"),
        ("prune s", statistics.median(prune_s), f"{n_pruned} pruned, {pr.kept} kept ({dict(pr.kept_by)})"),
        ("gc after prune s", statistics.median(gc_s),
         f"{gc.chunks_removed} chunks, {gc.pruned_tensors_dropped} chunk lists dropped"),
        ("freed MiB (prune + gc)", gc.bytes_freed / 2**20,
         f"{100 * gc.bytes_freed / before:.1f}% of {before / 2**20:.1f} MiB of packs; prune's estimate "
         f"{pr.freeable_pack_bytes / 2**20:.2f} MiB whole packs, {pr.freeable_bytes / 2**20:.2f} MiB of chunks"),
        ("gc after deleting the branches s", statistics.median(old_s) * n_removed, f"{n_removed} commits removed"),
        ("freed MiB (delete branches + gc)", old.bytes_freed / 2**20,
         f"{100 * old.bytes_freed / before_b:.1f}% of the packs"),
        ("RATIO (prune + gc) / gc after deleting branches, s per commit dropped", ratio, goal_note(ratio, 2.0)),
        ("RATIO store freed, prune / delete branches", (before - after) / max(1, before_b - after_b),
         "prune also thins main, which deleting branches cannot"),
    ]
    report("retention: prune + gc against deleting branches + gc", rows,
           {"pruned": n_pruned, "removed": n_removed, "freed_fraction": gc.bytes_freed / before,
            "rounds": {"prune_gc_s_per_commit": new_s, "branches_gc_s_per_commit": old_s}})


if __name__ == "__main__":
    main()
