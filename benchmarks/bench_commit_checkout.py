"""Commit-to-durable and checkout of a 1 GiB fp32 state, against peers in the same run.

Peers on the same data and disk: torch.save + fsync, torch.load(weights_only=True),
safetensors save + fsync / load, and the raw write + fsync of the same bytes (the floor).
Each measurement is the median of --repeat rounds (every peer once per round, in rotating
order, so drift of the shared machine falls on all alike); every ckptrepo commit goes into a
fresh repository, so no run profits from deduplication against an earlier one.

    python benchmarks/bench_commit_checkout.py [--gib 1.0] [--repeat 3] [--dir PATH]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import drop_caches, fsync_path, raw_write, report, scratch_dir, timed_rounds

import ckptrepo


def make_state(gib: float) -> dict[str, torch.Tensor]:
    """A model-like state: 16 fp32 matrices (trained-weight-like normal values) plus small biases."""
    torch.manual_seed(0)
    per = int(gib * (1 << 30)) // 16 // 4
    cols = 4096
    rows = per // cols
    state = {f"layers.{i}.weight": torch.randn(rows, cols) * 0.02 for i in range(16)}
    state.update({f"layers.{i}.bias": torch.zeros(cols) for i in range(16)})
    return state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir under /work)")
    ap.add_argument("--cold", action="store_true", help="drop the page cache before every read (root only)")
    args = ap.parse_args()
    with scratch_dir(args.dir) as base:
        run(base, args)


def run(base: Path, args: argparse.Namespace) -> None:
    state = make_state(args.gib)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    flat = torch.cat([t.reshape(-1) for t in state.values()])
    mib = nbytes / (1 << 20)
    print(f"state: {len(state)} tensors, {mib:.0f} MiB fp32; repeat={args.repeat}; dir={base}")

    pt = base / "state.pt"
    st_file = base / "state.safetensors"
    raw = base / "raw.bin"

    def torch_save() -> None:
        torch.save(state, pt)
        fsync_path(pt)

    def st_save() -> None:
        save_file(state, st_file)
        fsync_path(st_file)

    # Fresh, empty repositories made beforehand: the timing covers commit() to durable only.
    # blocking=True is the one-shot commit (no snapshot copy: the caller waits anyway).
    repos = iter([ckptrepo.Repo.init(base / f"repo{i}") for i in range(args.repeat)])

    def ckpt_commit() -> ckptrepo.Commit:
        repo = next(repos)
        try:
            return repo.commit(state, step=1, blocking=True).wait()
        finally:
            repo.close()

    saves, saved = timed_rounds({
        "raw": lambda: raw_write(raw, memoryview(flat.numpy()).cast("B")),
        "torch.save": torch_save,
        "safetensors": st_save,
        "commit": ckpt_commit,
    }, args.repeat)
    t_raw, t_save, t_st_save, t_commit = (saves[k] for k in ("raw", "torch.save", "safetensors", "commit"))
    commit = saved["commit"]
    last_repo = base / f"repo{args.repeat - 1}"
    for i in range(args.repeat - 1):
        shutil.rmtree(base / f"repo{i}", ignore_errors=True)

    def cold() -> None:
        if args.cold:
            drop_caches()

    def torch_load() -> None:
        cold()
        torch.load(pt, weights_only=True)

    def st_load() -> None:
        cold()
        load_file(st_file)

    repo = ckptrepo.Repo.open(last_repo)

    def ckpt_checkout() -> dict[str, torch.Tensor]:
        cold()
        return repo.checkout("main")  # type: ignore[no-any-return]

    loads, loaded = timed_rounds({"torch.load": torch_load, "safetensors": st_load, "checkout": ckpt_checkout},
                                 args.repeat)
    t_load, t_st_load, t_checkout = (loads[k] for k in ("torch.load", "safetensors", "checkout"))
    restored = loaded["checkout"]
    ok = all(torch.equal(restored[k], v) for k, v in state.items())
    stats = repo.stats()
    repo.close()
    if not ok:
        raise SystemExit("checkout did not restore the committed state bit-exactly")

    report(
        f"commit/checkout of {mib:.0f} MiB fp32 (median of {args.repeat}; seconds, then ratios)",
        [
            ("raw write+fsync (floor)", t_raw, f"{mib / t_raw:8.0f} MiB/s"),
            ("torch.save+fsync", t_save, f"{mib / t_save:8.0f} MiB/s"),
            ("safetensors save+fsync", t_st_save, f"{mib / t_st_save:8.0f} MiB/s"),
            ("ckptrepo commit (durable)", t_commit, f"{mib / t_commit:8.0f} MiB/s"),
            ("torch.load", t_load, f"{mib / t_load:8.0f} MiB/s"),
            ("safetensors load", t_st_load, f"{mib / t_st_load:8.0f} MiB/s"),
            ("ckptrepo checkout", t_checkout, f"{mib / t_checkout:8.0f} MiB/s"),
            ("RATIO commit / torch.save+fsync", t_commit / t_save, "goal <= 1.5"),
            ("RATIO commit / raw write", t_commit / t_raw, ""),
            ("RATIO checkout throughput / torch.load", t_load / t_checkout, "goal >= 1.0"),
            ("RATIO stored / logical bytes", stats.stored_bytes / max(1, stats.logical_bytes), ""),
        ],
        {"cold": args.cold, "mib": mib, "new_bytes": commit.new_bytes, "stored_bytes": commit.stored_bytes},
    )


if __name__ == "__main__":
    main()
