"""What each spawned rank of ``bench_distributed.py`` runs (gloo on loopback, CPU).

``start(phase, world, cfg)`` spawns ``world`` processes that each run ``rank_main``: join a gloo
group (world 1: none, DCP with ``no_dist=True``), run one phase, and rank 0 writes the phase's
samples as JSON for the driver. Every measurement goes through ``Harness.measure``: untimed
preparation on every rank, rank 0 waits until other processes leave the machine alone (their
CPU and disk writes: everything but this run's own processes), a barrier, the timed call on
every rank from that common start, then the per-key maximum over ranks (the slowest rank) is
kept; a measurement during which other processes took more than the limits is run again (up
to ``retries`` times).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import sys
import time
import traceback
from collections import defaultdict
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MIB = 1 << 20
Times = dict[str, float]


# -- the machine: what processes other than this run's take --------------------------------


def _pid_figures(pid: int) -> tuple[float, float]:
    """CPU ticks (all threads) and bytes sent to storage of process ``pid`` (0 when gone)."""
    try:
        own = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0
    return float(int(own[11]) + int(own[12])), float(int(io["write_bytes"]) - int(io["cancelled_write_bytes"]))


class GroupLoad:
    """What processes other than ``pids`` took of this machine while a block ran (Linux /proc):
    ``share`` of all cores' CPU (0.0 .. 1.0) and ``write_mib_s`` written to disk (disk-wide
    writes minus those of ``pids``). ``_common.ForeignLoad`` for a group of processes: the
    other ranks of this run are not foreign."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.share = float("nan")
        self.write_mib_s = float("nan")
        self._start: tuple[float, float, float, float] | None = None

    def _sample(self) -> tuple[float, float, float, float] | None:
        try:
            fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
            disks = {p.name for p in Path("/sys/block").iterdir() if not p.name.startswith(("loop", "zram", "ram"))}
            sectors = sum(int(line.split()[9]) for line in Path("/proc/diskstats").read_text().splitlines()
                          if line.split()[2] in disks)
        except (OSError, ValueError, IndexError):
            return None
        ticks = [int(x) for x in fields]
        busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
        own = [_pid_figures(p) for p in self.pids]
        return float(busy), sum(c for c, _ in own), 512.0 * sectors - sum(w for _, w in own), time.monotonic()

    def start(self) -> GroupLoad:
        self._start = self._sample()
        return self

    def stop(self) -> GroupLoad:
        end = self._sample()
        if self._start is None or end is None:
            return self
        wall = end[3] - self._start[3]
        if wall > 0:
            foreign = (end[0] - self._start[0]) - (end[1] - self._start[1])
            self.share = max(0.0, foreign / os.sysconf("SC_CLK_TCK") / (wall * (os.cpu_count() or 1)))
            self.write_mib_s = max(0.0, (end[2] - self._start[2]) / MIB / wall)
        return self

    def noisy(self, max_share: float, max_write: float) -> bool:
        return self.share > max_share or self.write_mib_s > max_write


def wait_quiet(pids: list[int], max_share: float, max_write: float, timeout: float, probe: float = 0.5) -> float:
    """Wait (up to ``timeout`` s) until processes other than ``pids`` leave the CPU and the disk
    alone over a ``probe``-second sample; the seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        load = GroupLoad(pids).start()
        time.sleep(probe)
        if not load.stop().noisy(max_share, max_write):
            break
    return time.monotonic() - start


def write_bytes() -> int:
    """Bytes this process (all its threads) sent to storage so far (``/proc/self/io``)."""
    io = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(io["write_bytes"]) - int(io["cancelled_write_bytes"])


def peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_model() -> str:
    try:
        import subprocess

        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


# -- ranks -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(phase: str, world: int, cfg: dict[str, Any], timeout: float = 7200.0) -> dict[str, Any]:
    """Run ``phase`` on ``world`` spawned ranks; rank 0's results (raises if a rank failed)."""
    out = Path(cfg["base"]) / f"result-{phase}.json"
    out.unlink(missing_ok=True)
    cfg = {**cfg, "driver_pid": os.getpid()}
    ctx = mp.start_processes(rank_main, args=(world, free_port(), phase, cfg, str(out)), nprocs=world, join=False,
                             start_method="spawn")
    end = time.monotonic() + timeout
    while not ctx.join(timeout=max(0.1, end - time.monotonic())):
        if time.monotonic() > end:
            for p in ctx.processes:
                p.kill()
            raise TimeoutError(f"phase {phase} on {world} ranks did not finish in {timeout} s")
    return dict(json.loads(out.read_text()))


def rank_main(rank: int, world: int, port: int, phase: str, cfg: dict[str, Any], out: str) -> None:
    # No background repack between commits: it would run while the peers are measured (encoding
    # is deferred by default: new chunks are stored raw, the note in the driver's docstring).
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), CKPT_IDLE_REPACK="0")
    torch.set_num_threads(1)  # two ranks on two cores
    import warnings

    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=900))
    try:
        h = Harness(rank, world, cfg)
        result = PHASES[phase](h, Path(cfg["base"]), cfg)
        result.update(samples=dict(h.samples), foreign=h.foreign, foreign_write=h.foreign_write, thrown=h.thrown,
                      waited=h.waited, peak_rss=h.gather(float(peak_rss())))
        if rank == 0:
            Path(out).write_text(json.dumps(result))
        # The gloo thread that ran the last gather releases its tensors after the gather returns;
        # a rank already finalizing the interpreter then aborts ("terminate called without an
        # active exception"). A barrier (no Python tensors) lets that happen first.
        h.barrier()
    except BaseException:
        traceback.print_exc(file=sys.stderr)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class Harness:
    """Collectives that are no-ops without a group, and ``measure``."""

    def __init__(self, rank: int, world: int, cfg: dict[str, Any]) -> None:
        self.rank, self.world, self.cfg = rank, world, cfg
        self.pids = [int(p) for p in self.gather(float(os.getpid()))] + [int(cfg["driver_pid"])]
        self.samples: dict[str, list[float]] = defaultdict(list)
        self.foreign: list[float] = []
        self.foreign_write: list[float] = []
        self.thrown = 0
        self.waited = 0.0

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def gather(self, value: Any) -> list[Any]:
        if self.world == 1:
            return [value]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, value)
        return out

    def bcast(self, value: Any) -> Any:
        if self.world == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def say(self, text: str) -> None:
        if self.rank == 0:
            print(text, flush=True)

    def measure(self, prefix: str, run: Callable[[Any], Times], prep: Callable[[], Any] | None = None,
                cleanup: Callable[[Any], None] | None = None, *, keep: bool = True) -> Times:
        """``prep()`` (untimed, every rank), a quiet machine, a barrier, ``run(prepared)`` on every
        rank (it returns named figures, seconds measured on this rank from the common start); the
        maximum of each over the ranks is recorded as ``prefix_name`` (unless not ``keep``) and
        returned. Run again, at most ``retries`` times, when other processes took more than the
        limits meanwhile."""
        cfg = self.cfg
        thrown = 0
        while True:
            ready = prep() if prep is not None else None
            if self.rank == 0:
                self.waited += wait_quiet(self.pids, cfg["max_foreign"], cfg["max_write"], cfg["quiet_timeout"])
            self.barrier()
            load = GroupLoad(self.pids).start() if self.rank == 0 else None
            times = run(ready)
            self.barrier()
            again = False
            if load is not None:
                load.stop()
                again = load.noisy(cfg["max_foreign"], cfg["max_write"]) and thrown < cfg["retries"]
            again = bool(self.bcast(again))
            if cleanup is not None:
                cleanup(ready)
            if not again:
                break
            thrown += 1
        self.thrown += thrown
        slowest = {k: max(g[k] for g in self.gather(times)) for k in times}
        if keep:
            for k, v in slowest.items():
                self.samples[f"{prefix}_{k}"].append(v)
            if load is not None:
                self.foreign.append(load.share)
                self.foreign_write.append(load.write_mib_s)
        return slowest


# -- the model: an FSDP2 language model with AdamW --------------------------------------------


class LM(torch.nn.Module):
    """Embedding, residual MLP blocks, output head: the embedding and head weights (and their
    AdamW moments) are the large tensors, like a language model's."""

    def __init__(self, vocab: int, dim: int, hidden: int, blocks: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, dim))
            for _ in range(blocks))
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


class Trainer:
    """The model (FSDP2 over the default group when ``sharded``), AdamW, and a training step."""

    def __init__(self, cfg: dict[str, Any], sharded: bool, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.cfg = cfg
        self.model = LM(cfg["vocab"], cfg["dim"], cfg["hidden"], cfg["blocks"])
        if sharded:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (dist.get_world_size(),))
            for m in [self.model.embed, *self.model.blocks, self.model.head]:
                fully_shard(m, mesh=mesh)
            fully_shard(self.model, mesh=mesh)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.gen = torch.Generator().manual_seed(seed + 1 + (dist.get_rank() if dist.is_initialized() else 0))
        self.steps = 0

    def step(self) -> None:
        """One training step: every parameter and both moments of each change."""
        ids = torch.randint(0, self.cfg["vocab"], (4, 32), generator=self.gen)
        logits = self.model(ids)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.roll(1, 1).flatten())
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.steps += 1

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(self.model, self.opt)
        return {"model": msd, "optim": osd}

    def full_state_dict(self, cpu_offload: bool) -> dict[str, Any]:
        """The unsharded state (plain tensors); with ``cpu_offload`` on rank 0 only."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        msd, osd = get_state_dict(self.model, self.opt,
                                  options=StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload))
        return {"model": msd, "optim": osd}


def tensors(state: Any) -> list[torch.Tensor]:
    """Every tensor of a nested state (DTensors as their local shards)."""
    from torch.distributed.tensor import DTensor

    if isinstance(state, DTensor):
        return [state.to_local()]
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for v in state.values() for t in tensors(v)]
    if isinstance(state, list | tuple):
        return [t for v in state for t in tensors(v)]
    return []


def nbytes(state: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors(state))


def logical_bytes(state: Any) -> int:
    """Bytes of the global tensors (a DTensor counts its full shape)."""
    from torch.distributed.tensor import DTensor

    if isinstance(state, DTensor):
        return state.numel() * state.element_size()
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(logical_bytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(logical_bytes(v) for v in state)
    return 0


def fsync_tree(path: Path) -> None:
    """fsync a directory and its parent (DCP's FileSystemWriter fsyncs its files, not these)."""
    for p in (path, path.parent):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# -- phase "save": world 2, items 1-5 -----------------------------------------------------------


class Repos:
    """Repositories opened on every rank: rank 0 creates, the others open after a barrier."""

    def __init__(self, h: Harness) -> None:
        self.h = h

    def make(self, where: Path) -> Any:
        import ckptrepo

        if self.h.rank == 0:
            ckptrepo.Repo.init(where, idle_repack=False).close()
        self.h.barrier()
        return ckptrepo.Repo.open(where, idle_repack=False)

    def drop(self, repo: Any, where: Path) -> None:
        repo.close()
        self.h.barrier()
        if self.h.rank == 0:
            shutil.rmtree(where, ignore_errors=True)
        self.h.barrier()


def phase_save(h: Harness, base: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    from ckptrepo.dcp import Writer, commit_id

    repos = Repos(h)
    trainer = Trainer(cfg, sharded=True)
    for _ in range(2):  # the moments exist
        trainer.step()
    sd = trainer.state_dict()
    info: dict[str, Any] = {"logical": logical_bytes(sd), "local": h.gather(float(nbytes(sd))),
                            "n_tensors": len(tensors(sd)),
                            "big": sorted((k, logical_bytes(v)) for k, v in sd["model"].items()
                                          if logical_bytes(v) >= cfg["big"])}
    h.say(f"  state: {info['logical'] / MIB:.0f} MiB over {info['n_tensors']} tensors "
          f"(per rank {', '.join(f'{x / MIB:.0f}' for x in info['local'])} MiB); "
          f"{len(info['big'])} model tensors >= {cfg['big'] / MIB:.0f} MiB (and their 2 moments each)")
    counter = iter(range(10**9))

    def fresh_dir(tag: str) -> Path:
        return base / f"{tag}-{next(counter)}"  # the same on every rank: they call it in step

    def rm_dir(where: Path) -> None:
        h.barrier()
        if h.rank == 0:
            shutil.rmtree(where, ignore_errors=True)
        h.barrier()

    steady_path = base / "steady"
    steady = repos.make(steady_path)
    native_path = base / "native"
    native = repos.make(native_path)

    # -- item 1: dcp.save, Writer vs FileSystemWriter ---------------------------------------
    def save_ckpt(repo: Any, state: Any) -> Times:
        writer = Writer(repo, step=trainer.steps)
        start = time.perf_counter()
        dcp.save(state, storage_writer=writer)
        return {"t": time.perf_counter() - start}

    def save_fs(where: Path, state: Any) -> Times:
        writer = FileSystemWriter(str(where))  # DCP's default: sync_files=True
        start = time.perf_counter()
        dcp.save(state, storage_writer=writer)
        took = time.perf_counter() - start
        h.barrier()
        start = time.perf_counter()
        if h.rank == 0:
            fsync_tree(where)
        return {"t": took, "dirsync": time.perf_counter() - start}

    def fresh_repo_prep() -> tuple[Any, Path]:
        where = fresh_dir("fresh-repo")
        return repos.make(where), where

    def fresh_ckpt() -> None:
        h.measure("fresh_ckpt", lambda r: save_ckpt(r[0], sd), fresh_repo_prep, lambda r: repos.drop(*r))

    def fresh_fs() -> None:
        h.measure("fresh_fs", lambda w: save_fs(w, sd), lambda: fresh_dir("fresh-fs"), rm_dir)

    def stepped() -> Any:
        trainer.step()  # every tensor changes (not timed: the training loop's work)
        return trainer.state_dict()

    def steady_ckpt() -> None:
        h.measure("steady_ckpt", lambda s: save_ckpt(steady, s), stepped)

    def steady_fs() -> None:
        def prep() -> tuple[Path, Any]:
            return fresh_dir("steady-fs"), stepped()

        h.measure("steady_fs", lambda r: save_fs(r[0], r[1]), prep, lambda r: rm_dir(r[0]))

    # -- item 2: dcp.async_save -------------------------------------------------------------
    def async_run(writer: Any, state: Any) -> Times:
        start = time.perf_counter()
        future = dcp.async_save(state, storage_writer=writer)
        blocked = time.perf_counter() - start
        future.result()
        return {"block": blocked, "done": time.perf_counter() - start}

    def async_ckpt() -> None:
        def prep() -> tuple[Any, Any]:
            state = stepped()
            return Writer(steady, step=trainer.steps), state

        h.measure("async_ckpt", lambda r: async_run(*r), prep)

    def async_fs() -> None:
        def prep() -> tuple[Any, Any, Path]:
            state = stepped()
            where = fresh_dir("async-fs")
            return FileSystemWriter(str(where)), state, where

        h.measure("async_fs", lambda r: async_run(r[0], r[1]), prep, lambda r: rm_dir(r[2]))

    # -- item 3: Repo.commit on every rank vs a copy of the local shards ------------------------
    native_state = {"model": trainer.model, "optim": trainer.opt}

    def local_parts() -> list[torch.Tensor]:
        return tensors({"model": trainer.model.state_dict(), "optim": trainer.opt.state_dict()})

    floor_bufs = [torch.empty_like(t) for t in local_parts()]
    for b, t in zip(floor_bufs, local_parts(), strict=True):
        b.copy_(t)  # faulted in: a preallocated buffer

    def native_run(_: Any) -> Times:
        start = time.perf_counter()
        handle = native.commit(native_state, step=trainer.steps)
        blocked = time.perf_counter() - start
        commit = handle.wait()
        return {"block": blocked, "durable": time.perf_counter() - start, "stall_s": commit.stall_s,
                "persist_s": commit.persist_s, "new": float(commit.new_bytes)}

    def native_ckpt() -> None:
        h.measure("native", native_run, stepped)

    def floor_run(parts: list[torch.Tensor]) -> Times:
        start = time.perf_counter()
        for b, t in zip(floor_bufs, parts, strict=True):
            b.copy_(t)
        return {"t": time.perf_counter() - start}

    def floor() -> None:
        def prep() -> list[torch.Tensor]:
            stepped()
            return local_parts()

        h.measure("floor", floor_run, prep)

    # -- item 4: a replicated state ---------------------------------------------------------
    replicated = trainer.full_state_dict(cpu_offload=False)  # plain tensors, equal on every rank
    rep_bytes = logical_bytes(replicated)

    def written(save: Callable[[], Any]) -> Times:
        before, start = write_bytes(), time.perf_counter()
        save()
        took = time.perf_counter() - start
        return {"t": took, "written": float(write_bytes() - before)}

    def rep_ckpt() -> None:
        got: dict[str, Any] = {}

        def save(repo: Any) -> None:
            writer = Writer(repo, step=0)
            got["cid"] = commit_id(dcp.save(replicated, storage_writer=writer))
            got["commit"] = writer.commit

        def run(r: tuple[Any, Path]) -> Times:
            out = written(lambda: save(r[0]))
            per_rank = h.gather(out["written"])
            logical = h.bcast(got["commit"].logical_bytes if got.get("commit") is not None else 0)
            out.update(busiest=max(per_rank), total=float(sum(per_rank)), logical=float(logical),
                       **{f"rank{i}": float(w) for i, w in enumerate(per_rank)})
            return out

        h.measure("rep_ckpt", run, fresh_repo_prep, lambda r: repos.drop(*r))

    def rep_fs() -> None:
        def run(where: Path) -> Times:
            out = written(lambda: dcp.save(replicated, storage_writer=FileSystemWriter(str(where))))
            per_rank = h.gather(out["written"])
            out.update(busiest=max(per_rank), total=float(sum(per_rank)),
                       **{f"rank{i}": float(w) for i, w in enumerate(per_rank)})
            return out

        h.measure("rep_fs", run, lambda: fresh_dir("rep-fs"), rm_dir)

    # -- warm-up (not kept): planners, the first commits, the staging arena ----------------------
    h.say("  warm-up ...")
    h.measure("", lambda s: save_ckpt(steady, s), stepped, keep=False)
    h.measure("", lambda w: save_fs(w, sd), lambda: fresh_dir("warm-fs"), rm_dir, keep=False)
    h.measure("", lambda r: async_run(*r), lambda: (Writer(steady, step=trainer.steps), stepped()), keep=False)
    h.measure("", native_run, stepped, keep=False)  # allocates the staging arena
    h.measure("", floor_run, lambda: (stepped(), local_parts())[1], keep=False)

    pairs = [(fresh_ckpt, fresh_fs), (steady_ckpt, steady_fs), (async_ckpt, async_fs), (native_ckpt, floor),
             (rep_ckpt, rep_fs)]
    for r in range(cfg["rounds"]):
        for ours, peer in pairs:
            for fn in ((ours, peer) if r % 2 == 0 else (peer, ours)):
                fn()
        s = h.samples
        h.say(f"  round {r + 1}/{cfg['rounds']}: dcp.save fresh {s['fresh_ckpt_t'][-1]:.2f} / "
              f"{s['fresh_fs_t'][-1]:.2f} s, steady {s['steady_ckpt_t'][-1]:.2f} / {s['steady_fs_t'][-1]:.2f} s; "
              f"async block "
              f"{s['async_ckpt_block'][-1]:.3f} / {s['async_fs_block'][-1]:.3f} s; commit() "
              f"{s['native_block'][-1]:.3f} s vs copy {s['floor_t'][-1]:.3f} s; replicated busiest "
              f"{s['rep_ckpt_busiest'][-1] / MIB:.0f} MiB of {rep_bytes / MIB:.0f}")

    # -- item 5: the state committed at 2 ranks, re-committed from one process ------------------
    # A last training step, then one save through each writer: the checkpoints phase "load1"
    # loads at world size 1.
    state = stepped()
    h.barrier()
    saved_rev = commit_id(dcp.save(state, storage_writer=Writer(steady, step=trainer.steps, message="saved at 2")))
    fs2 = base / "fs-2"
    dcp.save(state, storage_writer=FileSystemWriter(str(fs2)))
    full = trainer.full_state_dict(cpu_offload=True)  # on rank 0
    single: dict[str, Any] = {}
    if h.rank == 0:
        flat = {f"model/{k}": v for k, v in full["model"].items()}
        for fqn, moments in full["optim"]["state"].items():
            for name, v in moments.items():
                flat[f"optim/{fqn}/{name}"] = v
        big = {k: v for k, v in flat.items() if isinstance(v, torch.Tensor) and logical_bytes(v) >= cfg["big"]}
        one = steady.commit(big, branch="single-big", parents=[saved_rev], blocking=True).wait()
        every = steady.commit(full, branch="single-all", parents=[saved_rev], blocking=True).wait()
        single = {"big_new": one.new_bytes, "big_logical": one.logical_bytes, "big_n": len(big),
                  "all_new": every.new_bytes, "all_logical": every.logical_bytes,
                  "saved_logical": steady.get_commit(saved_rev).logical_bytes}
        # The distributed commit restores bit-exactly (a check, not a figure).
        restored = steady.checkout(saved_rev)
        for k, v in full["model"].items():
            assert torch.equal(restored["model"][k], v), k
        del restored
    del full
    h.barrier()
    native.close()
    steady.close()
    return {"info": info, "rep_bytes": rep_bytes, "single": single, "saved_rev": saved_rev,
            "fs2": str(fs2), "steady": str(steady_path)}


# -- loads at another world size ------------------------------------------------------------------


def _load_pair(h: Harness, cfg: dict[str, Any], trainer: Trainer, repo: Any, rev: str, fs: Path,
               tag: str) -> None:
    """dcp.load of ``rev`` (Reader) and of ``fs`` (FileSystemReader) into ``trainer``'s state
    dict, in alternation; checked equal first (each load then warms its page cache)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    from ckptrepo.dcp import Reader

    no_dist = h.world == 1

    def zeroed() -> Any:
        state = trainer.state_dict()
        for t in tensors(state):
            t.zero_()
        return state

    def load_ckpt(state: Any) -> Times:
        reader = Reader(repo, rev)
        start = time.perf_counter()
        dcp.load(state, storage_reader=reader, no_dist=no_dist)
        return {"t": time.perf_counter() - start}

    def load_fs(state: Any) -> Times:
        reader = FileSystemReader(str(fs))
        start = time.perf_counter()
        dcp.load(state, storage_reader=reader, no_dist=no_dist)
        return {"t": time.perf_counter() - start}

    a = zeroed()
    h.measure("", load_ckpt, lambda: a, keep=False)
    a_vals = [t.clone() for t in tensors(a)]
    b = zeroed()
    h.measure("", load_fs, lambda: b, keep=False)
    same = all(torch.equal(x, y) for x, y in zip(a_vals, tensors(b), strict=True))
    assert all(h.gather(same)), f"{tag}: the Reader's and FileSystemReader's loads differ"
    del a_vals
    for r in range(cfg["rounds"]):
        for name, fn in ((("ckpt", load_ckpt), ("fs", load_fs)) if r % 2 == 0
                         else (("fs", load_fs), ("ckpt", load_ckpt))):
            h.measure(f"{tag}_{name}", fn, zeroed)
        h.say(f"  round {r + 1}/{cfg['rounds']}: dcp.load {tag} Reader {h.samples[f'{tag}_ckpt_t'][-1]:.3f} s, "
              f"FileSystemReader {h.samples[f'{tag}_fs_t'][-1]:.3f} s")


def phase_load1(h: Harness, base: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    """World 1, no process group: load the 2-rank checkpoints; then save the 1-rank ones."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    import ckptrepo
    from ckptrepo.dcp import Writer, commit_id

    trainer = Trainer(cfg, sharded=False, seed=7)
    trainer.step()  # the moments exist: the load fills them
    with ckptrepo.Repo.open(cfg["steady"], idle_repack=False) as repo:
        _load_pair(h, cfg, trainer, repo, cfg["saved_rev"], Path(cfg["fs2"]), "load21")
        trainer.step()
        state = trainer.state_dict()
        rev1 = commit_id(dcp.save(state, storage_writer=Writer(repo, branch="world1", step=trainer.steps),
                                  no_dist=True))
        fs1 = base / "fs-1"
        dcp.save(state, storage_writer=FileSystemWriter(str(fs1)), no_dist=True)
    return {"rev1": rev1, "fs1": str(fs1)}


def phase_load2(h: Harness, base: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    """World 2: load the 1-rank checkpoints into the FSDP2 model."""
    import ckptrepo

    trainer = Trainer(cfg, sharded=True, seed=11)
    trainer.step()
    with ckptrepo.Repo.open(cfg["steady"], idle_repack=False) as repo:
        _load_pair(h, cfg, trainer, repo, cfg["rev1"], Path(cfg["fs1"]), "load12")
    return {}


PHASES: dict[str, Callable[[Harness, Path, dict[str, Any]], dict[str, Any]]] = {
    "save": phase_save, "load1": phase_load1, "load2": phase_load2,
}
