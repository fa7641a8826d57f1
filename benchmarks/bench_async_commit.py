"""Blocking time (stall) and time to durable of a two-phase ckptrepo commit, against peers in one run.

The state is training-loop-like: a nested dict of fp32 tensors laid out like a model plus
AdamW moments (``{"model": {...}, "optim": {"exp_avg": {...}, "exp_avg_sq": {...}}}``), 1 GiB
by default, the same object for every peer. Each round runs every measurement once (the
order rotates from round to round); the table shows medians over the rounds. Other processes
share this machine: a measurement starts when they leave the CPU and the disk alone and is run
again (``--retries``) when they took more than ``--max-foreign`` of the CPU or wrote more than
``--max-write`` MiB/s meanwhile; what they took is printed.

Stall (what the training thread is blocked for), on the SAME state object committed again
and again into one repository, with a tiny in-place change to one tensor between commits
(so phase 2 always has new bytes: see new_bytes) and the previous commit durable before the
next starts (so no commit waits for a staging slot):
  - ckptrepo ``commit()`` call to return (steady state; the first commit, which allocates
    the staging arena, is reported on its own line),
  - (a) a plain copy of every tensor into preallocated memory (the floor of any snapshot),
    measured two ways: into buffers of its own, on its own in the rotation, and into the
    very memory ``commit()`` copies into (the repository's staging arena, idle between
    commits), paired with the commits: each round copies into the arena once untimed, then
    times copy, commit, commit, copy. The goal (stall <= 1.3x the floor) is judged on the
    median over rounds of (both stalls) / (both copies); the ratio to the other buffers'
    copy is printed with its goal too. Why the pairing: on this VM a 1 GiB copy's speed
    depends on which pages it writes (~15% between allocations) and on whether they were
    written a moment ago (the first copy after a pause or after other peers' I/O runs up to
    ~25% slower than the next one into the same memory),
  - (b) torch.save + fsync (file and directory),
  - (c) ``dcp.async_save`` call to return: as documented (a fresh default stager per call,
    which allocates its staging memory each time) and with one ``DefaultStager`` reused
    across calls (which caches its staging storages: dcp's steady state on CPU).
Time to durable: ckptrepo ``commit()`` entry to ``wait()`` return into a fresh, empty
repository (no dedup against earlier rounds; includes allocating the staging arena) vs
``dcp.save`` into a fresh directory. DCP's FileSystemWriter fsyncs its data and ``.metadata``
files (``sync_files=True``) but not the directory; the timing adds an fsync of the new
directory. ``dcp.async_save``'s call-to-completion time is shown for reference. The first
commit of a fresh repository after ``reserve()`` (which maps its staging memory first, as a
script would before training) is timed too, with ``reserve()`` itself. Also
shown, not judged: time to durable of a training loop's later commits, into a repository
that holds the previous one, after every tensor changed (no chunk deduplicates; the arena is
mapped already, so the copy runs at memory speed and the write-ahead starts after it).

Deferred work, reported, never hidden: by default (``encode="auto"``) an asynchronous commit
stores its new chunks raw and leaves their encoding to ``repack``. After each fresh
repository's commit is durable, ``repo.repack()`` runs and its wall and CPU time and the
stored bytes before and after are reported; "durable + repack" is the time until the bytes
are as small as an inline-encoding commit would have made them. The same commit with
``encode="inline"`` (encoding while committing, the earlier default) is measured in the same
rounds. The background repack between commits is off in the timed repositories (it would
run while the peers are measured); the peak-RSS children run the defaults, background repack
included.

DCP runs with a one-rank gloo process group (tcp init on loopback), as on a real job;
``--no-pg`` uses ``no_dist=True`` without a process group instead (both work on CPU).
Peak RSS is measured in child processes (their ``VmHWM``; ``ru_maxrss`` is shown too,
but a child inherits its parent's RSS at fork into it) that build the state and commit it
``--rss-commits`` times back to back, mutating every tensor in between, so the slots fill
up; a child that only builds the state gives the baseline.

    python benchmarks/bench_async_commit.py [--gib 1.0] [--rounds 5] [--quick] [--dir PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fsync_dir, fsync_path, goal_note, median, quiet_run, report, scratch_dir

import ckptrepo
from ckptrepo.testing import parts

MIB = 1 << 20
State = dict[str, Any]
N_MATRICES = 16


def make_state(gib: float, seed: int = 0) -> State:
    """A model + AdamW-like state of ``gib`` GiB: 16 fp32 weight matrices with their biases,
    and for each the two moments (small normal values and their squares)."""
    gen = torch.Generator().manual_seed(seed)
    cols = 4096
    rows = max(1, int(gib * (1 << 30)) // (3 * N_MATRICES) // 4 // cols)
    model: dict[str, torch.Tensor] = {}
    avg: dict[str, torch.Tensor] = {}
    avg_sq: dict[str, torch.Tensor] = {}
    for i in range(N_MATRICES):
        for name, shape in ((f"layers.{i}.weight", (rows, cols)), (f"layers.{i}.bias", (cols,))):
            # Filled in place: temporaries would leave the allocator holding freed memory,
            # which would blur the peak-RSS baseline.
            model[name] = torch.empty(shape).normal_(0.0, 0.02, generator=gen)
            avg[name] = torch.empty(shape).normal_(0.0, 1e-3, generator=gen)
            avg_sq[name] = torch.empty(shape).copy_(avg[name]).square_().mul_(0.5)
    return {"model": model, "optim": {"exp_avg": avg, "exp_avg_sq": avg_sq}}


def tensors_of(state: State) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for v in state.values():
        out.extend(tensors_of(v) if isinstance(v, dict) else [v])
    return out


def clone_state(state: State) -> State:
    return {k: clone_state(v) if isinstance(v, dict) else v.clone() for k, v in state.items()}


def state_bytes(state: State) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_of(state))


def touch(state: State, i: int, *, every: bool = False) -> None:
    """A tiny in-place change, like a training step's: one weight matrix (or every tensor)."""
    if every:
        for t in tensors_of(state):
            t.add_(1e-7)
    else:
        state["model"][f"layers.{i % N_MATRICES}.weight"].add_(1e-6)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- peak RSS (child processes) -------------------------------------------------------------


def rss_child(args: argparse.Namespace) -> None:
    """Build the state, optionally commit it ``--rss-commits`` times; print peak RSS as JSON."""
    state = make_state(args.gib)
    commits: list[ckptrepo.Commit] = []
    if args.rss_child != "baseline":
        inflight = int(args.rss_child)
        base = Path(args.dir)
        with ckptrepo.Repo.init(base / f"rss-repo-{inflight}", max_inflight=inflight) as repo:
            handles = []
            for i in range(args.rss_commits):
                handles.append(repo.commit(state, step=i))
                touch(state, i, every=True)
            commits = [h.wait() for h in handles]
        shutil.rmtree(base / f"rss-repo-{inflight}", ignore_errors=True)
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    print(json.dumps({"peak": vm_hwm() or maxrss, "ru_maxrss": maxrss, "state": state_bytes(state),
                      "wait_s": [c.wait_s for c in commits]}))


def vm_hwm() -> int | None:
    """This process's own peak RSS (``VmHWM``). ``ru_maxrss`` is not: Linux carries the
    parent's RSS at fork over into a child's ``ru_maxrss`` across exec."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def measure_rss(base: Path, args: argparse.Namespace, what: str) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--rss-child", what, "--gib", str(args.gib), "--dir", str(base),
           "--rss-commits", str(args.rss_commits)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


# -- the in-process measurements ------------------------------------------------------------


class Bench:
    """Every peer as a callable that runs one measurement and appends to ``self.t``."""

    def __init__(self, base: Path, state: State, use_pg: bool) -> None:
        # DCP is imported here, not at the top: the peak-RSS children must not pay for it.
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        self.dcp = dcp
        self.base, self.state, self.use_pg = base, state, use_pg
        self.t: dict[str, list[float]] = {}
        self.cur: dict[str, float] = {}
        self.foreign: list[float] = []
        self.foreign_write: list[float] = []
        self.thrown = 0
        self.round = 0
        self.bufs = [torch.empty_like(t) for t in tensors_of(state)]
        for b in self.bufs:
            b.fill_(0)  # fault the pages in: the floor is a copy into mapped memory
        self.repo = ckptrepo.Repo.init(base / "loop-repo", idle_repack=False)
        # A training loop's later commits: every chunk new, arena mapped, catalog open. On a
        # copy of the state, changed in full before each commit, so that the other peers'
        # state keeps its tiny changes.
        self.steady = ckptrepo.Repo.init(base / "steady-repo", idle_repack=False)
        self.steady_state = clone_state(state)
        self.reused_stager = DefaultStager(StagingOptions(False, False, False, False))
        self.no_dist = not use_pg
        self.n = 0

    def add(self, key: str, value: float) -> None:
        self.cur[key] = value

    def run(self, peer: Callable[[], None], args: argparse.Namespace, retries: int | None = None) -> None:
        """Run one measurement when the machine is quiet; keep it unless other processes
        took more than ``--max-foreign`` of the CPU or wrote more than ``--max-write`` MiB/s
        meanwhile (then run it again, up to ``--retries`` times)."""

        def once() -> dict[str, float]:
            self.cur = {}
            peer()
            return self.cur

        kept, load, thrown = quiet_run(once, args.max_foreign, args.retries if retries is None else retries,
                                       args.max_write)
        for key, value in kept.items():
            self.t.setdefault(key, []).append(value)
        self.foreign.append(load.share)
        self.foreign_write.append(load.write_mib_s)
        self.thrown += thrown

    def fresh(self, name: str) -> Path:
        self.n += 1
        return self.base / f"{name}-{self.n}"

    def _copy(self) -> float:
        """Seconds to copy every tensor into the preallocated buffers."""
        return self._copy_into(self.bufs)

    def copy_floor(self) -> None:
        self.add("copy", self._copy())

    def _same_memory(self) -> list[torch.Tensor]:
        """Views, laid out as ``commit()`` lays the state out, into the loop repository's own
        staging arena (idle between commits: max_inflight=1 and the last commit waited for)."""
        from ckptrepo.state import flatten

        slots = parts(self.repo).writer.snapshots().staging._free  # the benchmark reaches into the pool on purpose
        assert len(slots) == 1 and slots[0].arena is not None, "the loop repository's slot is busy or empty"
        return list(slots[0].prepare(flatten(self.state).tensors).values())

    def _copy_into(self, views: list[torch.Tensor]) -> float:
        """Seconds to copy every tensor into ``views``, one plain ``copy_`` per tensor."""
        start = time.perf_counter()
        for dst, src in zip(views, tensors_of(self.state), strict=True):
            dst.copy_(src)
        return time.perf_counter() - start

    def _commit(self) -> tuple[float, Any]:
        touch(self.state, self.round)
        start = time.perf_counter()
        handle = self.repo.commit(self.state, step=self.round)
        stall = time.perf_counter() - start
        return stall, handle.wait()

    def ckpt_stall(self, first: bool = False) -> None:
        if first:
            self.add("first_stall", self._commit()[0])
            return
        # Two commits, each paired with a copy of the same state into the same memory its
        # commit copies into (the repository's staging arena), one pair in each order. On this
        # VM a 1 GiB copy's speed depends on its destination's pages (~15% between allocations)
        # and on whether they were written a moment ago (a second copy into the same memory
        # runs up to ~25% faster than the first after a pause or other peers' I/O), so a floor
        # measured on other buffers, or always first, is biased one way or the other. An
        # untimed copy into the arena first makes every timed copy a warm one.
        views = self._same_memory()
        self._copy_into(views)
        floor_a = self._copy_into(views)
        stall_a, commit_a = self._commit()
        stall_b, commit_b = self._commit()
        floor_b = self._copy_into(self._same_memory())
        self.add("copy_same", (floor_a + floor_b) / 2)
        self.add("stall", (stall_a + stall_b) / 2)
        self.add("stall_pair", (stall_a + stall_b) / (floor_a + floor_b))
        self.add("internal_stall", (commit_a.stall_s + commit_b.stall_s) / 2)
        self.add("persist", (commit_a.persist_s + commit_b.persist_s) / 2)
        self.add("new_bytes", commit_b.new_bytes)

    def torch_save(self) -> None:
        path = self.base / "state.pt"
        path.unlink(missing_ok=True)
        start = time.perf_counter()
        torch.save(self.state, path)
        fsync_path(path)  # file and directory
        self.add("torch_save", time.perf_counter() - start)
        path.unlink()

    def async_save(self, reused: bool, first: bool = False) -> None:
        where = self.fresh("dcp-async")
        start = time.perf_counter()
        future = self.dcp.async_save(self.state, checkpoint_id=str(where), no_dist=self.no_dist,
                                     async_stager=self.reused_stager if reused else None)
        blocked = time.perf_counter() - start
        future.result()  # type: ignore[union-attr]
        fsync_dir(where)
        done = time.perf_counter() - start
        shutil.rmtree(where)
        if first:
            return
        tag = "reused" if reused else "fresh"
        self.add(f"async_block_{tag}", blocked)
        self.add(f"async_done_{tag}", done)

    def dcp_save(self) -> None:
        where = self.fresh("dcp-save")
        start = time.perf_counter()
        self.dcp.save(self.state, checkpoint_id=str(where), no_dist=self.no_dist)
        fsync_dir(where)  # DCP fsyncs its files, not the new directory
        self.add("dcp_save", time.perf_counter() - start)
        shutil.rmtree(where)

    def ckpt_durable(self) -> None:
        """Default settings: durable with raw chunks, then the repack that encodes them."""
        where = self.fresh("fresh-repo")
        repo = ckptrepo.Repo.init(where, idle_repack=False)  # not timed: an empty repository, as for dcp.save's
        try:
            cpu, start = time.process_time(), time.perf_counter()
            repo.commit(self.state, step=0).wait()
            self.add("durable", time.perf_counter() - start)
            self.add("durable_cpu", time.process_time() - cpu)
            self.add("stored_deferred", repo.stats().stored_bytes)
            cpu, start = time.process_time(), time.perf_counter()
            packed = repo.repack()
            self.add("repack", time.perf_counter() - start)
            self.add("repack_cpu", time.process_time() - cpu)
            self.add("stored_repacked", repo.stats().stored_bytes)
            assert packed.chunks_encoded > 0
        finally:
            repo.close()
        shutil.rmtree(where)

    def ckpt_durable_steady(self, first: bool = False) -> None:
        """A commit of a loop that changed every tensor since its last commit (no chunk
        deduplicates), into the repository holding that commit: its arena mapped already."""
        touch(self.steady_state, self.round, every=True)  # not timed: a training step's work
        cpu, start = time.process_time(), time.perf_counter()
        self.steady.commit(self.steady_state, step=self.round).wait()
        if not first:
            self.add("durable_steady", time.perf_counter() - start)
            self.add("durable_steady_cpu", time.process_time() - cpu)

    def ckpt_reserved_first(self) -> None:
        """A fresh repository's first commit after ``reserve()`` mapped its staging memory."""
        where = self.fresh("reserved-repo")
        repo = ckptrepo.Repo.init(where, idle_repack=False)
        try:
            start = time.perf_counter()
            repo.reserve(self.state)
            self.add("reserve", time.perf_counter() - start)
            start = time.perf_counter()
            handle = repo.commit(self.state, step=0)
            self.add("reserved_first_stall", time.perf_counter() - start)
            handle.wait()
        finally:
            repo.close()
        shutil.rmtree(where)

    def ckpt_durable_inline(self) -> None:
        """``encode="inline"``: encoded while committing (the earlier default)."""
        where = self.fresh("fresh-repo-inline")
        repo = ckptrepo.Repo.init(where, encode="inline")
        try:
            cpu, start = time.process_time(), time.perf_counter()
            repo.commit(self.state, step=0).wait()
            self.add("durable_inline", time.perf_counter() - start)
            self.add("durable_inline_cpu", time.process_time() - cpu)
            self.add("stored_inline", repo.stats().stored_bytes)
        finally:
            repo.close()
        shutil.rmtree(where)

    def close(self) -> None:
        self.repo.close()
        self.steady.close()
        self.reused_stager.close()


def run(base: Path, args: argparse.Namespace) -> None:
    state = make_state(args.gib)
    nbytes = state_bytes(state)
    mib = nbytes / MIB
    n_tensors = len(tensors_of(state))
    print(f"state: {n_tensors} fp32 tensors (model + AdamW moments), {mib:.0f} MiB; rounds={args.rounds}; "
          f"workers={os.environ.get('CKPT_WORKERS') or os.cpu_count()}; dir={base}", flush=True)

    import torch.distributed as dist

    if not args.no_pg:
        dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}")
    bench = Bench(base, state, use_pg=not args.no_pg)
    try:
        # Warm-up, reported apart: the first commit allocates (and faults in) the staging arena;
        # dcp's first calls set up their planners.
        bench.run(lambda: bench.ckpt_stall(first=True), args, retries=0)
        bench.run(lambda: bench.ckpt_durable_steady(first=True), args, retries=0)
        bench.async_save(reused=False, first=True)
        bench.async_save(reused=True, first=True)
        peers: list[Callable[[], None]] = [
            bench.copy_floor, bench.ckpt_stall, bench.torch_save, lambda: bench.async_save(reused=False),
            lambda: bench.async_save(reused=True), bench.dcp_save, bench.ckpt_durable, bench.ckpt_durable_inline,
            bench.ckpt_durable_steady, bench.ckpt_reserved_first,
        ]
        for r in range(args.rounds):
            bench.round = r + 1
            for peer in peers[r % len(peers):] + peers[: r % len(peers)]:
                bench.run(peer, args)
            print(f"  round {r + 1}/{args.rounds}: stall {bench.t['stall'][-1]:.3f} s, "
                  f"durable {bench.t['durable'][-1]:.3f} s, dcp.save {bench.t['dcp_save'][-1]:.3f} s", flush=True)
    finally:
        bench.close()
        if dist.is_initialized():
            dist.destroy_process_group()

    print(f"  other processes took {100 * median(bench.foreign):.0f}% of the CPU and wrote "
          f"{median(bench.foreign_write):.0f} MiB/s (medians over kept measurements; "
          f"max {100 * max(bench.foreign):.0f}%, "
          f"{max(bench.foreign_write):.0f} MiB/s); {bench.thrown} measurements run again because they exceeded "
          f"{100 * args.max_foreign:.0f}% or {args.max_write:g} MiB/s", flush=True)
    print("  peak RSS children ...", flush=True)
    rss = {what: measure_rss(base, args, what) for what in ("baseline", "1", "2")}

    m = {k: median(v) for k, v in bench.t.items()}
    stall, copy, save = m["stall"], m["copy"], m["torch_save"]
    durable, dcp_save = m["durable"], m["dcp_save"]
    new_mib = m["new_bytes"] / MIB
    pairs = bench.t["stall_pair"]
    paired = median(pairs)

    def bound(inflight: int) -> float:
        return (nbytes * (1 + inflight) + 300 * MIB) / MIB

    peak1, peak2 = rss["1"]["peak"] / MIB, rss["2"]["peak"] / MIB
    rows = [
        ("ckptrepo commit() stall, steady", stall,
         f"s  (internal stall_s {m['internal_stall']:.3f}; new_bytes {new_mib:.0f} MiB; "
         f"persist {m['persist']:.3f} s)"),
        ("ckptrepo commit() stall, first", m["first_stall"], "s  (allocates the staging arena)"),
        ("ckptrepo commit() stall, first after reserve()", m["reserved_first_stall"],
         f"s  (a fresh repository; reserve() itself {m['reserve']:.3f} s, before training)"),
        ("(a) copy into preallocated bufs", copy, f"s  {mib / copy:8.0f} MiB/s  (buffers of their own)"),
        ("(a) copy into the staging arena", m["copy_same"], f"s  {mib / m['copy_same']:8.0f} MiB/s  "
         "(the memory commit() copies into, next to each commit)"),
        ("(b) torch.save+fsync", save, f"s  {mib / save:8.0f} MiB/s"),
        ("(c) dcp.async_save block, fresh", m["async_block_fresh"], "s  (default: new stager per call)"),
        ("(c) dcp.async_save block, reused", m["async_block_reused"], "s  (one DefaultStager reused)"),
        ("ckptrepo commit -> durable", durable, f"s  {mib / durable:8.0f} MiB/s  (fresh repository)"),
        ("  its CPU", m["durable_cpu"], "CPU-s  (whole process: hash, statistics, raw pack writes)"),
        ("  then repack (deferred encoding)", m["repack"], f"s  {m['repack_cpu']:.2f} CPU-s; stored "
         f"{m['stored_deferred'] / MIB:.0f} -> {m['stored_repacked'] / MIB:.0f} MiB"),
        ("ckptrepo commit -> durable, steady", m["durable_steady"], f"s  {m['durable_steady_cpu']:.2f} CPU-s  "
         "(every tensor changed since the repository's previous commit)"),
        ("ckptrepo commit -> durable, inline", m["durable_inline"], f"s  {m['durable_inline_cpu']:.2f} CPU-s; "
         f"stored {m['stored_inline'] / MIB:.0f} MiB  (encode='inline')"),
        ("dcp.save (+dir fsync)", dcp_save, f"s  {mib / dcp_save:8.0f} MiB/s  (fresh directory)"),
        ("dcp.async_save -> done, fresh", m["async_done_fresh"], "s"),
        ("dcp.async_save -> done, reused", m["async_done_reused"], "s"),
        ("peak RSS, state only (baseline)", rss["baseline"]["peak"] / MIB, "MiB  (python + torch + the state)"),
        ("peak RSS, ckptrepo max_inflight=1", peak1, f"MiB  (bound state*2+300 = {bound(1):.0f} MiB)"),
        ("peak RSS, ckptrepo max_inflight=2", peak2, f"MiB  (bound state*3+300 = {bound(2):.0f} MiB)"),
        ("RATIO stall / copy floor, same memory", paired, goal_note(paired, 1.3)
         + f"; per round {min(pairs):.2f}-{max(pairs):.2f}: two commits / two copies into their arena"),
        ("RATIO stall / copy floor, other buffers", stall / copy, goal_note(stall / copy, 1.3)
         + "; medians of measurements seconds apart"),
        ("RATIO stall / torch.save+fsync", stall / save, goal_note(stall / save, 0.1)),
        ("RATIO first stall after reserve() / copy floor", m["reserved_first_stall"] / m["copy_same"],
         "the first commit into memory mapped beforehand (not a goal)"),
        ("RATIO stall / dcp.async_save block (fresh)", stall / m["async_block_fresh"], ""),
        ("RATIO stall / dcp.async_save block (reused)", stall / m["async_block_reused"], ""),
        ("RATIO durable / dcp.save", durable / dcp_save, goal_note(durable / dcp_save, 1.0)),
        ("RATIO durable + repack / dcp.save", (durable + m["repack"]) / dcp_save,
         "until stored as small as inline encoding makes it (not a goal)"),
        ("RATIO durable, steady / dcp.save", m["durable_steady"] / dcp_save,
         "a loop's later commits, every chunk new (the goal is judged on the first commit above)"),
        ("RATIO durable, inline / dcp.save", m["durable_inline"] / dcp_save, "encode='inline', for comparison"),
        ("RATIO stored after repack / inline", m["stored_repacked"] / m["stored_inline"], "same state, 1.0 = as small"),
        ("RATIO peak RSS / bound (max_inflight=1)", peak1 / bound(1), goal_note(peak1 / bound(1), 1.0)),
        ("RATIO peak RSS / bound (max_inflight=2)", peak2 / bound(2), goal_note(peak2 / bound(2), 1.0)),
    ]
    report(
        f"two-phase commit of {mib:.0f} MiB fp32 (median of {args.rounds} rounds; seconds, MiB, then ratios)",
        rows,
        {"mib": mib, "rounds": args.rounds, "process_group": "none (no_dist)" if args.no_pg else "gloo world_size=1",
         "new_bytes": new_mib * MIB, "samples": bench.t, "rss": rss, "foreign_cpu": bench.foreign,
         "foreign_write_mib_s": bench.foreign_write,
         "thrown": bench.thrown, "cpus": os.cpu_count(),
         "workers": os.environ.get("CKPT_WORKERS") or os.cpu_count()},
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=None, help="state size (default 1.0; --quick 0.25)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of every measurement (default 5; --quick 3)")
    ap.add_argument("--quick", action="store_true", help="a ~1 minute run: 0.25 GiB, 3 rounds")
    ap.add_argument("--no-pg", action="store_true", help="DCP with no_dist=True instead of a 1-rank gloo group")
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir under /work)")
    ap.add_argument("--max-foreign", type=float, default=0.10,
                    help="run a measurement again when other processes took more than this share of the CPU (0.10)")
    ap.add_argument("--max-write", type=float, default=20.0,
                    help="... or when they wrote more than this many MiB/s to disk (default 20)")
    ap.add_argument("--retries", type=int, default=2, help="at most this many re-runs per measurement (default 2)")
    ap.add_argument("--rss-commits", type=int, default=4, help=argparse.SUPPRESS)
    ap.add_argument("--rss-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.gib = args.gib if args.gib is not None else (0.25 if args.quick else 1.0)
    args.rounds = args.rounds if args.rounds is not None else (3 if args.quick else 5)
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    if args.rss_child is not None:
        rss_child(args)
        return
    with scratch_dir(args.dir) as base:
        run(base, args)


if __name__ == "__main__":
    main()
