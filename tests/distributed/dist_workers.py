"""What each rank of the distributed tests runs (spawned processes on gloo, CPU).

``run_ranks`` starts ``world`` processes that each call ``rank_main``, which joins a gloo group
on a free loopback port and runs one named scenario. Scenarios build their tensors from seeds,
so any process can rebuild the full reference values (``reference``) to compare against.
"""

from __future__ import annotations

import os
import socket
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SHAPES = {"w0": (37, 24), "w1": (16, 33), "b": (7,), "big": (640, 96), "pair": (32, 64)}  # pair: 2 chunks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(scenario: str, world: int, path: Path, *args: Any, timeout: float = 180.0) -> None:
    """Run ``scenario`` on ``world`` spawned ranks; raise if any rank failed or it timed out."""
    port = free_port()
    ctx = mp.start_processes(rank_main, args=(world, port, scenario, str(path), args), nprocs=world, join=False,
                             start_method="spawn")
    import time

    end = time.monotonic() + timeout
    while not ctx.join(timeout=max(0.1, end - time.monotonic())):
        if time.monotonic() > end:
            for p in ctx.processes:
                p.kill()
            raise TimeoutError(f"scenario {scenario} on {world} ranks did not finish in {timeout} s")


def rank_main(rank: int, world: int, port: int, scenario: str, path: str, args: tuple[Any, ...]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), CKPT_IDLE_REPACK="0")
    torch.set_num_threads(1)
    # A bounded wait: a rank whose peer died must fail, not hang (the kill tests check it).
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    try:
        SCENARIOS[scenario](rank, world, Path(path), *args)
        # The gloo thread that ran the scenario's last collective releases its tensors after the
        # call returns; a rank already finalizing the interpreter then aborts ("terminate called
        # without an active exception"). A barrier (no Python tensors) lets that happen first.
        dist.barrier()
    except BaseException:
        traceback.print_exc(file=sys.stderr)
        raise
    finally:
        dist.destroy_process_group()
    # Even so, gloo's threads sometimes still hold a tensor when the interpreter finalizes, and
    # the rank aborts after its scenario passed (SIGABRT, about once per full run of these tests):
    # a rank that succeeded leaves without running the interpreter's and C++'s exit handlers.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def reference(seed: int = 0) -> dict[str, torch.Tensor]:
    """The full tensors every scenario starts from."""
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=g) for name, shape in SHAPES.items()}


def _mesh(world: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world,))


def _placements(kind: str) -> Any:
    from torch.distributed.tensor import Replicate, Shard

    return {"shard0": [Shard(0)], "shard1": [Shard(1)], "replicate": [Replicate()]}[kind]


def dtensors(world: int, kind: str, seed: int = 0) -> dict[str, Any]:
    """The reference tensors distributed with ``kind`` placements (1-D ones always Shard(0))."""
    from torch.distributed.tensor import distribute_tensor

    mesh = _mesh(world)
    out = {}
    for name, t in reference(seed).items():
        placements = _placements("shard0" if t.dim() == 1 and kind == "shard1" else kind)
        out[name] = distribute_tensor(t, mesh, placements)
    return out


def save_dtensors(rank: int, world: int, path: Path, kind: str, how: str, seed: int) -> None:
    """``dcp.save`` (``how``: save, async) of DTensors through the Writer; rank 0 writes the id."""
    import torch.distributed.checkpoint as dcp

    import ckptrepo
    from ckptrepo.dcp import Writer, commit_id

    with ckptrepo.Repo.open(path) as repo:
        state = {"t": dtensors(world, kind, seed), "step": 5, "lr": [0.1, 0.01]}
        writer = Writer(repo, step=seed, message=f"{kind} on {world}")
        if how == "async":
            future = dcp.async_save(state, storage_writer=writer)
            metadata = future.result()
        else:
            metadata = dcp.save(state, storage_writer=writer)
        cid = commit_id(metadata)
        ids: list[Any] = [None] * world
        dist.all_gather_object(ids, cid)
        assert len(set(ids)) == 1, ids  # every rank knows the one commit
        if rank == 0:
            (path / f"commit-{kind}-{how}-{world}.txt").write_text(cid)


def load_dtensors(rank: int, world: int, path: Path, rev: str, kind: str, seed: int) -> None:
    """``dcp.load`` of commit ``rev`` into DTensors of ``kind`` on ``world`` ranks; each rank checks
    its local shards against the reference."""
    import torch.distributed.checkpoint as dcp

    import ckptrepo
    from ckptrepo.dcp import Reader

    with ckptrepo.Repo.open(path) as repo:
        target = {"t": {k: _zeros_like(v) for k, v in dtensors(world, kind, seed + 1).items()},
                  "step": 0, "lr": []}
        dcp.load(target, storage_reader=Reader(repo, rev))
        expected = dtensors(world, kind, seed)
        for name, value in target["t"].items():
            assert torch.equal(value.to_local(), expected[name].to_local()), (rank, name)
        assert target["step"] == 5 and target["lr"] == [0.1, 0.01]


def _zeros_like(t: Any) -> Any:
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        return DTensor.from_local(torch.zeros_like(t.to_local()), t.device_mesh, t.placements, run_check=False,
                                  shape=t.shape, stride=t.stride())
    return torch.zeros_like(t)


def _fsdp_model(world: int, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 257), torch.nn.ReLU(), torch.nn.Linear(257, 33))
    if world > 1 or dist.is_initialized():
        mesh = _mesh(world)
        for m in model:
            if isinstance(m, torch.nn.Linear):
                fully_shard(m, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    torch.manual_seed(seed + 100)
    for _ in range(2):
        model(torch.randn(8, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def save_fsdp(rank: int, world: int, path: Path, seed: int) -> None:
    """An FSDP2 model and AdamW trained two steps, saved through the Writer; rank 0 stores the
    full state (``get_state_dict`` with full tensors) for the loaders to compare with."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    import ckptrepo
    from ckptrepo.dcp import Writer, commit_id

    model, opt = _fsdp_model(world, seed)
    msd, osd = get_state_dict(model, opt)
    with ckptrepo.Repo.open(path) as repo:
        cid = commit_id(dcp.save({"model": msd, "optim": osd}, storage_writer=Writer(repo, step=2)))
    full_m, full_o = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save({"model": full_m, "optim": full_o, "commit": cid}, path / f"fsdp-{world}.pt")


def load_fsdp(rank: int, world: int, path: Path, saved_world: int, seed: int) -> None:
    """Load the FSDP2 commit saved at ``saved_world`` into a fresh FSDP2 model on ``world`` ranks
    and compare its full state with the saved one."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    import ckptrepo
    from ckptrepo.dcp import Reader

    saved = torch.load(path / f"fsdp-{saved_world}.pt", weights_only=False)
    model, opt = _fsdp_model(world, seed + 7)
    msd, osd = get_state_dict(model, opt)
    with ckptrepo.Repo.open(path) as repo:
        state = {"model": msd, "optim": osd}
        dcp.load(state, storage_reader=Reader(repo, saved["commit"]))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    full_m, full_o = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        for k, v in saved["model"].items():
            assert torch.equal(full_m[k], v), k
        for k, v in saved["optim"]["state"].items():
            for name, x in v.items():
                assert torch.equal(full_o["state"][k][name], x), (k, name)


def native_commit(rank: int, world: int, path: Path, kind: str, seed: int) -> None:
    """``Repo.commit`` on every rank: DTensors of ``kind`` plus a large replicated plain tensor;
    every rank's handle returns the same commit; rank 0 writes its id and the bytes each rank's
    share wrote."""
    import ckptrepo

    with ckptrepo.Repo.open(path) as repo:
        g = torch.Generator().manual_seed(seed)
        plain = torch.randn(512, 512, generator=g)  # 1 MiB, the same on every rank: replicated
        state = {"t": dtensors(world, kind, seed), "replicated": plain, "epoch": 3}
        handle = repo.commit(state, step=seed, message="native")
        state["t"]["w0"].to_local().zero_()  # phase 1 copied it: changing it now changes nothing stored
        plain.zero_()
        commit = handle.wait()
        assert 0 < commit.stall_s < 60 and commit.persist_s > 0, commit  # the coordinator's phase 1 and 2
        ids: list[Any] = [None] * world
        dist.all_gather_object(ids, commit.id)
        assert len(set(ids)) == 1, ids
        if rank == 0:
            (path / f"native-{kind}-{world}.txt").write_text(commit.id)


def native_checkout(rank: int, world: int, path: Path, rev: str, kind: str, seed: int) -> None:
    """``Repo.checkout(rev, into=...)`` into DTensors of ``kind`` on ``world`` ranks."""
    import ckptrepo

    with ckptrepo.Repo.open(path) as repo:
        into = {"t": {k: _zeros_like(v) for k, v in dtensors(world, kind, seed + 1).items()}}
        repo.checkout(rev, into=into)
        expected = dtensors(world, kind, seed)
        for name, value in into["t"].items():
            assert torch.equal(value.to_local(), expected[name].to_local()), (rank, name)


def native_failure(rank: int, world: int, path: Path) -> None:
    """Rank 1 refuses its state in phase 1: every rank raises RankFailed, nothing is committed."""
    import ckptrepo
    from ckptrepo.errors import RankFailed

    with ckptrepo.Repo.open(path) as repo:
        state: dict[str, Any] = {"t": dtensors(world, "shard0", 0)}
        if rank == 1:
            state["bad"] = object()  # UnsupportedState on this rank only
        try:
            repo.commit(state, step=1).wait()
        except RankFailed as exc:
            assert "rank 1" in str(exc), exc
            (path / f"failed-{rank}.txt").write_text(str(exc))
        else:
            raise AssertionError("the commit should have failed on every rank")


def save_loop(rank: int, world: int, path: Path, count: int) -> None:
    """Saves in a loop (the kill tests SIGKILL one rank at a random moment): after each, rank 0
    appends the commit id and its seed to ``acked.txt``."""
    import torch.distributed.checkpoint as dcp

    import ckptrepo
    from ckptrepo.dcp import Writer, commit_id

    with ckptrepo.Repo.open(path) as repo:
        for i in range(count):
            seed = int.from_bytes(os.urandom(2), "little")
            seeds: list[Any] = [seed]
            dist.broadcast_object_list(seeds, src=0)
            state = {"t": dtensors(world, "shard0", seeds[0]), "seed": seeds[0]}
            cid = commit_id(dcp.save(state, storage_writer=Writer(repo, step=i)))
            if rank == 0:
                with open(path / "acked.txt", "a") as f:
                    f.write(f"{cid} {seeds[0]}\n")


def save_ddp(rank: int, world: int, path: Path, seed: int) -> None:
    """A DDP model (its state dict: plain tensors, the same on every rank) and its SGD state
    saved through the Writer; rank 0 stores the state for the test to compare with."""
    import torch.distributed.checkpoint as dcp
    from torch.nn.parallel import DistributedDataParallel

    import ckptrepo
    from ckptrepo.dcp import Writer, commit_id

    torch.manual_seed(seed)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(128, 1024), torch.nn.Linear(1024, 256)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(seed + rank)  # each rank its own batch; DDP averages the gradients
    model(torch.randn(16, 128)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    with ckptrepo.Repo.open(path) as repo:
        cid = commit_id(dcp.save(state, storage_writer=Writer(repo, step=1)))
    if rank == 0:
        torch.save({"state": state, "commit": cid}, path / "ddp.pt")


def checkpointer_fsdp(rank: int, world: int, path: Path, steps: int) -> None:
    """An FSDP2 model, AdamW and a scheduler under a ``Checkpointer`` with ``Adaptive`` (rank 0's
    answer counts), ``steps`` more steps, then one explicit commit; every rank writes the commit
    ids its handles returned, rank 0 the full state at the end (the head commit's)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from ckptrepo import Checkpointer
    from ckptrepo.policy import Adaptive

    model, opt = _fsdp_model(world, 3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    ids = []
    with Checkpointer(path, model=model, optimizer=opt, scheduler=sched, policy=Adaptive(0.5)) as ckpt:
        step = ckpt.resume()
        torch.manual_seed(50 + rank)
        for _ in range(steps):
            model(torch.randn(8, 64)).sum().backward()
            opt.step()
            opt.zero_grad()
            sched.step()
            step += 1
            handle = ckpt.after_step(step, {"loss": float(rank)})
            if handle is not None:
                ids.append(handle)
        ids.append(ckpt.commit_now(step))
        done = [h.wait().id for h in ids]
    (path / f"ids-{rank}.txt").write_text("\n".join(done))
    full_m, full_o = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save({"model": full_m, "optim": full_o, "sched": sched.state_dict(), "step": step},
                   path / f"checkpointer-{world}.pt")


def checkpointer_resume(rank: int, world: int, path: Path, saved_world: int) -> None:
    """A fresh FSDP2 model resumed by a ``Checkpointer`` from the head commit made on
    ``saved_world`` ranks equals the saved full state; at another world size it warns."""
    import warnings

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from ckptrepo import Checkpointer

    saved = torch.load(path / f"checkpointer-{saved_world}.pt", weights_only=False)
    model, opt = _fsdp_model(world, 11)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    with warnings.catch_warnings(record=True) as caught, Checkpointer(path, model=model, optimizer=opt,
                                                                      scheduler=sched) as ckpt:
        warnings.simplefilter("always")
        assert ckpt.resume() == saved["step"]
    assert any("was made on" in str(w.message) for w in caught) == (world != saved_world), caught
    assert sched.state_dict() == saved["sched"]
    full_m, full_o = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:  # the full state is gathered there
        for k, v in saved["model"].items():
            assert torch.equal(full_m[k], v), k
        for k, v in saved["optim"]["state"].items():
            for name, x in v.items():
                assert torch.equal(full_o["state"][k][name], x), (k, name)


SCENARIOS: dict[str, Callable[..., None]] = {
    "save_ddp": save_ddp,
    "save_dtensors": save_dtensors, "load_dtensors": load_dtensors, "save_fsdp": save_fsdp, "load_fsdp": load_fsdp,
    "native_commit": native_commit, "native_checkout": native_checkout, "native_failure": native_failure,
    "save_loop": save_loop, "checkpointer_fsdp": checkpointer_fsdp, "checkpointer_resume": checkpointer_resume,
}
