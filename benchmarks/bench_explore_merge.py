"""Weight-space merge of two ~500 MB fp32 models (``Repo.merge_weights``, method ``average``) against
a plain torch merge of the same data: time and peak memory.

Setup, outside every measurement: model A, 85 fp32 tensors of a 12-layer transformer's shapes
(a 50,000 x 768 embedding, attention and MLP matrices, biases, norms: 470 MiB), and B, a
fine-tune of it (every tensor moved by small noise), committed to a fresh repository as a
fine-tune is (B a child of A, on its own branch: its chunks are deltas against A's), and the
same tensors written to two safetensors files.

Peers, each in a fresh subprocess of its own every round, rounds in alternating order:

- ckpt: ``Repo.open`` + ``merge_weights([A, B], method="average")``: reads both commits' chunks
  (every chunk verified), merges a tensor at a time and commits the result, durable (packs
  fsynced) when it returns.
- torch: ``safetensors.torch.load_file`` of both files, ``(a + b) / 2`` per tensor in fp32,
  ``save_file`` of the result and its fsync (durable, as the commit is: the peers of every
  benchmark here save durably, e.g. ``torch.save + fsync`` in ``bench_commit_checkout.py``).
  Without the fsync it is reported too, for context.

Each child reports the wall time of that work (its imports, ``torch``, ``safetensors`` and the
ckptrepo modules a merge uses, are before the clock starts) and its peak resident memory: ``VmHWM``
of ``/proc/self/status`` at its end, the whole process (interpreter and imports included), minus
nothing. Between rounds the merge's branch is deleted and ``gc(grace=0)`` frees its chunks, so
every round stores them anew.
Goals: time ckpt / torch <= 1.0; peak RSS ckpt / torch <= 0.5.

    python benchmarks/bench_explore_merge.py [--quick] [--rounds 5] [--dir PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bootstrap, fsync_path, goal_note, report, scratch_dir, wait_quiet

LAYERS, HIDDEN, VOCAB = 12, 768, 50_000


def make_models(layers: int, vocab: int) -> tuple[dict[str, object], dict[str, object]]:
    """A (trained-weight-like values) and B (A plus fine-tune-sized noise on every tensor)."""
    import torch

    g = torch.Generator().manual_seed(0)
    h = HIDDEN
    shapes: dict[str, tuple[int, ...]] = {"embed.weight": (vocab, h)}
    for i in range(layers):
        p = f"layers.{i}."
        shapes.update({p + "attn.qkv.weight": (3 * h, h), p + "attn.qkv.bias": (3 * h,),
                       p + "attn.out.weight": (h, h), p + "mlp.fc1.weight": (4 * h, h), p + "mlp.fc1.bias": (4 * h,),
                       p + "mlp.fc2.weight": (h, 4 * h), p + "norm.weight": (h,)})
    a = {name: torch.randn(shape, generator=g) * 0.02 for name, shape in shapes.items()}
    b = {name: t + torch.randn(t.shape, generator=g) * 2e-4 for name, t in a.items()}
    return a, b  # type: ignore[return-value]


def setup(base: Path, quick: bool) -> int:
    """The repository (A on main, B on ft) and the two safetensors files; returns the model's bytes."""
    import torch
    from safetensors.torch import save_file

    import ckptrepo

    a, b = make_models(4 if quick else LAYERS, 10_000 if quick else VOCAB)
    with ckptrepo.Repo.init(base / "repo") as repo:
        first = repo.commit(a, message="A", blocking=True).wait()
        repo.branch("ft", first.id)
        repo.commit(b, branch="ft", message="B: fine-tuned from A", blocking=True).wait()
    save_file(a, str(base / "a.safetensors"))  # type: ignore[arg-type]
    save_file(b, str(base / "b.safetensors"))  # type: ignore[arg-type]
    return sum(t.numel() * t.element_size() for t in a.values() if isinstance(t, torch.Tensor))


def _peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(kind: str, base: Path, branch: str) -> None:
    """One measured run, in this fresh process: prints ``{"seconds", "peak_rss_mib"}``."""
    import torch

    if kind == "ckpt":
        import ckptrepo
        import ckptrepo.chunks.tensors
        import ckptrepo.explore.merging
        import ckptrepo.ingest.writer
        import ckptrepo.repository  # imports before the clock, as the peer's

        start = time.perf_counter()
        repo = ckptrepo.Repo.open(base / "repo")
        repo.merge_weights(["main", "ft"], method="average", branch=branch)
        seconds = time.perf_counter() - start
        repo.close()
    else:
        from safetensors.torch import load_file, save_file

        start = time.perf_counter()
        a = load_file(str(base / "a.safetensors"))
        b = load_file(str(base / "b.safetensors"))
        out = {k: ((a[k].to(torch.float32) + b[k].to(torch.float32)) / 2).to(a[k].dtype) for k in a}
        save_file(out, str(base / "out.safetensors"))
        unsynced = time.perf_counter() - start
        fsync_path(base / "out.safetensors")
        seconds = time.perf_counter() - start
        print(json.dumps({"seconds": seconds, "unsynced": unsynced, "peak_rss_mib": _peak_rss_mib()}))
        return
    print(json.dumps({"seconds": seconds, "peak_rss_mib": _peak_rss_mib()}))


def _spawn(kind: str, base: Path, branch: str) -> dict[str, float]:
    (base / "out.safetensors").unlink(missing_ok=True)  # no peer waits for the last one's writeback
    os.sync()
    wait_quiet(0.15)
    done = subprocess.run([sys.executable, __file__, "--child", kind, "--dir", str(base), "--branch", branch],
                          check=True, capture_output=True, text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _forget(base: Path, branch: str) -> None:
    """Delete the merge's branch and free what only it held, so the next round stores it again."""
    import ckptrepo

    with ckptrepo.Repo.open(base / "repo") as repo:
        repo.delete_branch(branch, force=True)
        repo.gc(grace=0)


def run(quick: bool, rounds: int | None = None, parent: Path | None = None) -> list[tuple[str, float, str]]:
    """The benchmark's rows (name, value, note): each peer's median time and peak RSS, the ratios
    and whether they meet their goals."""
    rounds = rounds or (1 if quick else 5)
    with scratch_dir(parent) as base:
        nbytes = setup(base, quick)
        runs: dict[str, list[dict[str, float]]] = {"ckpt": [], "torch": []}
        for r in range(rounds):
            for kind in (("ckpt", "torch") if r % 2 == 0 else ("torch", "ckpt")):
                runs[kind].append(_spawn(kind, base, f"merged-{r}"))
                if kind == "ckpt":
                    _forget(base, f"merged-{r}")
    t = {k: statistics.median(x["seconds"] for x in v) for k, v in runs.items()}
    lo, hi = bootstrap(lambda idx: statistics.median(runs["ckpt"][i]["seconds"] for i in idx)
                       / statistics.median(runs["torch"][i]["seconds"] for i in idx), rounds, random.Random(0))
    m = {k: statistics.median(x["peak_rss_mib"] for x in v) for k, v in runs.items()}
    mib = nbytes / (1 << 20)
    spread = {k: f"rounds {min(x['seconds'] for x in v):.2f}-{max(x['seconds'] for x in v):.2f} s"
              for k, v in runs.items()}
    return [
        ("model MiB (fp32, each)", mib, f"{rounds} round(s), each peer in a fresh process"),
        ("ckpt merge_weights s", t["ckpt"], spread["ckpt"] + "; reads both commits, commits the result durably"),
        ("torch load+average+save+fsync s", t["torch"], spread["torch"] + "; safetensors load_file x2, save_file"),
        ("  the same without fsync s", statistics.median(x["unsynced"] for x in runs["torch"]), "(context)"),
        ("time ckpt / torch", t["ckpt"] / t["torch"],
         goal_note(t["ckpt"] / t["torch"], 1.0) + f"  [{lo:.2f}, {hi:.2f}] (95% bootstrap over rounds)"),
        ("ckpt peak RSS MiB", m["ckpt"], "VmHWM of the child, imports included"),
        ("torch peak RSS MiB", m["torch"], "VmHWM of the child, imports included"),
        ("peak RSS ckpt / torch", m["ckpt"] / m["torch"], goal_note(m["ckpt"] / m["torch"], 0.5)),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a ~90 MiB model, one round")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir under /work)")
    ap.add_argument("--child", choices=("ckpt", "torch"), help=argparse.SUPPRESS)
    ap.add_argument("--branch", default="merged", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.dir, args.branch)
        return
    rows = run(args.quick, args.rounds, args.dir)
    report("weight-space merge of two fp32 models (average)", rows)
    for name, value, note in rows:
        if "/" in name:
            print(f"RATIO {name} = {value:.3f}  {note}")


if __name__ == "__main__":
    main()
