"""CPU time of one asynchronous commit of the training benchmark's state, by thread, against the
machine's own speeds for the work it cannot avoid.

On cores a CPU training job keeps busy, what a commit costs the loop is, to first order, the
CPU its background threads take (docs/benchmarks.md, training overhead). This script commits the
117 MiB state of ``_training.py`` (a few steps in, AdamW moments filled) ``--commits`` times
on an otherwise idle machine, each time after nudging every tensor so that nothing
deduplicates, as in training, and reads every thread's CPU time from
``/proc/self/task/*/schedstat`` (nanoseconds) before ``commit()``, when it returns and after
``wait()``: the CPU of the call (phase 1, while a training loop would wait) and the CPU after it
(phase 2, which a training loop's cores pay for). Threads are grouped by role from their names:
the caller (``MainThread``: flatten and the snapshot copy), torch's intra-op threads (a copy
by torch's kernel on the other cores; after the call, their spinning), the committer (phase
2: lookups, indexing, the transaction), the workers (in the call: the copy's second thread;
after it: BLAKE3, and the chunk statistics the copy did not take) and the write-ahead. The CPU
the rest of the machine took over the same span (``/proc/stat``, in clock ticks) is printed too:
kernel threads writing back and completing the commit's I/O do not show in the process's CPU.

With ``--prefill N`` the repository first receives N commits, on a branch of their own, of a
state with the same tensor names and dtypes but at most 256 elements each: the catalog then
holds as many rows as after N commits of the real state (one chunk per tensor instead of a
few for the largest), while the packs stay small. A training run's later commits pay for
catalog indexes of that size: inserting a commit's rows dirties about one page per row in
each index that takes them at random places (those over chunk and tensor ids, and the entry
runs by tensor name), and SQLite writes every dirtied page to its log and again at its
checkpoint. The committer's bytes written (``/proc/self/task/*/io``: the pages of the
catalog and its log; the pack bytes are written by the write-ahead threads) show that.
The peers, measured in the same run on the same bytes: BLAKE3 of every chunk on one thread
(the ``blake3`` package, as ckptrepo calls it), the statistics' pass (``moments_of_bytes``)
and a one-thread copy. Their sum is the least CPU a content-addressed commit with statistics
spends; the script prints the commit's background CPU as a multiple of it.

    python benchmarks/bench_commit_cpu.py [--commits 20] [--prefill N] [--dir PATH]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import blake3
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report, scratch_dir
from _training import Trainer, add_model_args, prefill

import ckptrepo
from ckptrepo import state as st
from ckptrepo.chunks.chunker import chunk_spans
from ckptrepo.db import pending as layouts
from ckptrepo.ingest.spare import read_cpu_times
from ckptrepo.ingest.stats import moments_of_bytes
from ckptrepo.testing import parts

ROLES = ("caller", "torch intra-op", "committer", "workers", "write-ahead", "other")


def role_of(name: str | None) -> str:
    """The role of a thread from its Python name (None: a thread Python did not start)."""
    if name is None:
        return "torch intra-op"
    if name == "MainThread":
        return "caller"
    for prefix, role in (("ckpt-commit", "committer"), ("ckpt-ahead", "write-ahead"), ("ckpt_", "workers")):
        if name.startswith(prefix):
            return role
    return "other"


def per_thread(name: str, parse: Callable[[str], int]) -> dict[int, int]:
    """``parse`` of ``/proc/self/task/<tid>/<name>`` for every thread of this process, by
    native id (threads that ended meanwhile, or whose file does not parse, are left out)."""
    out: dict[int, int] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/{name}") as f:
                out[int(tid)] = parse(f.read())
        except (OSError, ValueError, IndexError, StopIteration):
            continue
    return out


def thread_cpu_ns() -> dict[int, int]:
    """CPU nanoseconds of every thread of this process, by native id."""
    return per_thread("schedstat", lambda text: int(text.split()[0]))


def thread_written() -> dict[int, int]:
    """Bytes every thread of this process has passed to write calls (``wchar``), by native id."""
    return per_thread("io", lambda text: next(int(line.split()[1]) for line in text.splitlines()
                                              if line.startswith("wchar")))


def by_role(before: dict[int, int], after: dict[int, int]) -> dict[str, int]:
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, int] = collections.Counter()
    for tid, ns in after.items():
        out[role_of(names.get(tid))] += ns - before.get(tid, 0)
    return out


_NUDGE = 3e-4


def nudge(trainer: Trainer) -> None:
    """Change every floating-point tensor of the state a little (a training step would).

    By another step than ``prefill``'s 1e-3: with the same one, the state's small tensors (at
    most 256 elements, whole in the prefill's copies) took the values of the prefill commits
    bit for bit, one per commit, so their chunks deduplicated against the catalog instead of
    being new, as a training step's are."""
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(_NUDGE)
        for s in trainer.opt.state.values():
            for v in s.values():
                if isinstance(v, torch.Tensor) and v.is_floating_point():
                    v.add_(_NUDGE)


def peers(trainer: Trainer, chunk_size: int) -> dict[str, float]:
    """Seconds, on one thread, for BLAKE3 of every chunk, the statistics' pass and a copy."""
    flat = st.flatten(trainer.state)
    staged = {k: v.detach().clone() for k, v in flat.tensors.items()}
    views = [(st.tensor_bytes(t), t.dtype, t.element_size()) for t in staged.values()]
    chunks = [(view[o:o + n], dtype) for view, dtype, size in views
              for o, n in chunk_spans(len(view), size, chunk_size)]
    dst = {k: torch.empty_like(v) for k, v in staged.items()}
    threads = torch.get_num_threads()

    def copy() -> None:
        for k, v in staged.items():
            dst[k].copy_(v)

    def best(fn: Callable[[], object], repeat: int = 5) -> float:
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    torch.set_num_threads(1)
    try:
        return {
            "blake3": best(lambda: [blake3.blake3(raw).digest() for raw, _ in chunks]),
            "moments": best(lambda: [moments_of_bytes(raw, dtype) for raw, dtype in chunks]),
            "copy": best(copy),
        }
    finally:
        torch.set_num_threads(threads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", type=int, default=20, help="commits measured (after one warm-up)")
    ap.add_argument("--prefill", type=int, default=0, help="commits of a small state with the same names first")
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir under /work)")
    add_model_args(ap)
    args = ap.parse_args()
    trainer = Trainer.warmed(args, 3)
    print(f"state {trainer.state_mib():.0f} MiB; torch threads {torch.get_num_threads()}, cpus {os.cpu_count()}")
    totals: dict[str, int] = collections.Counter()
    in_call: dict[str, int] = collections.Counter()
    outside_ms = 0.0  # CPU the rest of the machine took meanwhile (kernel threads: writeback...)
    ticks = os.sysconf("SC_CLK_TCK")
    written: dict[str, int] = collections.Counter()
    stalls: list[float] = []
    with scratch_dir(args.dir) as base, ckptrepo.Repo.init(base / "repo", idle_repack=False) as repo:
        chunk_size = repo.config.chunk_size
        prefill(repo, trainer, args.prefill)
        repo.commit(trainer.state, step=0).wait()  # allocates the staging arena
        for i in range(args.commits):
            nudge(trainer)
            time.sleep(0.05)  # the nudge's own threads settle
            machine0, process0 = read_cpu_times(), time.process_time()
            before, before_w = thread_cpu_ns(), thread_written()
            handle = repo.commit(trainer.state, step=i + 1)
            returned = thread_cpu_ns()
            commit = handle.wait()
            time.sleep(0.05)
            machine1, process1 = read_cpu_times(), time.process_time()
            if machine0 is not None and machine1 is not None:
                busy = ((machine1[1] - machine0[1]) - (machine1[0] - machine0[0])) / ticks
                outside_ms += max(0.0, busy - (process1 - process0)) * 1e3
            for role, ns in by_role(before, returned).items():
                in_call[role] += ns
            for role, ns in by_role(returned, thread_cpu_ns()).items():
                totals[role] += ns
            for role, nbytes in by_role(before_w, thread_written()).items():
                written[role] += nbytes
            stalls.append(commit.stall_s)
        # What the commits left for later: their pending layouts (ckptrepo.db.pending), indexed
        # as the first read (or an idle window) would, on this thread.
        index0 = time.thread_time()
        indexed = layouts.index_pending(parts(repo).sessions)
        index_ms = (time.thread_time() - index0) * 1e3
        catalog_mib = sum(f.stat().st_size for f in (base / "repo" / ".ckpt").glob("db.sqlite*")) / 2**20
    speeds = peers(trainer, chunk_size)
    n = args.commits
    ms = {role: totals.get(role, 0) / n / 1e6 for role in ROLES}
    call_ms = {role: in_call.get(role, 0) / n / 1e6 for role in ROLES}
    background = ms["committer"] + ms["workers"] + ms["write-ahead"]
    floor = (speeds["blake3"] + speeds["moments"]) * 1e3
    rows = [(f"CPU ms per commit in the call: {role}", call_ms[role], "") for role in ROLES if call_ms[role]]
    rows += [(f"CPU ms per commit after the call: {role}", ms[role], "") for role in ROLES]
    rows += [
        ("CPU ms per commit after the call: background (committer + workers + write-ahead)", background, ""),
        ("peer: BLAKE3 of every chunk, one thread, ms", speeds["blake3"] * 1e3, ""),
        ("peer: chunk statistics pass, one thread, ms", speeds["moments"] * 1e3, ""),
        ("peer: copy of the state, one thread, ms", speeds["copy"] * 1e3, ""),
        ("RATIO background CPU / (BLAKE3 + statistics)", background / floor, "the work no content-addressed commit "
                                                                              "with statistics avoids"),
        ("median stall, ms", sorted(stalls)[len(stalls) // 2] * 1e3, ""),
        ("CPU ms per commit outside this process (the machine's, from /proc/stat)", outside_ms / n,
         "kernel threads (writeback, I/O completion) and other processes, to 50 ms after wait(); 10 ms ticks"),
        ("committer MiB written per commit (catalog and its log)", written["committer"] / n / 2**20, ""),
        ("deferred: indexing the commits' pending layouts afterwards, CPU ms per commit", index_ms / (n + 1),
         f"{indexed} layouts indexed in one go after the run (db.pending)"),
        ("catalog MiB after the run", catalog_mib, f"{args.prefill} prefill commits"),
    ]
    report("CPU of an asynchronous commit of the training state, by thread", rows,
           {"commits": n, "prefill": args.prefill, "ms_by_role": ms, "ms_in_call_by_role": call_ms, "peers_s": speeds,
            "written_mib_by_role": {role: written.get(role, 0) / n / 2**20 for role in ROLES}})


if __name__ == "__main__":
    main()
