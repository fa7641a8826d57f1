"""Distributed commits and loads on spawned gloo ranks (CPU) against DCP's own FileSystemWriter/Reader.

The state is an FSDP2 model (an embedding, residual MLP blocks and an output head: the GPT-2
vocabulary of 50,257 x 192, so the embedding and head weights are 36.8 MiB each and their
shard edges do not fall on the 1 MiB chunk grid) with AdamW, trained two steps so the moments
exist: ~20M parameters, 228 MiB with both moments in fp32, half on each of 2 ranks
(``--quick``: ~22 MB, one round). Each rank runs one torch thread (two ranks on two cores) and
ckptrepo's default workers; the background repack between commits is off
(``CKPT_IDLE_REPACK=0``) as it would run while the peers are measured, so commits store new
chunks raw and their encoding is left to ``repack`` (``bench_async_commit.py`` times it).

Every figure is a ratio against a peer measured in the same run, on the same data, in the same
rounds, the order of ckptrepo and its peer alternating from round to round; medians over
rounds. A measurement starts on every rank after a barrier once other processes leave the
machine alone (CPU and disk writes of everything but this run's processes), its time is that of
the slowest rank, and it is run again (``--retries``) when others took more than
``--max-foreign`` of the CPU or wrote more than ``--max-write`` MiB/s meanwhile. Goals are
judged on the median over rounds of each round's ratio (the ratio of the medians is shown too).

1. ``dcp.save(get_state_dict(model, opt), storage_writer=ckptrepo.dcp.Writer(repo))`` vs
   ``FileSystemWriter(dir)`` (``sync_files=True``; it fsyncs its files but not the directory,
   which ckptrepo does: that fsync is shown, not added): the call's wall time; (a) the first
   commit into a fresh repository vs a fresh directory, (b) after a training step (every tensor
   changed) into a repository holding the previous commits vs a new directory. Goal <= 1.
2. ``dcp.async_save`` with each writer after a training step: the call's return (blocking),
   goal <= 1, and its future's result (done). DCP stages with its default stager for the
   Writer, and through FileSystemWriter's own staging (a BlockingAsyncStager) for the peer.
3. ``repo.commit({"model": model, "optim": opt})`` on every rank (a state holding DTensors:
   one commit of every rank's shards) until it returns its handle vs a copy of the same rank's
   local shards into preallocated buffers (the floor of any snapshot), after a training step
   each; goal <= 1.3. Time to durable (``handle.wait()``) is shown.
4. A replicated state: the model's and optimizer's full state dicts as plain tensors, equal on
   both ranks (what DDP holds), saved through the Writer into a fresh repository: bytes sent to
   storage by the busiest rank (``/proc/self/io`` ``write_bytes - cancelled_write_bytes`` of
   its process, all threads, around the call: packs, and on the coordinator the database) over
   the commit's logical bytes; goal <= 0.6. FileSystemWriter's figure is shown.
5. The 2-rank commit's state re-committed from one process (rank 0 gathers the full state and
   commits it with ``repo.commit(..., blocking=True)`` as plain tensors): ``Commit.new_bytes``
   over logical bytes, for the tensors >= 32 MiB (committed on their own first: only chunks
   straddling a shard edge can be new), goal <= 5%; then the whole state's, shown.
6. ``dcp.load`` at another world size: the checkpoints of the last step saved at 2 ranks,
   loaded at 1 (one process, no process group, ``no_dist=True``, into a plain model's state
   dicts), and a 1-process save loaded at 2 (into a fresh FSDP2 model), from
   ``ckptrepo.dcp.Reader(repo, rev)`` vs ``FileSystemReader(dir)`` of the FileSystemWriter
   checkpoint of the same state; both loads are checked equal and warm the page cache first;
   goal <= 1.2.

    python benchmarks/bench_distributed.py [--rounds 3] [--quick] [--dir PATH]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _dist_ranks as ranks
from _common import goal_note, report, scratch_dir

MIB = 1 << 20
WORLD = 2


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def paired(num: list[float], den: list[float]) -> tuple[float, float, float]:
    """Median, min and max over rounds of each round's ratio."""
    ratios = [a / b for a, b in zip(num, den, strict=True) if b > 0]
    return (med(ratios), min(ratios), max(ratios)) if ratios else (float("nan"),) * 3


def run(base: Path, args: argparse.Namespace) -> None:
    import torch

    quick = args.quick
    cfg: dict[str, Any] = {
        "base": str(base), "rounds": args.rounds,
        "vocab": 4001 if quick else 50257, "dim": 192, "hidden": 384 if quick else 768, "blocks": 2,
        "big": (2 if quick else 32) * MIB,
        "max_foreign": args.max_foreign, "max_write": args.max_write, "retries": args.retries,
        "quiet_timeout": args.quiet_timeout,
    }
    print(f"bench_distributed  {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC  {ranks.cpu_model()}, "
          f"{os.cpu_count()} cores; torch {torch.__version__}, Python {platform.python_version()}; "
          f"world size {WORLD} (spawned gloo ranks, 1 torch thread each); "
          f"CKPT_WORKERS={os.environ.get('CKPT_WORKERS') or 'all cores'}; rounds={args.rounds}; dir={base}",
          flush=True)
    started = time.monotonic()
    print("phase save (2 ranks): items 1-5", flush=True)
    save = ranks.start("save", WORLD, cfg)
    print("phase load1 (1 process, no process group): load the 2-rank checkpoints; save at 1", flush=True)
    load1 = ranks.start("load1", 1, {**cfg, "steady": save["steady"], "saved_rev": save["saved_rev"],
                                     "fs2": save["fs2"]})
    print("phase load2 (2 ranks): load the 1-process checkpoints", flush=True)
    load2 = ranks.start("load2", WORLD, {**cfg, "steady": save["steady"], "rev1": load1["rev1"], "fs1": load1["fs1"]})
    elapsed = time.monotonic() - started

    s = {**save["samples"], **load1["samples"], **load2["samples"]}
    m = {k: med(v) for k, v in s.items()}
    info, single = save["info"], save["single"]
    logical = info["logical"]
    foreign = save["foreign"] + load1["foreign"] + load2["foreign"]
    foreign_w = save["foreign_write"] + load1["foreign_write"] + load2["foreign_write"]
    thrown = save["thrown"] + load1["thrown"] + load2["thrown"]
    waited = save["waited"] + load1["waited"] + load2["waited"]
    print(f"  other processes took {100 * med(foreign):.0f}% of the CPU and wrote {med(foreign_w):.0f} MiB/s "
          f"(medians over kept measurements; max {100 * max(foreign):.0f}%, {max(foreign_w):.0f} MiB/s); "
          f"{thrown} measurements run again (over {100 * args.max_foreign:.0f}% or {args.max_write:g} MiB/s); "
          f"{waited:.0f} s spent waiting for a quiet machine; {elapsed / 60:.1f} min in all", flush=True)

    def ratio_row(name: str, num: str, den: str, goal: float | None, what: str = "") -> tuple[str, float, str]:
        r, lo, hi = paired(s[num], s[den])
        note = goal_note(r, goal) + "; " if goal is not None else ""
        return (name, r, f"{note}per round {lo:.2f}-{hi:.2f}, ratio of medians {m[num] / m[den]:.2f}"
                         + (f"; {what}" if what else ""))

    rep_fraction = [b / lg for b, lg in zip(s["rep_ckpt_busiest"], s["rep_ckpt_logical"], strict=True)]
    rep_fs_fraction = [b / save["rep_bytes"] for b in s["rep_fs_busiest"]]
    big_fraction = single["big_new"] / single["big_logical"]
    # The whole state's new chunks: those of the large tensors' commit plus those the second
    # commit (every tensor) added beyond it.
    all_fraction = (single["big_new"] + single["all_new"]) / single["all_logical"]
    ranks_written = ", ".join(f"rank {i} {m[f'rep_ckpt_rank{i}'] / MIB:.0f}" for i in range(WORLD))
    ranks_written_fs = ", ".join(f"rank {i} {m[f'rep_fs_rank{i}'] / MIB:.0f}" for i in range(WORLD))
    rss = [x / MIB for x in save["peak_rss"]]
    rss_load = [x / MIB for x in load1["peak_rss"] + load2["peak_rss"]]
    rows = [
        ("dcp.save Writer, fresh repository", m["fresh_ckpt_t"], "s  (the first commit into it)"),
        ("dcp.save FileSystemWriter, fresh dir", m["fresh_fs_t"],
         f"s  (its directory fsync, not included: {m['fresh_fs_dirsync']:.3f} s)"),
        ("dcp.save Writer, after a step", m["steady_ckpt_t"], "s  (every tensor changed; the repository holds "
                                                             "the earlier commits)"),
        ("dcp.save FileSystemWriter, after a step", m["steady_fs_t"], "s  (a new directory)"),
        ("dcp.async_save block, Writer", m["async_ckpt_block"], "s  (DCP's default stager)"),
        ("dcp.async_save block, FileSystemWriter", m["async_fs_block"], "s  (its own staging)"),
        ("dcp.async_save -> done, Writer", m["async_ckpt_done"], "s"),
        ("dcp.async_save -> done, FileSystemWriter", m["async_fs_done"], "s"),
        ("Repo.commit() on every rank, blocked", m["native_block"],
         f"s  (its Commit.stall_s {m['native_stall_s']:.3f} s, persist_s {m['native_persist_s']:.3f} s; "
         f"new_bytes {m['native_new'] / MIB:.0f} MiB)"),
        ("copy of the local shards (floor)", m["floor_t"],
         f"s  {max(info['local']) / MIB / m['floor_t']:.0f} MiB/s into preallocated buffers"),
        ("Repo.commit() -> durable", m["native_durable"], "s  (handle.wait() returned, slowest rank)"),
        ("replicated: busiest rank wrote, Writer", m["rep_ckpt_busiest"] / MIB,
         f"MiB of {save['rep_bytes'] / MIB:.0f} MiB logical ({ranks_written}); dcp.save {m['rep_ckpt_t']:.2f} s"),
        ("replicated: busiest rank wrote, FileSystemWriter", m["rep_fs_busiest"] / MIB,
         f"MiB ({ranks_written_fs}); dcp.save {m['rep_fs_t']:.2f} s"),
        (f"1-process re-commit: new, tensors >= {cfg['big'] // MIB} MiB", single["big_new"] / MIB,
         f"MiB of {single['big_logical'] / MIB:.0f} MiB ({single['big_n']} tensors)"),
        ("1-process re-commit: new, whole state", (single["big_new"] + single["all_new"]) / MIB,
         f"MiB of {single['all_logical'] / MIB:.0f} MiB (tensors under 1 MiB are one chunk, which a shard "
         "edge splits)"),
        ("dcp.load 2 -> 1, Reader", m["load21_ckpt_t"], "s  (no process group)"),
        ("dcp.load 2 -> 1, FileSystemReader", m["load21_fs_t"], "s"),
        ("dcp.load 1 -> 2, Reader", m["load12_ckpt_t"], "s  (slowest rank)"),
        ("dcp.load 1 -> 2, FileSystemReader", m["load12_fs_t"], "s"),
        ("peak RSS per rank, phase save", max(rss), f"MiB  (ranks {', '.join(f'{x:.0f}' for x in rss)}; "
         f"load phases {', '.join(f'{x:.0f}' for x in rss_load)} MiB)"),
        ratio_row("RATIO dcp.save Writer / FileSystemWriter, fresh", "fresh_ckpt_t", "fresh_fs_t", 1.0),
        ratio_row("RATIO dcp.save Writer / FileSystemWriter, after a step", "steady_ckpt_t", "steady_fs_t", 1.0),
        ratio_row("RATIO async_save block Writer / FileSystemWriter", "async_ckpt_block", "async_fs_block", 1.0),
        ratio_row("RATIO async_save done Writer / FileSystemWriter", "async_ckpt_done", "async_fs_done", None,
                  "not a goal"),
        ratio_row("RATIO commit() blocked / copy floor", "native_block", "floor_t", 1.3),
        ratio_row("RATIO commit() durable / dcp.save FileSystemWriter", "native_durable", "steady_fs_t", None,
                  "after a step each; not a goal"),
        ("RATIO replicated: busiest rank's bytes / commit's", med(rep_fraction),
         goal_note(med(rep_fraction), 0.6) + f"; FileSystemWriter {med(rep_fs_fraction):.2f}"),
        (f"RATIO 1-process re-commit new / logical, >= {cfg['big'] // MIB} MiB", big_fraction,
         goal_note(big_fraction, 0.05) + f"; whole state {all_fraction:.3f}"),
        ratio_row("RATIO dcp.load 2 -> 1 Reader / FileSystemReader", "load21_ckpt_t", "load21_fs_t", 1.2),
        ratio_row("RATIO dcp.load 1 -> 2 Reader / FileSystemReader", "load12_ckpt_t", "load12_fs_t", 1.2),
    ]
    report(f"distributed commits and loads, {logical / MIB:.0f} MiB FSDP2 + AdamW on {WORLD} gloo ranks "
           f"(median of {args.rounds} rounds; seconds, MiB, then ratios)", rows,
           {"mib": logical / MIB, "world": WORLD, "rounds": args.rounds, "cpu": ranks.cpu_model(),
            "cpus": os.cpu_count(), "torch": torch.__version__, "config": cfg, "state": info,
            "replicated_bytes": save["rep_bytes"], "single": single, "samples": s,
            "peak_rss": {"save": save["peak_rss"], "load1": load1["peak_rss"], "load2": load2["peak_rss"]},
            "foreign_cpu": foreign, "foreign_write_mib_s": foreign_w, "thrown": thrown, "waited_s": waited,
            "minutes": elapsed / 60})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=None, help="rounds of every measurement (default 5; --quick 1)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: a ~22 MB state, 1 round")
    ap.add_argument("--dir", type=Path, default=None, help="where repositories go (default: a temp dir under /work)")
    ap.add_argument("--max-foreign", type=float, default=0.10,
                    help="run a measurement again when other processes took more than this share of the CPU (0.10)")
    ap.add_argument("--max-write", type=float, default=20.0,
                    help="... or when they wrote more than this many MiB/s to disk (default 20)")
    ap.add_argument("--retries", type=int, default=2, help="at most this many re-runs per measurement (default 2)")
    ap.add_argument("--quiet-timeout", type=float, default=30.0,
                    help="seconds to wait for a quiet machine before each measurement (default 30)")
    args = ap.parse_args()
    args.rounds = args.rounds if args.rounds is not None else (1 if args.quick else 5)
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    with scratch_dir(args.dir) as base:
        run(base, args)


if __name__ == "__main__":
    main()
