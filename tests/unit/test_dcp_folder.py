"""Unit tests of ckptrepo.formats.dcp_folder: DCP folders read whole and validated, and written by DCP.

The folders are written by ``dcp.save(..., storage_writer=FileSystemWriter(...))`` here, in this
process or by two spawned gloo processes saving DTensors; what is read back is compared bit for
bit with the tensors saved, and with what DCP's own loader makes of the folder.
"""

from __future__ import annotations

import fractions
import os
import pickle
import shutil
import warnings
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import SerializationFormat, _StorageInfo
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, Metadata, MetadataIndex

from ckptrepo.errors import InvalidInput, UnsupportedState, UsageError
from ckptrepo.formats import check_folder_target, is_dcp_folder, output_format, read_state, write_state
from ckptrepo.formats.dcp_folder import read_dcp_folder, write_dcp_folder
from ckptrepo.testing import assert_states_equal

WORLD = 2
SPAWN_TIMEOUT_S = 120


# --- helpers ------------------------------------------------------------------------------------


def save(state: dict[str, Any], folder: Path, **writer: Any) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, storage_writer=FileSystemWriter(folder, **writer), no_dist=True)
    return folder


def dcp_own_load(folder: Path, tmp: Path) -> Any:
    """What DCP itself makes of ``folder`` (the trusted reference: it unpickles freely)."""
    out = tmp / f"{folder.name}.reference.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(folder, out)
    return torch.load(out, weights_only=False)


def rewrite_metadata(folder: Path, change: Callable[[Metadata], Any]) -> None:
    """Apply ``change`` to the folder's metadata (written by these tests: trusted)."""
    path = folder / ".metadata"
    with open(path, "rb") as f:
        md = pickle.load(f)
    change(md)
    path.write_bytes(pickle.dumps(md))


def storage_of(md: Metadata, fqn: str, offsets: tuple[int, ...] | None = None) -> _StorageInfo:
    info: _StorageInfo = md.storage_data[MetadataIndex(fqn, offsets)]
    return info


def tensors_of(state: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    if isinstance(state, torch.Tensor):
        out[prefix] = state
    elif isinstance(state, dict):
        for k, v in state.items():
            out.update(tensors_of(v, f"{prefix}/{k}"))
    elif isinstance(state, list | tuple):
        for i, v in enumerate(state):
            out.update(tensors_of(v, f"{prefix}/{i}"))
    return out


def training_state() -> dict[str, Any]:
    """A model's and an AdamW's state dicts after two steps, and odd tensors and plain values."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95))
    for _ in range(2):
        model(torch.randn(4, 6)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    g = torch.Generator().manual_seed(1)
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "extra": {
            "step": 2,
            "lr": 3e-4,
            "name": "run-1",
            "flags": [True, False],
            "betas": (0.9, 0.95),
            "nothing": None,
            "bf16": torch.randn(7, 3, generator=g).to(torch.bfloat16),
            "f16": torch.randn(4, generator=g).half(),
            "f8": torch.randn(5, generator=g).to(torch.float8_e4m3fn),
            "ints": torch.arange(-5, 5, dtype=torch.int64),
            "mask": torch.tensor([True, False, True]),
            "c64": torch.tensor([1 + 2j, -3j], dtype=torch.complex64),
            "scalar": torch.tensor(7.5),
            "empty": torch.zeros(0, 3, dtype=torch.uint8),
            "transposed": torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),
            "nested": [torch.ones(2), {"deep": torch.full((2, 2), 3.0)}],
        },
    }


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A folder ``dcp.save`` wrote from one process, and the state it saved."""
    state = training_state()
    folder = save(state, tmp_path_factory.mktemp("plain") / "ckpt")
    return folder, state


@pytest.fixture
def copy_of(tmp_path: Path) -> Callable[[Path], Path]:
    """``copy_of(folder)``: a copy of that folder to damage."""

    def make(folder: Path) -> Path:
        return Path(shutil.copytree(folder, tmp_path / f"copy-{len(list(tmp_path.iterdir()))}-{folder.name}"))

    return make


# --- reading ------------------------------------------------------------------------------------


def test_a_plain_folder_reads_as_dcp_itself_loads_it_bit_for_bit(plain: tuple[Path, dict[str, Any]],
                                                                  tmp_path: Path) -> None:
    folder, saved = plain
    got = read_dcp_folder(folder)
    assert_states_equal(got, dcp_own_load(folder, tmp_path), ordered=True)
    assert read_state(folder).keys() == got.keys() and is_dcp_folder(folder)
    # Every tensor saved, at the key path DCP gives it (dict keys as strings), bit for bit.
    want = tensors_of(saved)
    have = tensors_of(got)
    assert have.keys() == want.keys()
    for name, t in want.items():
        assert_states_equal(have[name], t, path=name)
        assert have[name].is_contiguous() and have[name].device.type == "cpu"
    group = got["optim"]["param_groups"][0]
    assert group["lr"] == 3e-4 and group["betas"] == (0.9, 0.95) and group["params"] == [0, 1, 2, 3]
    assert sorted(got["optim"]["state"]) == ["0", "1", "2", "3"]  # DCP keys dicts by str(key)
    assert got["extra"]["flags"] == [True, False] and got["extra"]["nothing"] is None
    assert got["extra"]["step"] == 2 and type(got["extra"]["step"]) is int


def test_without_planner_data_the_state_is_flat(plain: tuple[Path, dict[str, Any]],
                                                copy_of: Callable[[Path], Path]) -> None:
    folder = copy_of(plain[0])
    rewrite_metadata(folder, lambda md: setattr(md, "planner_data", None))
    got = read_dcp_folder(folder)
    assert "model.0.weight" in got and "optim.param_groups.0.lr" in got and "extra.nested.1.deep" in got
    assert_states_equal(got["model.0.weight"], plain[1]["model"]["0.weight"])


@pytest.mark.parametrize(
    "writer",
    [
        pytest.param({"single_file_per_rank": False}, id="file-per-item"),
        pytest.param({"thread_count": 2}, id="two-threads"),
        pytest.param({"_extensions": "zstd"}, id="zstd-stream"),
    ],
)
def test_other_writer_layouts_read_the_same(writer: dict[str, Any], tmp_path: Path) -> None:
    from torch.distributed.checkpoint._extension import ZStandard

    if writer.get("_extensions") == "zstd":
        writer = {"_extensions": [ZStandard()]}
    state = training_state()
    folder = save(state, tmp_path / "ckpt", **writer)
    assert_states_equal(read_dcp_folder(folder), dcp_own_load(folder, tmp_path), ordered=True)


def test_values_that_need_unpickling_are_refused_unless_allowed(tmp_path: Path) -> None:
    folder = save({"w": torch.ones(2), "ratio": fractions.Fraction(1, 3)}, tmp_path / "ckpt")
    with pytest.raises(InvalidInput, match=r"'ratio'.*not plain data") as info:
        read_dcp_folder(folder)
    assert str(folder) in str(info.value) and "allow_pickle=True" in info.value.hint
    got = read_dcp_folder(folder, allow_pickle=True)
    assert got["ratio"] == fractions.Fraction(1, 3)
    assert_states_equal(got["w"], torch.ones(2))


def _evil_metadata(folder: Path) -> None:
    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {folder / 'pwned'}",))

    (folder / ".metadata").write_bytes(pickle.dumps({"x": Evil()}))


def _metadata_with_class(folder: Path) -> None:
    rewrite_metadata(folder, lambda md: setattr(md, "planner_data", fractions.Fraction(1, 3)))


def _drop_chunk_entry(folder: Path) -> None:
    def change(md: Metadata) -> None:
        del md.storage_data[MetadataIndex("model.0.weight", (0, 0))]

    rewrite_metadata(folder, change)


def _extra_storage_entry(folder: Path) -> None:
    def change(md: Metadata) -> None:
        md.storage_data[MetadataIndex("model.0.weight", (9, 9))] = storage_of(md, "model.0.weight", (0, 0))

    rewrite_metadata(folder, change)


def _set_storage(fqn: str, offsets: tuple[int, ...] | None, **fields: Any) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        def change(md: Metadata) -> None:
            for name, value in fields.items():
                setattr(storage_of(md, fqn, offsets), name, value)

        rewrite_metadata(folder, change)

    return damage


def _swap_chunks(folder: Path) -> None:
    def change(md: Metadata) -> None:
        a, b = MetadataIndex("model.0.weight", (0, 0)), MetadataIndex("model.2.weight", (0, 0))
        md.storage_data[a], md.storage_data[b] = md.storage_data[b], md.storage_data[a]

    rewrite_metadata(folder, change)


def _overlapping_data(folder: Path) -> None:
    def change(md: Metadata) -> None:
        info = storage_of(md, "model.2.weight", (0, 0))
        info.offset = storage_of(md, "model.0.weight", (0, 0)).offset + 8

    rewrite_metadata(folder, change)


def _chunk_outside(folder: Path) -> None:
    def change(md: Metadata) -> None:
        md.state_dict_metadata["model.0.weight"].chunks[0].sizes = torch.Size([6, 6])

    rewrite_metadata(folder, change)


def _overlapping_chunks(folder: Path) -> None:
    def change(md: Metadata) -> None:
        entry = md.state_dict_metadata["model.0.weight"]  # 5 x 6, one chunk
        entry.chunks = [ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([3, 6])),
                        ChunkStorageMetadata(torch.Size([2, 0]), torch.Size([3, 6]))]
        whole = md.storage_data.pop(MetadataIndex("model.0.weight", (0, 0)))
        md.storage_data[MetadataIndex("model.0.weight", (0, 0))] = whole
        md.storage_data[MetadataIndex("model.0.weight", (2, 0))] = whole

    rewrite_metadata(folder, change)


def _partial_tensor(folder: Path) -> None:
    def change(md: Metadata) -> None:
        md.state_dict_metadata["model.0.weight"].size = torch.Size([10, 6])

    rewrite_metadata(folder, change)


def _conflicting_paths(folder: Path) -> None:
    def change(md: Metadata) -> None:
        md.planner_data["extra.step"] = ("model", "0.weight", "x")

    rewrite_metadata(folder, change)


def _same_path_twice(folder: Path) -> None:
    def change(md: Metadata) -> None:
        md.planner_data["extra.step"] = ("model", "0.weight")

    rewrite_metadata(folder, change)


def _list_where_dict(folder: Path) -> None:
    def change(md: Metadata) -> None:
        md.planner_data["extra.step"] = ("model", 0)

    rewrite_metadata(folder, change)


def _newer_version(folder: Path) -> None:
    rewrite_metadata(folder, lambda md: setattr(md, "version", "2.0.0"))


def _truncate_data(folder: Path) -> None:
    data = folder / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])


def _break_archive(folder: Path) -> None:
    def change(md: Metadata) -> None:
        info = storage_of(md, "model.0.weight", (0, 0))
        with open(folder / info.relative_path, "r+b") as f:
            f.seek(info.offset)
            f.write(b"XXXX")

    rewrite_metadata(folder, change)


def _damage_archive_inside(folder: Path) -> None:
    def change(md: Metadata) -> None:
        info = storage_of(md, "model.0.weight", (0, 0))
        with open(folder / info.relative_path, "r+b") as f:
            f.seek(info.offset + 30)
            f.write(b"\xff" * 64)

    rewrite_metadata(folder, change)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        pytest.param(_evil_metadata, r"names (posix|nt)\.system, which is neither DCP metadata", id="code-in-metadata"),
        pytest.param(_metadata_with_class, r"names fractions\.Fraction", id="class-in-metadata"),
        pytest.param(lambda f: (f / ".metadata").write_bytes(b"not a pickle"), "not a readable DCP metadata",
                     id="garbage-metadata"),
        pytest.param(lambda f: (f / ".metadata").write_bytes(pickle.dumps({"a": 1})), "holds a dict, not DCP",
                     id="not-metadata"),
        pytest.param(_newer_version, "format version '2.0.0'", id="newer-version"),
        pytest.param(lambda f: (f / "__0_0.distcp").unlink(), r"data file __0_0\.distcp is missing", id="no-data"),
        pytest.param(_truncate_data, "truncated", id="truncated-data"),
        pytest.param(_drop_chunk_entry, r"chunk at \[0, 0\] of 'model.0.weight' has no storage entry",
                     id="chunk-without-storage"),
        pytest.param(_extra_storage_entry, "which the metadata does not declare", id="storage-without-chunk"),
        pytest.param(_set_storage("model.0.weight", (0, 0), relative_path="../elsewhere.distcp"),
                     "not a data file in the folder", id="path-outside"),
        pytest.param(_set_storage("model.0.weight", (0, 0), offset=-1), "offset -1", id="negative-offset"),
        pytest.param(_set_storage("model.0.weight", (0, 0), length=10), "fewer than its 120 bytes",
                     id="short-chunk"),
        pytest.param(_set_storage("model.0.weight", (0, 0), transform_descriptors=["stream.lz4/1"]),
                     "stream transforms", id="unknown-transform"),
        pytest.param(_overlapping_data, "overlaps the data before it", id="overlapping-bytes"),
        pytest.param(_swap_chunks, r"holds a torch.float32 tensor of shape \[5, 6\]; the metadata declares "
                     r"torch.float32 of shape \[3, 5\]", id="wrong-chunk"),
        pytest.param(_break_archive, "not a torch.save archive", id="not-an-archive"),
        pytest.param(_damage_archive_inside, "not a readable torch.save tensor", id="damaged-archive"),
        pytest.param(_chunk_outside, "lies outside its tensor", id="chunk-outside"),
        pytest.param(_overlapping_chunks, r"chunks of 'model.0.weight' at \[0, 0\] and \[2, 0\] overlap",
                     id="overlapping-chunks"),
        pytest.param(_partial_tensor, "cover 30 of its 60 elements: the checkpoint is partial", id="partial"),
        pytest.param(_conflicting_paths, "passes through the value", id="path-through-value"),
        pytest.param(_same_path_twice, "leads where another value is", id="same-path"),
        pytest.param(_list_where_dict, "where other key paths have a dict", id="list-in-dict"),
    ],
)
def test_a_damaged_folder_is_refused_naming_it_and_the_fault(
    plain: tuple[Path, dict[str, Any]], copy_of: Callable[[Path], Path], damage: Callable[[Path], Any], reason: str
) -> None:
    folder = copy_of(plain[0])
    damage(folder)
    with pytest.raises(InvalidInput, match=reason) as info:
        read_state(folder)
    assert info.value.message.startswith(f"Cannot read {folder}: ")
    assert not (folder / "pwned").exists()


def test_unread_variants_are_refused_by_name(tmp_path: Path) -> None:
    state = {"w": torch.arange(6.0).reshape(2, 3), "n": 5}
    st = save(state, tmp_path / "st", serialization_format=SerializationFormat.SAFETENSORS)
    with pytest.raises(InvalidInput, match="serialization_format=SAFETENSORS"):
        read_state(st)
    per_rank = tmp_path / "per-rank"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, storage_writer=FileSystemWriter(per_rank), no_dist=True, use_collectives=False)
    assert is_dcp_folder(per_rank)
    with pytest.raises(InvalidInput, match=r"__0\.metadata.*use_collectives=False"):
        read_state(per_rank)
    with pytest.raises(InvalidInput, match=r"no \.metadata file"):
        read_dcp_folder(tmp_path)


# --- sharded folders from two processes ---------------------------------------------------------


def sharded_full() -> dict[str, torch.Tensor]:
    """The whole tensors the ranks shard: uneven along dim 0 and dim 1, and one with an empty shard."""
    g = torch.Generator().manual_seed(7)
    return {
        "rows": torch.randn(5, 3, generator=g),  # Shard(0): 3 + 2 rows
        "cols": torch.randn(4, 7, generator=g).to(torch.bfloat16),  # Shard(1): 4 + 3 columns
        "one": torch.tensor([42], dtype=torch.int64),  # Shard(0): 1 + 0 rows
        "bias": torch.randn(9, generator=g),  # Shard(0): 5 + 4
        "replicated": torch.arange(4, dtype=torch.int32),  # a plain tensor every rank holds
    }


def _init_rank(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))


def _save_sharded(rank: int, port: int, folder: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    _init_rank(rank, port)
    try:
        mesh = init_device_mesh("cpu", (WORLD,))
        full = sharded_full()
        state = {
            "model": {
                "rows": distribute_tensor(full["rows"], mesh, [Shard(0)]),
                "cols": distribute_tensor(full["cols"], mesh, [Shard(1)]),
                "one": distribute_tensor(full["one"], mesh, [Shard(0)]),
            },
            "optim": {"param_groups": [{"lr": 0.1, "params": ["model.rows"]}],
                      "state": {"model.bias": {"exp_avg": distribute_tensor(full["bias"], mesh, [Shard(0)])}}},
            "replicated": full["replicated"],
            "step": 11,
        }
        dcp.save(state, storage_writer=FileSystemWriter(folder))
    finally:
        dist.destroy_process_group()


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


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("sharded") / "ckpt"
    run_ranks(_save_sharded, str(folder))
    yield folder


def test_a_sharded_folder_reads_as_whole_tensors_bit_for_bit(sharded: Path, tmp_path: Path) -> None:
    assert sorted(p.name for p in sharded.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    got = read_dcp_folder(sharded)
    full = sharded_full()
    for name in ("rows", "cols", "one"):
        assert_states_equal(got["model"][name], full[name], path=name)
    assert_states_equal(got["optim"]["state"]["model.bias"]["exp_avg"], full["bias"])
    assert_states_equal(got["replicated"], full["replicated"])
    assert got["step"] == 11 and got["optim"]["param_groups"] == [{"lr": 0.1, "params": ["model.rows"]}]
    # Keys in the order the ranks' state had them (DCP's own loader orders them as its plan did).
    assert list(got) == ["model", "optim", "replicated", "step"] and list(got["optim"]) == ["param_groups", "state"]
    assert_states_equal(got, dcp_own_load(sharded, tmp_path))


def test_a_sharded_folder_missing_a_rank_is_refused(sharded: Path, copy_of: Callable[[Path], Path]) -> None:
    folder = copy_of(sharded)

    def drop_rank_1(md: Metadata) -> None:
        for index, info in list(md.storage_data.items()):
            if info.relative_path == "__1_0.distcp" and index.offset is not None:
                del md.storage_data[index]
                chunks = md.state_dict_metadata[index.fqn].chunks
                chunks[:] = [c for c in chunks if tuple(c.offsets) != tuple(index.offset)]

    rewrite_metadata(folder, drop_rank_1)
    with pytest.raises(InvalidInput, match="the checkpoint is partial"):
        read_dcp_folder(folder)
    no_file = copy_of(sharded)
    (no_file / "__1_0.distcp").unlink()
    with pytest.raises(InvalidInput, match=r"__1_0\.distcp is missing"):
        read_dcp_folder(no_file)


# --- writing ------------------------------------------------------------------------------------


def test_a_written_folder_loads_with_dcp_and_reads_back_bit_for_bit(tmp_path: Path) -> None:
    state = training_state()
    folder = tmp_path / "out"
    write_dcp_folder(state, folder)
    assert is_dcp_folder(folder) and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    with open(folder / ".metadata", "rb") as f:
        assert str(pickle.load(f).storage_meta.checkpoint_id) == str(folder)  # not the temporary name
    assert_states_equal(read_dcp_folder(folder), dcp_own_load(folder, tmp_path), ordered=True)
    # dcp.load into a fresh state dict of the same layout: every tensor bit for bit.
    target = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()},
              "extra": {"bf16": torch.zeros(7, 3, dtype=torch.bfloat16), "ints": torch.zeros(10, dtype=torch.int64)}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(target, checkpoint_id=folder, no_dist=True)
    for k, v in state["model"].items():
        assert_states_equal(target["model"][k], v, path=k)
    assert_states_equal(target["extra"]["bf16"], state["extra"]["bf16"])
    assert_states_equal(target["extra"]["ints"], state["extra"]["ints"])


def test_modules_and_optimizers_are_written_as_their_state_dicts(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    write_state({"model": model, "step": 1}, tmp_path / "ckpt", format="dcp")
    got = read_state(tmp_path / "ckpt")
    assert got["step"] == 1
    assert_states_equal(got["model"]["weight"], model.weight.detach())


def test_an_empty_folder_is_taken_and_anything_else_refused_changing_nothing(tmp_path: Path) -> None:
    state = {"w": torch.ones(3)}
    empty = tmp_path / "empty"
    empty.mkdir()
    write_dcp_folder(state, empty)
    assert_states_equal(read_dcp_folder(empty)["w"], torch.ones(3))
    before = {p: p.read_bytes() for p in empty.iterdir()}
    with pytest.raises(UsageError, match="exists and is not an empty folder"):
        write_dcp_folder({"w": torch.zeros(3)}, empty)
    assert {p: p.read_bytes() for p in empty.iterdir()} == before
    a_file = tmp_path / "file"
    a_file.write_bytes(b"keep")
    with pytest.raises(UsageError, match="exists and is not an empty folder"):
        write_state(state, a_file, format="dcp")
    assert a_file.read_bytes() == b"keep"
    with pytest.raises(UsageError, match="does not exist"):
        write_dcp_folder(state, tmp_path / "no" / "ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "file"]


def test_a_state_dcp_refuses_leaves_nothing_behind(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="duplicated flatten key"):
        write_dcp_folder({"a.b": torch.ones(1), "a": {"b": torch.zeros(1)}}, tmp_path / "ckpt")
    with pytest.raises(UnsupportedState):
        write_dcp_folder({"f": fractions.Fraction(1, 2)}, tmp_path / "ckpt")
    assert list(tmp_path.iterdir()) == []


def test_output_format_and_targets(tmp_path: Path) -> None:
    assert output_format(tmp_path / "a.safetensors") == "safetensors"
    assert output_format(tmp_path / "a.pt") == "torch"
    assert output_format(tmp_path / "a.pt", "safetensors") == "safetensors"
    assert output_format(tmp_path / "new", "dcp") == "dcp"
    with pytest.raises(UsageError, match="unknown format 'zip'"):
        output_format(tmp_path / "a.pt", "zip")
    with pytest.raises(UsageError, match=r"unknown suffix '\.txt'"):
        output_format(tmp_path / "a.txt")
    with pytest.raises(UsageError, match="it is a folder"):
        output_format(tmp_path, "torch")
    check_folder_target(tmp_path / "new")
    with pytest.raises(UsageError):
        check_folder_target(tmp_path.parent)
    write_state({"w": torch.ones(2)}, tmp_path / "weights", format="safetensors")
    assert_states_equal(read_state(tmp_path / "weights")["w"], torch.ones(2))  # recognised by its first bytes
