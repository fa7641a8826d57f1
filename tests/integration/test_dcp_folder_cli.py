"""DCP folders through the ``ckpt`` command line: ``commit DIR`` in, ``checkout REV -o DIR --format dcp`` out.

One commit, several views: a state committed from a DCP folder (one process, or the shards of two
gloo ranks) restores bit for bit, and exported as a DCP folder it loads with ``dcp.load`` into a
single-process state dict and into the DTensor shards of two spawned ranks, bit for bit.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from typer.testing import CliRunner, Result

from ckptrepo import Repo, errors
from ckptrepo.cli.app import app
from ckptrepo.distributed.keys import int_keys
from ckptrepo.formats.dcp_folder import read_dcp_folder
from ckptrepo.testing import assert_states_equal

Run = Callable[..., Result]
WORLD = 2
SPAWN_TIMEOUT_S = 120


def quietly(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dcp warns that no process group is initialised: one process is meant
        return fn(*args, **kwargs)


def training_state() -> dict[str, Any]:
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 6)).sum().backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "extra": {"step": 1, "loss": 0.25, "emb": torch.randn(7, 4).to(torch.bfloat16), "ids": torch.arange(9)},
    }


@pytest.fixture
def run(tmp_path: Path) -> Run:
    """``run(*args)`` invokes ``ckpt --repo <tmp>/work *args`` in-process."""
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        return runner.invoke(app, ["--repo", str(tmp_path / "work"), *args], catch_exceptions=False)

    return invoke


@pytest.fixture
def work(run: Run, tmp_path: Path) -> Path:
    result = run("init", "--chunk-size", "4KiB")
    assert result.exit_code == 0, result.stderr
    return tmp_path / "work"


@pytest.fixture
def committed(run: Run, work: Path, tmp_path: Path) -> dict[str, Any]:
    """A training state saved by ``dcp.save`` and committed with ``ckpt commit DIR``: the state read back."""
    folder = tmp_path / "dcp-ckpt"
    quietly(dcp.save, training_state(), storage_writer=FileSystemWriter(folder), no_dist=True)
    result = run("commit", str(folder), "-m", "from dcp", "--step", "1", "--json")
    assert result.exit_code == 0, result.stderr
    with Repo.open(work) as repo:
        state: dict[str, Any] = repo.checkout("main")
    return state


def _ckpt_json(result: Result) -> Any:
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` but the repository's, with its bytes."""
    files = (p for p in sorted(folder.rglob("*")) if p.is_file() and "work" not in p.relative_to(folder).parts)
    return {str(p.relative_to(folder)): p.read_bytes() for p in files}


def _one_line_error(result: Result, code: int) -> None:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert result.stderr.startswith("error: ") and "\nhint: " in result.stderr, result.stderr


# --- committing DCP folders ---------------------------------------------------------------------


def test_commit_a_dcp_folder_and_restore_it_bit_for_bit(run: Run, work: Path, tmp_path: Path) -> None:
    saved = training_state()
    folder = tmp_path / "dcp-ckpt"
    quietly(dcp.save, saved, storage_writer=FileSystemWriter(folder), no_dist=True)
    doc = _ckpt_json(run("commit", str(folder), "-m", "from dcp", "--step", "1", "--json"))
    assert doc["step"] == 1 and doc["message"] == "from dcp"
    with Repo.open(work) as repo:
        restored = repo.checkout(doc["id"])
        # DCP keys an optimizer's per-parameter state by strings ("0"); a checkout gives the ints
        # load_state_dict expects (dist.keys.int_keys), whatever made the commit.
        assert_states_equal(restored, int_keys(read_dcp_folder(folder)))
        for name, t in saved["model"].items():
            assert_states_equal(restored["model"][name], t, path=name)
        for pid, per_param in saved["optim"]["state"].items():
            for key, t in per_param.items():
                assert_states_equal(restored["optim"]["state"][pid][key], t, path=f"state {pid}: {key}")
        assert restored["optim"]["param_groups"][0]["lr"] == 1e-3
        assert restored["optim"]["param_groups"][0]["betas"] == (0.9, 0.999)
        assert_states_equal(restored["extra"]["emb"], saved["extra"]["emb"])
        assert restored["extra"]["loss"] == 0.25
        # The facade takes the same path: Repo.commit_file reads a DCP folder as one commit of whole tensors.
        again = repo.commit_file(folder, branch="api", message="again")
        assert_states_equal(repo.checkout(again.id), restored)


def test_a_damaged_dcp_folder_is_refused_and_nothing_is_committed(run: Run, work: Path, tmp_path: Path) -> None:
    folder = tmp_path / "dcp-ckpt"
    quietly(dcp.save, training_state(), storage_writer=FileSystemWriter(folder), no_dist=True)
    (folder / "__0_0.distcp").write_bytes(b"")
    _one_line_error(run("commit", str(folder)), errors.InvalidInput.exit_code)
    with Repo.open(work) as repo:
        assert repo.log() == []


def _init_rank(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))


def run_ranks(fn: Callable[..., None], *args: Any) -> None:
    """Run ``fn(rank, port, *args)`` in ``WORLD`` spawned processes; fail on any error or a hang."""
    from conftest import free_port

    ctx = mp.start_processes(fn, args=(free_port(), *args), nprocs=WORLD, join=False, start_method="spawn")
    for _ in range(SPAWN_TIMEOUT_S):
        if ctx.join(timeout=1):
            return
    for p in ctx.processes:
        p.kill()
    pytest.fail(f"the {WORLD} ranks did not finish within {SPAWN_TIMEOUT_S} s")


def sharded_full() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return {
        "w0": torch.randn(7, 4, generator=g),  # Shard(0): 4 + 3 rows
        "w1": torch.randn(3, 5, generator=g).to(torch.float16),  # Shard(1): 3 + 2 columns
        "b": torch.randn(1, generator=g),  # Shard(0): 1 + 0
    }


def _save_sharded(rank: int, port: int, folder: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    _init_rank(rank, port)
    try:
        mesh = init_device_mesh("cpu", (WORLD,))
        full = sharded_full()
        placements = {"w0": Shard(0), "w1": Shard(1), "b": Shard(0)}
        state = {"model": {k: distribute_tensor(t, mesh, [placements[k]]) for k, t in full.items()}, "step": 9}
        dcp.save(state, storage_writer=FileSystemWriter(folder))
    finally:
        dist.destroy_process_group()


def test_commit_a_sharded_dcp_folder_as_whole_tensors(run: Run, work: Path, tmp_path: Path) -> None:
    folder = tmp_path / "sharded"
    run_ranks(_save_sharded, str(folder))
    doc = _ckpt_json(run("commit", str(folder), "--json"))
    with Repo.open(work) as repo:
        restored = repo.checkout(doc["id"])
        infos = {t.name: t for t in repo.tensors(doc["id"])}
    assert restored["step"] == 9
    for name, t in sharded_full().items():
        assert_states_equal(restored["model"][name], t, path=name)
        assert list(infos[f"model/{name}"].shape) == list(t.shape)


# --- exporting as DCP folders -------------------------------------------------------------------


def test_checkout_as_a_dcp_folder_loads_with_dcp_bit_for_bit(
    run: Run, work: Path, committed: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "exported"
    doc = _ckpt_json(run("checkout", "main", "-o", str(out), "--format", "dcp", "--json"))
    assert doc["format"] == "dcp" and doc["path"] == str(out)
    assert doc["bytes"] == sum(p.stat().st_size for p in out.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left
    target = {"model": {k: torch.zeros_like(v) for k, v in committed["model"].items()},
              "extra": {"emb": torch.zeros(7, 4, dtype=torch.bfloat16), "ids": torch.zeros(9, dtype=torch.int64),
                        "step": 0}}
    quietly(dcp.load, target, storage_reader=FileSystemReader(out), no_dist=True)
    assert_states_equal(target["model"], committed["model"])
    assert_states_equal(target["extra"]["emb"], committed["extra"]["emb"])
    assert target["extra"]["step"] == 1
    assert_states_equal(int_keys(read_dcp_folder(out)), committed)  # and it reads back as the same state


def _load_sharded(rank: int, port: int, folder: str, out: str, specs: dict[str, tuple[list[int], torch.dtype]]) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    _init_rank(rank, port)
    try:
        mesh = init_device_mesh("cpu", (WORLD,))
        model = {k: distribute_tensor(torch.zeros(shape, dtype=dtype), mesh, [Shard(0)])
                 for k, (shape, dtype) in specs.items()}
        state: dict[str, Any] = {"model": model, "extra": {"step": -1}}
        dcp.load(state, storage_reader=FileSystemReader(folder))
        assert all(isinstance(t, DTensor) for t in state["model"].values())
        whole = {k: t.full_tensor() for k, t in state["model"].items()}
        local = {k: t.to_local().clone() for k, t in state["model"].items()}
        torch.save({"whole": whole, "local": local, "step": state["extra"]["step"]}, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # the folder test above spawns two ranks too
def test_checkout_as_a_dcp_folder_loads_into_dtensor_shards_of_two_ranks(
    run: Run, work: Path, committed: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "exported"
    assert run("checkout", "main", "-o", str(out), "--format", "dcp").exit_code == 0
    specs = {k: (list(t.shape), t.dtype) for k, t in committed["model"].items()}
    results = tmp_path / "results"
    results.mkdir()
    run_ranks(_load_sharded, str(out), str(results), specs)
    for rank in range(WORLD):
        got = torch.load(results / f"rank{rank}.pt", weights_only=True)
        assert got["step"] == 1
        for name, t in committed["model"].items():
            assert_states_equal(got["whole"][name], t, path=f"rank {rank}: {name}")
            rows = -(-t.shape[0] // WORLD)  # DTensor's Shard(0): ceil-sized pieces, the last one short
            assert_states_equal(got["local"][name], t[rank * rows : (rank + 1) * rows], path=f"rank {rank}: {name}")


def test_format_overrides_the_suffix(run: Run, committed: dict[str, Any], tmp_path: Path) -> None:
    as_safetensors = tmp_path / "model.pt"
    doc = _ckpt_json(run("checkout", "main", "-o", str(as_safetensors), "--format", "safetensors", "--json"))
    assert doc["format"] == "safetensors" and doc["bytes"] == as_safetensors.stat().st_size
    with safetensors.safe_open(str(as_safetensors), framework="pt") as f:
        assert "model/0.weight" in set(f.keys())
    as_torch = tmp_path / "model"
    assert run("checkout", "main", "-o", str(as_torch), "--format", "torch").exit_code == 0
    assert_states_equal(torch.load(as_torch, weights_only=True), committed)
    flat = tmp_path / "flat.safetensors"  # by suffix, as before
    assert run("checkout", "main", "-o", str(flat)).exit_code == 0
    assert safetensors.torch.load_file(str(flat)).keys() == safetensors.torch.load_file(str(as_safetensors)).keys()


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["-o", "{full}", "--format", "dcp"], id="non-empty-folder"),
        pytest.param(["-o", "{file}", "--format", "dcp"], id="onto-a-file"),
        pytest.param(["-o", "{new}", "--format", "zip"], id="unknown-format"),
        pytest.param(["-o", "{new}"], id="no-suffix-no-format"),
        pytest.param(["-o", "{full}", "--format", "torch"], id="file-format-onto-a-folder"),
        pytest.param(["--format", "dcp"], id="format-without-output"),
    ],
)
def test_export_refusals_change_nothing_on_disk(
    run: Run, committed: dict[str, Any], tmp_path: Path, args: list[str]
) -> None:
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    (tmp_path / "file").write_text("mine too")
    paths = {"full": full, "file": tmp_path / "file", "new": tmp_path / "new"}
    before = _tree(tmp_path)
    _one_line_error(run("checkout", "main", *(a.format(**paths) for a in args)), 2)
    assert _tree(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dcp-ckpt", "file", "full", "work"]
