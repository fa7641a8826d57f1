"""Unit tests of ckptrepo.formats: safetensors, torch.save files and Hugging Face folders."""

from __future__ import annotations

import gc
import json
import math
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.torch
import torch
from hypothesis import given, settings
from hypothesis import strategies as hst

from ckptrepo.errors import InvalidInput, UnsupportedState, UsageError
from ckptrepo.formats import ReadBuffer, read_state, read_states, safetensors_io, write_state
from ckptrepo.storage.appendfile import AppendFile
from ckptrepo.testing import assert_states_equal


class Payload:
    """A class a weights-only load must not construct."""

    def __init__(self) -> None:
        self.value = 1


def flat_tensors() -> dict[str, torch.Tensor]:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    return {
        "emb.weight": base,
        "tied.weight": base,
        "view.t": base.t(),
        "half": torch.randn(3, 2).half(),
        "bf16": torch.tensor([1.5, -math.inf, math.nan], dtype=torch.bfloat16),
        "f8": torch.randn(5).to(torch.float8_e4m3fn),
        "scalar": torch.tensor(7, dtype=torch.int64),
        "empty": torch.zeros(0, 3, dtype=torch.uint16),
        "mask": torch.tensor([True, False]),
        "c64": torch.tensor([1 + 2j], dtype=torch.complex64),
        "a/b": torch.ones(1),
    }


def assert_same_files_list(folder: Path, names: set[str]) -> None:
    assert {p.name for p in folder.iterdir()} == names, "a temporary file was left behind"


# --- safetensors --------------------------------------------------------------------------------


def test_flat_safetensors_round_trip_bit_identical(tmp_path: Path) -> None:
    tensors = flat_tensors()
    path = tmp_path / "model.safetensors"
    write_state(tensors, path)
    loaded = safetensors.torch.load_file(path)
    assert_states_equal(loaded, tensors)
    read = read_state(path)
    assert_states_equal(read, tensors)
    with safetensors.safe_open(path, "pt") as f:
        assert f.metadata() == {"format": "pt"}
    assert_same_files_list(tmp_path, {"model.safetensors"})


def test_flat_safetensors_are_the_bytes_save_file_writes(tmp_path: Path) -> None:
    """The direct-I/O writer reproduces safetensors' own file byte for byte (header order by
    dtype then name, dtype names, padding), so a checkout of a committed file is that file."""
    tensors = {n: t for n, t in flat_tensors().items() if n not in ("tied.weight", "view.t")}
    tensors["名前"] = torch.ones(2, dtype=torch.int8)
    tensors['quote"\\'] = torch.zeros(3, dtype=torch.float64)
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    write_state(tensors, ours)
    safetensors.torch.save_file(tensors, str(theirs), metadata={"format": "pt"})
    assert ours.read_bytes() == theirs.read_bytes()
    assert_same_files_list(tmp_path, {"ours.safetensors", "theirs.safetensors"})


@given(
    specs=hst.dictionaries(
        hst.text(min_size=1, max_size=12),
        hst.tuples(hst.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8,
                                     torch.bool, torch.float64, torch.int32]),
                   hst.lists(hst.integers(0, 9), max_size=3)),
        max_size=8,
    )
)
@settings(max_examples=40, deadline=None)
def test_any_flat_dict_is_written_as_save_file_writes_it(specs: dict[str, tuple[torch.dtype, list[int]]]) -> None:
    tensors = {n: (torch.rand(shape) * 100).to(dtype) for n, (dtype, shape) in specs.items()}
    with tempfile.TemporaryDirectory() as folder:
        ours, theirs = Path(folder) / "ours.safetensors", Path(folder) / "theirs.safetensors"
        write_state(tensors, ours)
        safetensors.torch.save_file(tensors, str(theirs), metadata={"format": "pt"})
        assert ours.read_bytes() == theirs.read_bytes()


def test_a_header_the_writer_cannot_reproduce_falls_back_to_save_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_save = safetensors.torch.save

    def other_format(tensors: dict[str, torch.Tensor], metadata: Any = None) -> bytes:
        data = real_save(tensors, metadata=metadata)
        return data[:8] + data[8:].replace(b'"dtype"', b'"DTYPE"', 1)  # a library that formats differently

    real_save_file = safetensors.torch.save_file
    used: list[str] = []

    def recorded_save_file(tensors: dict[str, torch.Tensor], filename: str, metadata: Any = None) -> None:
        used.append(filename)
        real_save_file(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save", other_format)
    monkeypatch.setattr(safetensors.torch, "save_file", recorded_save_file)
    safetensors_io._stand_in_layout.cache_clear()  # layouts learnt by earlier tests
    tensors = {"w": torch.randn(5), "b": torch.ones(2, dtype=torch.bfloat16)}
    write_state(tensors, tmp_path / "a.safetensors")
    assert len(used) == 1
    loaded = safetensors.torch.load_file(tmp_path / "a.safetensors")
    assert_states_equal(loaded, tensors)
    safetensors_io._stand_in_layout.cache_clear()  # nothing learnt from the odd library stays


@pytest.mark.parametrize("direct", ["1", "0"])
def test_buffered_reads_give_the_same_bits_and_reuse_the_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: str
) -> None:
    """``read_state(path, buffer=b)``: the file read whole into ``b`` (direct I/O, or plain reads
    with ``CKPT_DIRECT_IO=0``); tensors are views of it until the next read, which reuses it."""
    monkeypatch.setenv("CKPT_DIRECT_IO", direct)
    first = {**flat_tensors(), "big": torch.randn(20_000)}
    second = {"w": torch.arange(5000, dtype=torch.float32) - 0.5, "odd": torch.ones(3).half()}  # fits the buffer
    write_state(first, tmp_path / "a.safetensors")
    write_state(second, tmp_path / "b.safetensors")
    buffer = ReadBuffer()
    try:
        got = read_state(tmp_path / "a.safetensors", buffer=buffer)
        assert_states_equal(got, first)
        got2 = read_state(tmp_path / "b.safetensors", buffer=buffer)
        assert_states_equal(got2, second)
        with pytest.raises(AssertionError, match="elements differ"):  # overwritten by the second read
            assert_states_equal(got["big"], first["big"])
    finally:
        buffer.close()


def test_buffered_read_of_a_damaged_file_is_invalid_input(tmp_path: Path) -> None:
    path = tmp_path / "a.safetensors"
    write_state({"w": torch.ones(1000)}, path)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(InvalidInput):
        read_state(path, buffer=ReadBuffer())
    with pytest.raises(InvalidInput, match="No such file"):
        ReadBuffer().read(tmp_path / "missing.safetensors")


@pytest.mark.parametrize("direct", ["1", "0"])
def test_read_states_reads_one_ahead_and_keeps_each_item_until_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: str
) -> None:
    """Every file in order, bit-exact; while item i is held, item i+1 is read into the other
    buffer, so item i stays intact until the caller advances; torch files work too."""
    monkeypatch.setenv("CKPT_DIRECT_IO", direct)
    states = [{"w": torch.randn(30_000) + i, "b": torch.full((7,), float(i)).half()} for i in range(5)]
    paths = []
    for i, s in enumerate(states):
        paths.append(tmp_path / f"s{i}.safetensors")
        write_state(s, paths[-1])
    paths.append(tmp_path / "t.pt")
    write_state({"x": torch.arange(10)}, paths[-1])
    seen = []
    for i, (path, got) in enumerate(read_states(paths)):
        assert path == paths[i]
        time.sleep(0.02)  # the read of the next file happens meanwhile
        if i < len(states):
            assert_states_equal(got, states[i], path=f"file {i}")
        else:
            assert torch.equal(got["x"], torch.arange(10))
        seen.append(path)
    assert seen == paths


def test_read_states_raises_a_bad_file_when_reached_and_frees_on_close(tmp_path: Path) -> None:
    good, bad = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    write_state({"w": torch.ones(1000)}, good)
    bad.write_bytes(b"not a checkpoint at all")
    it = read_states([good, bad, good])
    path, state = next(it)
    assert path == good and torch.equal(state["w"], torch.ones(1000))
    with pytest.raises(InvalidInput, match=r"b\.safetensors"):
        next(it)
    assert list(read_states([])) == []
    it2 = read_states([good, good])
    next(it2)
    it2.close()  # waits for the read in flight; no thread is left behind
    assert not any(t.name.startswith("ckpt-read") and t.is_alive() for t in threading.enumerate())


def test_mapped_safetensors_read_the_same_bits_from_the_file(tmp_path: Path) -> None:
    tensors = flat_tensors()
    path = tmp_path / "model.safetensors"
    write_state(tensors, path)
    mapped = read_state(path, mapped=True)
    assert_states_equal(mapped, tensors)
    # Views of the file's map (not copies), kept alive by the tensors alone; writes to them
    # stay private: the file is unchanged.
    weight = mapped["emb.weight"]
    before = path.read_bytes()
    del mapped
    gc.collect()
    weight.add_(1)
    assert torch.equal(weight, torch.arange(24, dtype=torch.float32).reshape(4, 6) + 1)
    assert path.read_bytes() == before
    assert_states_equal(read_state(path, mapped=True)["emb.weight"], tensors["emb.weight"])
    # A nested state comes back nested, mapped too.
    write_state({"model": torch.nn.Linear(3, 2), "step": 4}, tmp_path / "nested.safetensors")
    back = read_state(tmp_path / "nested.safetensors", mapped=True)
    assert back["step"] == 4 and back["model"]["weight"].shape == (2, 3)


def test_mapped_safetensors_copies_tensors_that_cannot_be_views(tmp_path: Path) -> None:
    # A file whose float32 tensor starts at an odd offset (other writers need not align):
    # that tensor is read as a copy, the rest mapped; the bits are the same either way.
    w = torch.randn(4, 4)
    header = {"b": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
              "w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [3, 67]}}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path = tmp_path / "odd.safetensors"
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes([1, 2, 3]) + w.numpy().tobytes())
    back = read_state(path, mapped=True)
    assert_states_equal(back["w"], w)
    assert back["b"].tolist() == [1, 2, 3]
    assert_states_equal(read_state(path)["w"], w)


def test_mapped_damaged_safetensors_is_invalid_input(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file({"w": torch.randn(16, 16)}, path)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(InvalidInput):
        read_state(path, mapped=True)


def test_nested_state_in_safetensors_keeps_its_structure(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    shared = torch.arange(4.0)
    state = {"model": model, "ties": [shared, shared], "meta": {"step": 10, "lr": 1e-3, "loss": math.nan}}
    path = tmp_path / "ckpt.safetensors"
    write_state(state, path)
    assert set(safetensors.torch.load_file(path)) == {"model/weight", "model/bias", "ties/0"}
    back = read_state(path)
    assert_states_equal(back["model"]["weight"], model.weight.detach())
    assert back["ties"][0] is back["ties"][1] and torch.equal(back["ties"][0], shared)
    assert back["meta"]["step"] == 10 and math.isnan(back["meta"]["loss"])


def test_safetensors_refuses_dtypes_it_has_no_type_for(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    with pytest.raises(UnsupportedState, match=r"c128.*\.pt"):
        write_state({"c128": torch.zeros(2, dtype=torch.complex128)}, path)
    assert not path.exists()
    write_state({"c128": torch.zeros(2, dtype=torch.complex128)}, tmp_path / "x.pt")


@pytest.mark.parametrize("damage", ["truncate", "header"])
def test_damaged_safetensors_is_invalid_input(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file({"w": torch.randn(16, 16)}, path)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) - 100]
    else:
        data[12:20] = b"#garbage"
    path.write_bytes(bytes(data))
    with pytest.raises(InvalidInput) as info:
        read_state(path)
    assert str(path) in str(info.value) and info.value.fields["reason"]


def test_safetensors_with_a_huge_header_length_is_invalid_input(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes((2**40).to_bytes(8, "little") + b"{}")
    with pytest.raises(InvalidInput):
        read_state(path)


# --- torch.save files ---------------------------------------------------------------------------


def test_torch_file_with_a_custom_object_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"w": torch.zeros(2), "obj": Payload()}, path)
    with pytest.raises(InvalidInput) as info:
        read_state(path)
    message = str(info.value)
    assert "Payload" in message and "weights_only" in message
    assert isinstance(read_state(path, allow_pickle=True)["obj"], Payload)


def test_torch_file_with_plain_data_and_numpy(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pth"
    state = {"w": torch.randn(3, 3), "np": np.arange(4, dtype=np.float32), "epoch": 2, "t": (1, "a")}
    torch.save(state, path)
    back = read_state(path)
    assert torch.equal(back["w"], state["w"]) and np.array_equal(back["np"], state["np"])
    assert back["epoch"] == 2 and back["t"] == (1, "a")


def test_legacy_torch_format_is_read_without_mmap(tmp_path: Path) -> None:
    path = tmp_path / "old.bin"
    torch.save({"w": torch.ones(2)}, path, _use_new_zipfile_serialization=False)
    assert torch.equal(read_state(path)["w"], torch.ones(2))


@pytest.mark.parametrize("keep", [0.5, 0.0])
def test_truncated_or_empty_torch_file_is_invalid_input(tmp_path: Path, keep: float) -> None:
    path = tmp_path / "ckpt.pt"
    torch.save({"w": torch.randn(64, 64)}, path)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(InvalidInput, match=re.escape(str(path))):
        read_state(path)


def test_torch_file_not_holding_a_dict_is_invalid_input(tmp_path: Path) -> None:
    path = tmp_path / "list.pt"
    torch.save([torch.zeros(1)], path)
    with pytest.raises(InvalidInput, match="list"):
        read_state(path)


def test_write_pt_stores_plain_state_readable_weights_only(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    path = tmp_path / "train.pt"
    write_state({"model": model, "optim": opt, "np": np.ones(2), "dt": torch.float16}, path)
    back = read_state(path)
    assert torch.equal(back["model"]["weight"], model.weight.detach())
    assert back["optim"]["state"][0]["step"].item() == 1.0
    assert isinstance(back["np"], np.ndarray) and back["dt"] is torch.float16


def test_unknown_suffix_is_sniffed_on_read_and_refused_on_write(tmp_path: Path) -> None:
    st_file, pt_file = tmp_path / "weights.data", tmp_path / "state.data"
    safetensors.torch.save_file({"w": torch.ones(2)}, st_file)
    torch.save({"w": torch.ones(3)}, pt_file)
    assert read_state(st_file)["w"].shape == (2,) and read_state(pt_file)["w"].shape == (3,)
    (tmp_path / "notes.data").write_text("hello")
    with pytest.raises(InvalidInput, match="neither"):
        read_state(tmp_path / "notes.data")
    with pytest.raises(UsageError, match=r"\.safetensors.*\.pt"):
        write_state({"w": torch.ones(1)}, tmp_path / "out.npz")
    with pytest.raises(InvalidInput, match="no such"):
        read_state(tmp_path / "missing.pt")


# --- atomic writes ------------------------------------------------------------------------------


def test_invalid_state_writes_nothing(tmp_path: Path) -> None:
    for name in ("a.safetensors", "a.pt"):
        with pytest.raises(UnsupportedState, match="extra/x"):
            write_state({"w": torch.ones(1), "extra": {"x": {1, 2}}}, tmp_path / name)
    assert_same_files_list(tmp_path, set())


def test_failed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "model.safetensors"
    write_state({"w": torch.ones(2)}, path)
    before = path.read_bytes()

    def crash(tensors: dict[str, torch.Tensor], filename: str, metadata: Any = None) -> None:
        Path(filename).write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", crash)
    with pytest.raises(UsageError, match="No space left"):
        write_state({"w": torch.zeros(2), "nested": {"b": torch.ones(1)}}, path)  # written by save_file
    assert path.read_bytes() == before
    assert_same_files_list(tmp_path, {"model.safetensors"})


def test_failed_direct_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "model.safetensors"
    write_state({"w": torch.ones(2)}, path)
    before = path.read_bytes()
    calls = []

    def full_disk(self: AppendFile, data: bytes | memoryview) -> None:
        calls.append(len(memoryview(data)))
        if len(calls) > 1:  # the header went in; the first tensor does not
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(AppendFile, "write", full_disk)
    with pytest.raises(UsageError, match="No space left"):
        write_state({"w": torch.zeros(1 << 16)}, path)
    assert len(calls) == 2 and path.read_bytes() == before
    assert_same_files_list(tmp_path, {"model.safetensors"})


def test_write_into_a_missing_folder_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        write_state({"w": torch.ones(1)}, tmp_path / "nope" / "a.pt")


# --- Hugging Face folders -----------------------------------------------------------------------


def make_sharded(folder: Path, shards: int = 3, *, torch_format: bool = False) -> dict[str, torch.Tensor]:
    """A sharded HF checkpoint: ``shards`` weight files and the index mapping names to them."""
    folder.mkdir(exist_ok=True)
    torch.manual_seed(0)
    tensors = {f"layers.{i}.{kind}": torch.randn(4, 4) for i in range(shards * 2) for kind in ("weight", "bias")}
    names = list(tensors)
    ext = "bin" if torch_format else "safetensors"
    prefix = "pytorch_model" if torch_format else "model"
    weight_map = {}
    for s in range(shards):
        shard = f"{prefix}-{s + 1:05d}-of-{shards:05d}.{ext}"
        part = {n: tensors[n] for n in names[s::shards]}
        if torch_format:
            torch.save(part, folder / shard)
        else:
            safetensors.torch.save_file(part, folder / shard, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard))
    index = {"metadata": {"total_size": sum(t.numel() * 4 for t in tensors.values())}, "weight_map": weight_map}
    (folder / f"{prefix}.{ext}.index.json").write_text(json.dumps(index))
    return tensors


@pytest.mark.parametrize("torch_format", [False, True], ids=["safetensors", "bin"])
def test_sharded_folder_is_read_whole(tmp_path: Path, torch_format: bool) -> None:
    tensors = make_sharded(tmp_path / "hf", torch_format=torch_format)
    (tmp_path / "hf" / "config.json").write_text("{}")
    state = read_state(tmp_path / "hf")
    assert_states_equal(state, tensors)


def test_sharded_folder_with_a_missing_shard_is_invalid_input(tmp_path: Path) -> None:
    make_sharded(tmp_path)
    (tmp_path / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(InvalidInput, match=r"model-00002-of-00003\.safetensors.*missing"):
        read_state(tmp_path)


def test_index_naming_a_tensor_its_shard_lacks_is_invalid_input(tmp_path: Path) -> None:
    make_sharded(tmp_path)
    index_path = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["ghost.weight"] = "model-00001-of-00003.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(InvalidInput, match=r"ghost\.weight"):
        read_state(tmp_path)


@pytest.mark.parametrize(
    "index_text", ["{not json", '{"weight_map": ["a"]}', '{"weight_map": {"w": "../outside.safetensors"}}']
)
def test_broken_index_is_invalid_input(tmp_path: Path, index_text: str) -> None:
    (tmp_path / "model.safetensors.index.json").write_text(index_text)
    with pytest.raises(InvalidInput, match=r"index\.json"):
        read_state(tmp_path)


def test_damaged_shard_is_invalid_input_naming_the_shard(tmp_path: Path) -> None:
    make_sharded(tmp_path)
    shard = tmp_path / "model-00003-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(InvalidInput, match="00003"):
        read_state(tmp_path)


def test_single_file_folders_and_empty_folders(tmp_path: Path) -> None:
    single = tmp_path / "single"
    single.mkdir()
    safetensors.torch.save_file({"w": torch.ones(2)}, single / "model.safetensors")
    assert torch.equal(read_state(single)["w"], torch.ones(2))
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    safetensors.torch.save_file({"lora_A": torch.ones(1)}, adapter / "adapter_model.safetensors")
    assert set(read_state(adapter)) == {"lora_A"}
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "README.md").write_text("nothing here")
    with pytest.raises(InvalidInput, match="no model weights"):
        read_state(empty)
