"""Training overhead of checkpointing every k steps, from interleaved blocks (a paired design).

The same CPU training loop as ``bench_training.py`` (~10M-parameter transformer, AdamW, state
~117 MiB), but instead of timing long segments minutes apart, the loop runs *blocks* of k
training steps, in rounds whose order is drawn at random:
  - ckptrepo: ``repo.commit(state)`` at the start of the block, k steps, then ``wait()`` for
    the commit: everything the commit costs the loop (its stall, the steps its phase 2 and
    its pack writes slow down, whatever of phase 2 is left at the end) falls inside the
    block, as it falls inside one interval when committing every k steps (with
    ``max_inflight=1`` the next ``commit()`` waits for it there),
  - torch.save: ``torch.save`` of the same state dicts to a new file + fsync of the file and
    its directory at the start of the block, then k steps (the file is removed after the
    block, untimed),
  - dcp.async_save (``--peers dcp``, default): ``torch.distributed.checkpoint.async_save`` of
    the same state dicts at the start (no process group, one ``DefaultStager`` reused: its
    best case), k steps, then its future and an fsync of the new directory,
  - copy floor (``--peers copy``, default): a copy of every tensor into preallocated buffers,
    nothing persisted: the least any snapshot-then-persist checkpointer costs the loop,
  - persist floor (``--peers persist``): the same copy into one page-aligned buffer, then a
    background thread writes it raw to a new file (direct I/O, 8 MiB requests, as
    ckptrepo's write-ahead does) and fsyncs it; the block waits for that thread and fsyncs
    the directory: the least any *durable* snapshot-then-persist checkpointer costs the
    loop (no format, no hashing, no index, no deduplication),
  - hash floor (``--peers hash``): the persist floor, plus BLAKE3 of every 1 MiB chunk of the
    copy (ckptrepo's chunking and hash call) on a second background thread while the first
    writes: the least any durable *content-addressed* checkpointer costs the loop (no
    statistics, no lookups, no index); ckptrepo's rows give their difference from it,
  - none: k steps.
The blocks of a round run back to back, seconds apart, so the machine's drift (other
tenants of the host, which move the step time of this VM by up to 2x over minutes) falls on
all of them alike. Overhead of a method = mean over rounds of (its block - the none block)
over the mean none block, in %, with a 95% bootstrap interval over the rounds (paired
resampling); the ratios to torch.save's and dcp.async_save's overheads are bootstrapped the
same way. "CPU %" is the same for process CPU seconds.

The block estimate is unbiased but noisy: this VM's speed moves by ~10% between consecutive
16-s blocks with no checkpoint at all (and by ~8% between 4-s ones), which is why it needs
hundreds of rounds. For k >= 40 the script also prints a **local estimate** (``local_loss``):
each block's checkpoint call, end wait and closing collection, plus how much longer its first
10 steps took than the mean of its next 40, minus the same for the round's none block. It
takes each block's speed out: on a no-checkpoint run of 4,000 steps here the noise per round
fell from 8% (k=50) and 10% (k=200) of a block to 3.2% and 0.7%. It rests on one premise, that
a checkpoint does not slow the steps past the first 10 (a commit is durable ~0.1 s, one or two
steps, after its call; the rows give the share of blocks where it was durable within the head,
and the idle repack's bytes encoded during blocks, which would land past it), and it is checked
with a 20-step head, which a checkpoint that lingered would read higher.

Each k uses a fresh repository (default settings unless ``--variant``), whose staging arena
is allocated by an untimed warm-up commit. The background repack between commits is on, as
by default: the bytes it encoded during each kind of block are reported (work it does in a
torch.save or none block would flatter ckptrepo), and what it left is encoded by
``repo.repack()`` after the k, timed and reported as its cost per commit.
Every block ends with a timed ``gc.collect()``, so garbage is paid for by the kind that made
it. "fits": the share of ckptrepo blocks in which the commit was durable before the block's last
step ended (its phase 2 finished inside the interval). CheckFreq's 3.5% bound is shown for
every method at every k ("met" when the whole 95% interval is at most 3.5, "met by the mean"
when only the mean is); the summary names, per method, the smallest k of the run within it
(by the local estimate where the k has one):
how often each could checkpoint for that budget. A variant's row also gives its difference
from the default ckptrepo kind, paired by round, with a 95% interval.

``--prefill N`` first gives every repository N commits of a small state with the same tensor
names (``_training.prefill``), so the commits measured insert their rows into a catalog the size
of a run N commits long: each commit's rows then dirty more index pages, which a fresh
repository does not show (``bench_commit_cpu.py --prefill``).

``--variant NAME:VAR=VALUE[,VAR=VALUE]`` adds a block kind: ckptrepo with another
repository opened with those ``CKPT_*`` environment variables (an A/B in the same run), e.g.
``idle:CKPT_BACKGROUND_PRIORITY=idle``. ``--blocking`` adds a kind whose commits are
``commit(..., blocking=True)``: phase 2 inside the call, while the trainer waits.

    python benchmarks/bench_training_paired.py [--ks 10 50 200] [--rounds N] [--quick]
        [--peers dcp copy persist hash] [--variant NAME:CKPT_WRITE_AHEAD=0] [--blocking] [--prefill N]
        [--seed 0] [--dir PATH]
"""

from __future__ import annotations

import argparse
import functools
import gc
import mmap
import os
import random
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ForeignLoad, bootstrap, fsync_dir, fsync_path, goal_note, report, scratch_dir
from _training import MIB, Trainer, add_model_args, prefill

import ckptrepo
from ckptrepo.chunks.chunker import chunk_spans
from ckptrepo.config import DEFAULT_CHUNK_SIZE
from ckptrepo.db import pending as layouts
from ckptrepo.ids import hash_bytes
from ckptrepo.storage.appendfile import direct_io_enabled, open_direct, pwrite_all
from ckptrepo.testing import parts

ROUNDS = {10: 40, 50: 60, 200: 16}  # ~2.5, ~15 and ~15 minutes at ~0.057 s/step with five kinds


@dataclass
class Block:
    """One timed block: its wall and process CPU seconds, and what a commit in it reported."""

    wall: float
    cpu: float
    stall: float = 0.0  # the checkpoint call
    end_wait: float = 0.0  # wait() after the last step
    durable_in_time: bool = True  # phase 2 done before the last step ended
    persist: float = 0.0
    slot_wait: float = 0.0
    repacked: int = 0  # bytes the idle repack encoded during the block
    steps: list[float] = field(default_factory=list)  # each training step's wall seconds, in order
    collect: float = 0.0  # the block's closing gc.collect()


Finish = Callable[[], None]


@dataclass
class Kind:
    """A block kind: how its checkpoint is taken (neither a repository nor a peer: none)."""

    name: str
    repo: ckptrepo.Repo | None = None
    peer: Callable[[Trainer], Finish | None] | None = None  # checkpoint; what to wait for at the block's end
    cleanup: Callable[[], None] | None = None  # after the block, untimed
    blocking: bool = False  # the repository's commits are ``commit(..., blocking=True)``
    blocks: list[Block] = field(default_factory=list)


def state_dicts(trainer: Trainer) -> dict[str, Any]:
    return {"model": trainer.model.state_dict(), "optim": trainer.opt.state_dict()}


class TorchSave:
    """torch.save of the state dicts to a new file + fsync of the file and its directory."""

    def __init__(self, where: Path) -> None:
        self.where = where
        self.path: Path | None = None

    def __call__(self, trainer: Trainer) -> None:
        self.path = self.where / f"step-{trainer.n}.pt"
        torch.save(state_dicts(trainer), self.path)
        fsync_path(self.path)

    def cleanup(self) -> None:
        if self.path is not None:
            self.path.unlink()


class CopyFloor:
    """The floor of any snapshot-then-persist checkpointer: a copy of every tensor of the
    state into preallocated buffers (faulted in beforehand), nothing persisted."""

    def __init__(self, trainer: Trainer) -> None:
        self.bufs = [torch.zeros_like(t) for t in self.tensors(trainer)]

    @staticmethod
    def tensors(trainer: Trainer) -> list[torch.Tensor]:
        opt = [v for st in trainer.opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
        return [*trainer.model.state_dict().values(), *opt]

    def __call__(self, trainer: Trainer) -> None:
        for buf, t in zip(self.bufs, self.tensors(trainer), strict=True):
            buf.copy_(t)


class PersistFloor(CopyFloor):
    """The floor of any durable snapshot-then-persist checkpointer: the copy floor's copy, into
    one page-aligned buffer, written raw by a background thread to a new file with direct I/O
    (buffered where ckptrepo's write-ahead would be) and fsynced; the block waits for the thread."""

    REQUEST = 8 << 20

    def __init__(self, trainer: Trainer, where: Path) -> None:
        self.where = where
        self.path: Path | None = None
        self.offsets: list[int] = []
        size = 0
        for t in self.tensors(trainer):
            self.offsets.append(size)
            size += -(-t.nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
        self.size = size
        self.arena = mmap.mmap(-1, size)
        flat = torch.frombuffer(self.arena, dtype=torch.uint8)
        flat.fill_(0)  # faulted in beforehand, as the copy floor's buffers are
        self.bufs = [flat[o:o + t.nbytes].view(t.dtype).view(t.shape)
                     for o, t in zip(self.offsets, self.tensors(trainer), strict=True)]

    def write(self, path: Path) -> None:
        # Direct I/O exactly when ckptrepo's write-ahead would use it (``CKPT_DIRECT_IO``, a
        # filesystem that takes it): the same helpers decide.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        direct = open_direct(str(path)) if direct_io_enabled() else None
        out = fd if direct is None else direct
        try:
            view = memoryview(self.arena)
            for off in range(0, self.size, self.REQUEST):
                pwrite_all(out, view[off:off + self.REQUEST], off)
            os.fsync(out)
        finally:
            if direct is not None:
                os.close(direct)
            os.close(fd)

    def __call__(self, trainer: Trainer) -> Finish:  # type: ignore[override]
        super().__call__(trainer)
        path = self.path = self.where / f"raw-{trainer.n}.bin"
        writer = threading.Thread(target=self.write, args=(path,))
        writer.start()

        def finish() -> None:
            writer.join()
            fsync_dir(self.where)

        return finish

    def cleanup(self) -> None:
        if self.path is not None:
            self.path.unlink()


class HashFloor(PersistFloor):
    """The floor of any durable *content-addressed* checkpointer: the persist floor, plus BLAKE3
    of every chunk of the copy (ckptrepo's chunking and its hash call, ``ids.hash_bytes``) on a
    second background thread while the first writes; the block waits for both. No statistics,
    no lookups, no index, no transaction: what naming the bytes by their hash alone costs."""

    def __init__(self, trainer: Trainer, where: Path, chunk_size: int) -> None:
        super().__init__(trainer, where)
        view = memoryview(self.arena)
        self.chunks = [view[o + off:o + off + n]
                       for o, t in zip(self.offsets, self.tensors(trainer), strict=True)
                       for off, n in chunk_spans(t.nbytes, t.element_size(), chunk_size)]
        self.digests: list[str] = []

    def hash_all(self) -> None:
        self.digests = [hash_bytes(c) for c in self.chunks]

    def __call__(self, trainer: Trainer) -> Finish:  # type: ignore[override]
        written = super().__call__(trainer)
        hasher = threading.Thread(target=self.hash_all)
        hasher.start()

        def finish() -> None:
            hasher.join()
            written()

        return finish


class DcpAsync:
    """``torch.distributed.checkpoint.async_save`` of the state dicts (no process group, one
    ``DefaultStager`` reused: its best case); the block waits for its future and fsyncs the
    new directory (DCP fsyncs its files)."""

    def __init__(self, where: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        self.dcp, self.where = dcp, where
        self.stager = DefaultStager(StagingOptions(False, False, False, False))
        self.target: Path | None = None

    def __call__(self, trainer: Trainer) -> Finish:
        target = self.target = self.where / f"dcp-{trainer.n}"
        future = self.dcp.async_save(  # type: ignore[attr-defined]
            state_dicts(trainer), checkpoint_id=str(target), no_dist=True, async_stager=self.stager)

        def finish() -> None:
            future.result()  # type: ignore[union-attr]
            fsync_dir(target)

        return finish

    def cleanup(self) -> None:
        if self.target is not None:
            shutil.rmtree(self.target)

    def close(self) -> None:
        self.stager.close()


def parse_variant(spec: str) -> tuple[str, dict[str, str]]:
    name, _, assigns = spec.partition(":")
    env = dict(a.split("=", 1) for a in assigns.split(",") if a)
    if not name or not env or not all(k.startswith("CKPT_") for k in env):
        raise SystemExit(f"--variant {spec!r}: expected NAME:CKPT_VAR=VALUE[,CKPT_VAR=VALUE]")
    return name, env


def open_repo(where: Path, trainer: Trainer, env: dict[str, str], prefilled: int = 0) -> ckptrepo.Repo:
    """A fresh repository (``env`` set while it is opened) with its arena allocated by a warm-up
    commit, after ``prefilled`` commits of a small state with the state's names (``prefill``)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        repo = ckptrepo.Repo.init(where)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    prefill(repo, trainer, prefilled)
    repo.commit(trainer.state, message="warm-up").wait()
    return repo


def run_block(kind: Kind, trainer: Trainer, k: int) -> tuple[Block, int]:
    """k training steps, after the kind's checkpoint; a commit is waited for inside the block.
    Also returns the bytes the commit stored (0 without one)."""
    cpu0 = time.process_time()
    start = time.perf_counter()
    handle, finish = None, None
    if kind.repo is not None:
        handle = kind.repo.commit(trainer.state, step=trainer.n, blocking=kind.blocking)
    elif kind.peer is not None:
        finish = kind.peer(trainer)
    called = time.perf_counter()
    steps = []
    t0 = called
    for _ in range(k):
        trainer.step()
        t1 = time.perf_counter()
        steps.append(t1 - t0)
        t0 = t1
    last = t0
    commit = handle.wait() if handle is not None else None
    if finish is not None:
        finish()
    waited = time.perf_counter()
    # Every block ends with a full collection, timed: each kind pays for its own garbage (the
    # cost of walking the rest of the heap cancels against the none block), instead of a
    # later block of another kind paying for it (DCP's plans made ckptrepo's blocks 4 points
    # slower without this).
    gc.collect()
    end = time.perf_counter()
    block = Block(wall=end - start, cpu=time.process_time() - cpu0, stall=called - start, end_wait=waited - last,
                  steps=steps, collect=end - waited)
    if kind.cleanup is not None:
        kind.cleanup()
    if commit is None:
        return block, 0
    block.persist, block.slot_wait = commit.persist_s, commit.wait_s
    block.durable_in_time = called + commit.persist_s <= last
    return block, commit.stored_bytes


def pending(kinds: list[Kind]) -> list[int]:
    """Bytes stored raw and not yet repacked, per repository (0 for kinds without one)."""
    return [kd.repo.repack_pending()[1] if kd.repo is not None else 0 for kd in kinds]


def overhead(blocks: list[Block], base: list[Block], idx: list[int], metric: Callable[[Block], float]) -> float:
    """Mean (block - base block) over the mean base block, %, over the rounds ``idx``."""
    diff = sum(metric(blocks[i]) - metric(base[i]) for i in idx)
    return 100.0 * diff / sum(metric(base[i]) for i in idx)


HEAD = 10  # steps after the checkpoint that the local estimate charges to it
CHECK_HEAD = 20  # ... and the longer head it is checked against
BASELINE = 40  # steps after the head whose mean is the block's own undisturbed step time


def local_loss(b: Block, head: int = HEAD) -> float:
    """What the block's checkpoint cost the loop, measured against the block's own step time:
    the call, the wait and the collection at the end, plus how much the first ``head`` steps
    after the call took beyond the mean of the ``BASELINE`` steps that follow them (seconds).

    It assumes that the checkpoint has no effect on the steps past ``head`` (a repository's
    row says in how many blocks phase 2 was durable by then; an idle repack during a block
    would fall past it, and is reported apart: "idle repack during blocks"), and in exchange leaves out
    how fast the machine ran in this block compared with the blocks around it, which is most
    of the block estimate's noise (with no checkpoint at all, consecutive 16-s blocks of this
    VM differed by ~10% of a block, their local losses by ~0.7%: ``bench_step_noise.py``)."""
    tail = b.steps[head:head + BASELINE]
    if not tail:
        raise ValueError(f"a block of {len(b.steps)} steps has no baseline after a head of {head}")
    level = sum(tail) / len(tail)
    return b.stall + b.end_wait + b.collect + sum(s - level for s in b.steps[:head])


def local_overhead(blocks: list[Block], base: list[Block], idx: list[int], head: int = HEAD) -> float:
    """Mean over the rounds ``idx`` of (the block's ``local_loss`` - the base block's), over the
    mean base block, %: the block estimate (``overhead``) with each block's speed taken out."""
    diff = sum(local_loss(blocks[i], head) - local_loss(base[i], head) for i in idx)
    return 100.0 * diff / sum(base[i].wall for i in idx)


def local_difference(blocks: list[Block], other: list[Block], base: list[Block], idx: list[int]) -> float:
    """``blocks``' local overhead minus ``other``'s, in points, over the rounds ``idx``."""
    return local_overhead(blocks, base, idx) - local_overhead(other, base, idx)


def ratio_to(blocks: list[Block], other: list[Block], base: list[Block], idx: list[int]) -> float:
    """``blocks``' wall overhead over ``other``'s, over the rounds ``idx`` (inf if ``other``'s is <= 0)."""
    theirs = overhead(other, base, idx, wall)
    return overhead(blocks, base, idx, wall) / theirs if theirs > 0 else float("inf")


def difference(blocks: list[Block], other: list[Block], base: list[Block], idx: list[int]) -> float:
    """``blocks``' wall overhead minus ``other``'s, in points, over the rounds ``idx``."""
    return overhead(blocks, base, idx, wall) - overhead(other, base, idx, wall)


def verdict(over: float, hi: float) -> str:
    """CheckFreq's bound next to an overhead and the upper end of its 95% interval."""
    return ("goal <= 3.5  met (whole 95% interval)" if hi <= 3.5 else
            "goal <= 3.5  met by the mean, not by the whole 95% interval" if over <= 3.5 else
            "goal <= 3.5  MISSED")


def wall(b: Block) -> float:
    return b.wall


def cpu(b: Block) -> float:
    return b.cpu


def measure_k(k: int, rounds: int, trainer: Trainer, base: Path, variants: list[tuple[str, dict[str, str]]],
              peers: list[str], rng: random.Random,
              blocking: bool = False, prefilled: int = 0) -> tuple[list[tuple[str, float, str]], dict[str, Any]]:
    where = base / f"k{k}"
    where.mkdir()
    saver = TorchSave(where)
    kinds = [Kind("none"), Kind("torch.save", peer=saver, cleanup=saver.cleanup)]
    dcp = DcpAsync(where) if "dcp" in peers else None
    if dcp is not None:
        kinds.append(Kind("dcp.async_save", peer=dcp, cleanup=dcp.cleanup))
        dcp(trainer)()  # untimed: its first call sets up its planner and stager
        dcp.cleanup()
    if "copy" in peers:
        kinds.append(Kind("copy floor", peer=CopyFloor(trainer)))
    if "persist" in peers:
        floor = PersistFloor(trainer, where)
        kinds.append(Kind("persist floor", peer=floor, cleanup=floor.cleanup))
    if "hash" in peers:
        hashed = HashFloor(trainer, where, DEFAULT_CHUNK_SIZE)
        kinds.append(Kind("hash floor", peer=hashed, cleanup=hashed.cleanup))
    default = Kind("ckptrepo", repo=open_repo(where / "repo", trainer, {}, prefilled))
    kinds.append(default)
    kinds += [Kind(f"ckptrepo {name}", repo=open_repo(where / f"repo-{name}", trainer, env, prefilled))
              for name, env in variants]
    if blocking:
        kinds.append(Kind("ckptrepo blocking", repo=open_repo(where / "repo-blocking", trainer, {}, prefilled),
                          blocking=True))
    loads: list[ForeignLoad] = []
    started = time.perf_counter()
    try:
        trainer.step()  # untimed: the first commit must not repeat the warm-up's bytes
        for t in range(rounds):
            order = kinds[:]
            rng.shuffle(order)
            with ForeignLoad() as load:
                for kind in order:
                    before = pending(kinds)
                    block, stored = run_block(kind, trainer, k)
                    # What the idle repack encoded meanwhile: any drop of a repository's raw
                    # bytes, net of what this block's own commit added.
                    block.repacked = sum(max(0, b + (stored if kd is kind else 0) - a)
                                         for kd, b, a in zip(kinds, before, pending(kinds), strict=True))
                    kind.blocks.append(block)
            loads.append(load)
            if (t + 1) % max(1, rounds // 5) == 0 or t + 1 == rounds:
                none = kinds[0].blocks
                print(f"  k={k}: {t + 1}/{rounds} rounds ({time.perf_counter() - started:.0f} s): "
                      + ", ".join(f"{kd.name} {overhead(kd.blocks, none, list(range(t + 1)), wall):.1f}%"
                                  for kd in kinds[1:]), flush=True)
        repack: dict[str, tuple[float, float, int]] = {}
        indexed: dict[str, tuple[float, int]] = {}
        for kind in kinds:
            if kind.repo is None:
                continue
            # The commits' pending layouts (ckptrepo.db.pending), indexed as the first read would.
            cpu0 = time.process_time()
            n_layouts = layouts.index_pending(parts(kind.repo).sessions)
            indexed[kind.name] = (time.process_time() - cpu0, n_layouts)
            left = kind.repo.repack_pending()[1]
            cpu0, t0 = time.process_time(), time.perf_counter()
            try:
                kind.repo.repack()
            except (OSError, ckptrepo.errors.CkptError) as exc:  # e.g. a full disk: keep the rounds' figures
                print(f"  k={k}: the repack after the rounds failed ({exc}); its cost is not reported", flush=True)
                repack[kind.name] = (float("nan"), float("nan"), left)
                continue
            repack[kind.name] = (time.perf_counter() - t0, time.process_time() - cpu0, left)
    finally:
        for kind in kinds:
            if kind.repo is not None:
                kind.repo.close()
        if dcp is not None:
            dcp.close()

    none = kinds[0].blocks
    n = len(none)
    step = statistics.mean(b.wall for b in none) / k
    rows: list[tuple[str, float, str]] = [(f"k={k} no checkpointing, s/step", step,
                                           f"{n} rounds; block {k * step:.2f} s")]
    info: dict[str, Any] = {"rounds": n, "step_s": step, "foreign_cpu": [x.share for x in loads],
                            "foreign_write_mib_s": [x.write_mib_s for x in loads]}
    save = kinds[1].blocks
    dcp_blocks = kinds[2].blocks if dcp is not None else None
    floors = [kd for kd in kinds if kd.name in ("persist floor", "hash floor")]
    for kind in kinds[1:]:
        bl = kind.blocks
        idx = list(range(n))
        over, over_cpu = overhead(bl, none, idx, wall), overhead(bl, none, idx, cpu)
        lo, hi = bootstrap(functools.partial(overhead, bl, none, metric=wall), n, rng)
        per = [100.0 * (bl[i].wall / none[i].wall - 1.0) for i in idx]
        entry: dict[str, Any] = {"overhead_pct": over, "ci95": (lo, hi), "cpu_pct": over_cpu,
                                 "median_round_pct": statistics.median(per),
                                 "stall_s": statistics.mean(b.stall for b in bl)}
        note = f"95% CI {lo:.1f}..{hi:.1f}; median of rounds {statistics.median(per):.1f}; CPU {over_cpu:.1f}%"
        if kind.repo is not None:
            fits = sum(b.durable_in_time for b in bl) / n
            end_wait = statistics.mean(b.end_wait for b in bl)
            rep_s, rep_cpu, left = repack[kind.name]
            during = {kd.name: sum(b.repacked for b in kd.blocks) / MIB for kd in kinds}
            entry.update(fits=fits, end_wait_s=end_wait, slot_wait_s=statistics.mean(b.slot_wait for b in bl),
                         persist_s=statistics.mean(b.persist for b in bl), repack_after_s=rep_s,
                         repack_after_cpu_per_commit=rep_cpu / (n + 1), pending_mib=left / MIB,
                         repacked_mib_during=during)
            goal = verdict(over, hi)
            note = f"{goal}; {note}"
            if kind is not default:  # a variant: against the default repository, round by round
                diff = functools.partial(difference, bl, default.blocks, none)
                d_lo, d_hi = bootstrap(diff, n, rng)
                entry.update(minus_default=diff(idx), minus_default_ci95=(d_lo, d_hi))
                note += f"; minus ckptrepo {diff(idx):+.1f} points [{d_lo:+.1f}, {d_hi:+.1f}]"
            for floor_kind in floors:  # what ckptrepo adds to the least a durable (hashed) checkpoint costs
                diff = functools.partial(difference, bl, floor_kind.blocks, none)
                p_lo, p_hi = bootstrap(diff, n, rng)
                key = "minus_" + floor_kind.name.replace(" ", "_")
                entry.update({key: diff(idx), key + "_ci95": (p_lo, p_hi)})
                note += f"; minus the {floor_kind.name} {diff(idx):+.1f} points [{p_lo:+.1f}, {p_hi:+.1f}]"
            rows.append((f"k={k} {kind.name} overhead % (wall)", over, note))
            rows.append((f"k={k} {kind.name} stall / end wait s", entry["stall_s"],
                         f"end wait {end_wait:.3f} s; phase 2 done within the block in {100 * fits:.0f}% of blocks; "
                         f"persist {entry['persist_s']:.2f} s"))
            idx_cpu, idx_n = indexed[kind.name]
            entry.update(index_after_cpu_ms_per_commit=1e3 * idx_cpu / (n + 1), layouts_indexed_after=idx_n)
            rows.append((f"k={k} {kind.name} deferred indexing after the run, CPU-ms per commit",
                         entry["index_after_cpu_ms_per_commit"],
                         f"{idx_n} pending layouts indexed after the rounds (db.pending)"))
            rows.append((f"k={k} {kind.name} deferred encoding after the run, CPU-s per commit",
                         entry["repack_after_cpu_per_commit"],
                         f"{left / MIB:.0f} MiB left raw, repack {rep_s:.1f} s; idle repack during blocks (MiB): "
                         + ", ".join(f"{name} {mib:.0f}" for name, mib in during.items())))
            ts_lo, ts_hi = bootstrap(functools.partial(ratio_to, bl, save, none), n, rng)
            ts_over = overhead(save, none, idx, wall)
            ratio = over / ts_over if ts_over > 0 else float("nan")
            below = functools.partial(difference, bl, save, none)
            b_lo, b_hi = bootstrap(below, n, rng)
            entry.update(ratio_torch_save=ratio, ratio_ci95=(ts_lo, ts_hi), minus_torch_save=below(idx),
                         minus_torch_save_ci95=(b_lo, b_hi))
            rows.append((f"RATIO k={k} {kind.name} / torch.save overhead (wall)", ratio,
                         f"{goal_note(ts_hi, 1.0)} (upper end of the 95% interval {ts_lo:.2f}..{ts_hi:.2f}); "
                         f"overhead minus torch.save's {below(idx):+.1f} points [{b_lo:+.1f}, {b_hi:+.1f}]"))
            if dcp_blocks is not None:
                d_over = overhead(dcp_blocks, none, idx, wall)
                d_lo, d_hi = bootstrap(functools.partial(ratio_to, bl, dcp_blocks, none), n, rng)
                entry.update(ratio_dcp_async=over / d_over if d_over > 0 else float("nan"), ratio_dcp_ci95=(d_lo, d_hi))
                rows.append((f"RATIO k={k} {kind.name} / dcp.async_save overhead (wall)", entry["ratio_dcp_async"],
                             f"95% interval {d_lo:.2f}..{d_hi:.2f}; for comparison"))
        else:
            if kind.peer is not None and not isinstance(kind.peer, CopyFloor):
                note = f"{verdict(over, hi)}; {note}"
            rows.append((f"k={k} {kind.name} overhead % (wall)", over, note))
            rows.append((f"k={k} {kind.name} stall s", entry["stall_s"], ""))
        if k >= CHECK_HEAD + 20:
            rows += local_rows(k, kind, kinds, entry, idx, rng)
        info[kind.name] = entry
    shares = [x.share for x in loads]
    print(f"  k={k}: other processes took {100 * statistics.median(shares):.0f}% of the CPU "
          f"(max {100 * max(shares):.0f}%) over the rounds", flush=True)
    return rows, info


def local_rows(k: int, kind: Kind, kinds: list[Kind], entry: dict[str, Any], idx: list[int],
               rng: random.Random) -> list[tuple[str, float, str]]:
    """The local estimate's rows for ``kind`` (``local_loss``), its check with a longer head,
    and for a repository its differences from torch.save and the floors, with 95% intervals;
    also recorded in ``entry``."""
    none, bl, n = kinds[0].blocks, kind.blocks, len(idx)
    over = local_overhead(bl, none, idx)
    lo, hi = bootstrap(functools.partial(local_overhead, bl, none), n, rng)
    check = local_overhead(bl, none, idx, CHECK_HEAD)
    c_lo, c_hi = bootstrap(functools.partial(local_overhead, bl, none, head=CHECK_HEAD), n, rng)
    entry.update(local_pct=over, local_ci95=(lo, hi), local_head20_pct=check, local_head20_ci95=(c_lo, c_hi))
    note = (f"95% CI {lo:.2f}..{hi:.2f}; with a {CHECK_HEAD}-step head {check:.2f} [{c_lo:.2f}, {c_hi:.2f}]")
    if kind.repo is not None:
        # Whether phase 2 was durable before the head's last step ended (the estimate's premise).
        inside = sum(b.persist <= sum(b.steps[:HEAD]) for b in bl) / n
        entry["durable_in_head"] = inside
        note = f"{verdict(over, hi)}; {note}; phase 2 durable within the head in {100 * inside:.0f}% of blocks"
        for other in kinds[1:]:
            # Peers and floors; a variant also against the default repository kind.
            versus_default = other.name == "ckptrepo" and kind.name != "ckptrepo"
            if (other.repo is not None and not versus_default) or other.name == "copy floor":
                continue
            diff = functools.partial(local_difference, bl, other.blocks, none)
            d_lo, d_hi = bootstrap(diff, n, rng)
            key = "local_minus_" + other.name.replace(" ", "_").replace(".", "_")
            entry.update({key: diff(idx), key + "_ci95": (d_lo, d_hi)})
            note += f"; minus {other.name} {diff(idx):+.2f} points [{d_lo:+.2f}, {d_hi:+.2f}]"
    elif kind.peer is not None and not isinstance(kind.peer, CopyFloor):
        note = f"{verdict(over, hi)}; {note}"
    return [(f"k={k} {kind.name} local overhead % (first {HEAD} steps vs the next {BASELINE})", over, note)]


def _judged(e: dict[str, Any]) -> tuple[float, float]:
    """A kind's overhead at one k and the upper end of its 95% interval: the local estimate's
    where the k has one, else the block estimate's."""
    return (e["local_pct"], e["local_ci95"][1]) if "local_pct" in e else (e["overhead_pct"], e["ci95"][1])


def within_bound(per_k: dict[int, dict[str, Any]]) -> list[tuple[str, float, str]]:
    """Per method: the smallest k of the run whose overhead is within CheckFreq's 3.5% (by the
    whole 95% interval, else by the mean): how often it could checkpoint for that budget. Judged
    on the local estimate where the k has one (k >= 40), else on the block estimate."""
    names = list(dict.fromkeys(n for info in per_k.values() for n, e in info.items() if isinstance(e, dict)))
    rows = []
    for name in names:
        if name == "copy floor":
            continue
        found = [(k, info[name]) for k, info in sorted(per_k.items()) if name in info]
        strict = next((k for k, e in found if _judged(e)[1] <= 3.5), None)
        loose = next((k for k, e in found if _judged(e)[0] <= 3.5), None)
        rows.append((f"smallest k within 3.5%: {name}", float(strict or loose or "nan"),
                     f"whole 95% interval: {strict or 'none of ' + str([k for k, _ in found])}; "
                     f"by the mean: {loose or 'none'}"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", type=int, nargs="+", default=list(ROUNDS), help="checkpoint intervals (10 50 200)")
    ap.add_argument("--rounds", type=int, default=None,
                    help=f"rounds of blocks per k (default {ROUNDS}; --quick 20)")
    ap.add_argument("--quick", action="store_true", help="k=50 only, 20 rounds (~6 minutes)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:CKPT_VAR=VALUE",
                    help="add blocks of ckptrepo with these environment settings (repeatable)")
    ap.add_argument("--blocking", action="store_true",
                    help="add blocks of ckptrepo committing with blocking=True (phase 2 in the call)")
    ap.add_argument("--peers", nargs="*", default=["dcp", "copy"], choices=["dcp", "copy", "persist", "hash"],
                    help="peers besides torch.save: dcp.async_save, the copy floor, the persist floor, "
                         "the hash floor (default: dcp, copy)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the block order and the bootstrap")
    ap.add_argument("--prefill", type=int, default=0, metavar="N",
                    help="first give each repository N commits of a small state with the same tensor names "
                         "(a catalog the size of a longer run's)")
    add_model_args(ap)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir under /work)")
    args = ap.parse_args()
    if args.quick:
        args.ks = [50]
    variants = [parse_variant(v) for v in args.variant]
    rng = random.Random(args.seed)
    trainer = Trainer.warmed(args)
    print(f"load average at start {os.getloadavg()[0]:.1f}; model {trainer.params() / 1e6:.1f}M params, state "
          f"{trainer.state_mib():.0f} MiB; torch threads {torch.get_num_threads()}, cpus {os.cpu_count()}", flush=True)
    rows: list[tuple[str, float, str]] = []
    extra: dict[str, Any] = {"ks": args.ks, "seed": args.seed, "variants": args.variant, "prefill": args.prefill,
                             "per_k": {}}
    with scratch_dir(args.dir) as base:
        for k in args.ks:
            rounds = args.rounds or (20 if args.quick else ROUNDS.get(k, 10))
            r, info = measure_k(k, rounds, trainer, base, variants, args.peers, rng, args.blocking, args.prefill)
            rows += r
            extra["per_k"][k] = info
    rows += within_bound(extra["per_k"])
    report("training overhead of checkpointing every k steps, paired blocks (mean, 95% bootstrap interval)",
           rows, extra)


if __name__ == "__main__":
    main()
