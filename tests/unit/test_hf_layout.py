"""formats.hf_layout: the folder save_pretrained writes, byte for byte, from specs alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch
from huggingface_hub import split_torch_state_dict_into_shards

from ckptrepo import state as st
from ckptrepo.errors import UnsupportedState, UsageError
from ckptrepo.formats import hf_layout


def _specs(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[str, list[int], str]]:
    return {k: (st.dtype_name(t.dtype), list(t.shape), "e/" + k) for k, t in tensors.items()}


def _assemble(shard: hf_layout.Shard, tensors: dict[str, torch.Tensor]) -> bytes:
    by_entry = {"e/" + k: t for k, t in tensors.items()}
    return shard.header + b"".join(bytes(st.tensor_bytes(by_entry[e].contiguous())) for _, e in shard.tensors)


def _mixed() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "z.weight": torch.randn(7, 5, generator=g),
        "a.bias": torch.randn(3, generator=g).to(torch.bfloat16),
        "m.scale": torch.randn(2, 2, generator=g).to(torch.float16),
        "ids": torch.arange(6, dtype=torch.int64),
        "flag": torch.tensor([True, False]),
        "empty": torch.zeros(0, 4),
        "ünï.weight": torch.randn(4, generator=g),
    }


def test_single_file_equals_save_file(tmp_path: Path) -> None:
    tensors = _mixed()
    shards = hf_layout.plan(_specs(tensors), 10**9)
    assert [s.name for s in shards] == ["model.safetensors"]
    expected = tmp_path / "ref.safetensors"
    safetensors.torch.save_file(tensors, str(expected), metadata={"format": "pt"})
    data = _assemble(shards[0], tensors)
    assert data == expected.read_bytes()
    assert shards[0].size == len(data)
    assert hf_layout.index_json(shards) is None


@pytest.mark.parametrize("limit", [1, 40, 100, 150, 400])
def test_sharding_matches_huggingface_hub(tmp_path: Path, limit: int) -> None:
    g = torch.Generator().manual_seed(1)
    tensors = {f"layer.{i}.w": torch.randn(n, generator=g) for i, n in enumerate([10, 30, 5, 40, 1, 20, 25])}
    tensors["big"] = torch.randn(200, generator=g)
    tensors["tail"] = torch.randn(3, generator=g).to(torch.float16)
    split = split_torch_state_dict_into_shards(tensors, filename_pattern="model{suffix}.safetensors",
                                               max_shard_size=limit)
    shards = hf_layout.plan(_specs(tensors), limit)
    assert {s.name: sorted(k for k, _ in s.tensors) for s in shards} == {
        name: sorted(keys) for name, keys in split.filename_to_tensors.items()}
    assert [s.name for s in shards] == list(split.filename_to_tensors)
    for shard in shards:
        ref = tmp_path / shard.name
        safetensors.torch.save_file({k: tensors[k] for k, _ in shard.tensors}, str(ref), metadata={"format": "pt"})
        assert _assemble(shard, tensors) == ref.read_bytes(), shard.name
        assert shard.size == ref.stat().st_size
    index = hf_layout.index_json(shards)
    if split.is_sharded:
        assert index is not None
        doc = json.loads(index)
        assert doc == {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        assert index == (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
    else:
        assert index is None


def test_save_pretrained_folder_byte_for_byte(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50, n_positions=32,
                                         bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    model.save_pretrained(tmp_path / "hf", max_shard_size="8KB")
    index = json.loads((tmp_path / "hf" / hf_layout.INDEX_NAME).read_text())
    keys = list(index["weight_map"])  # save_pretrained's own order is the model's state_dict order
    sd = model.state_dict()
    ordered = {k: sd[k] for k in sd if k in index["weight_map"]}
    assert sorted(ordered) == sorted(keys)
    shards = hf_layout.plan(_specs(ordered), 8_000)
    assert len(shards) > 2
    for shard in shards:
        assert _assemble(shard, ordered) == (tmp_path / "hf" / shard.name).read_bytes(), shard.name
    ours = json.loads(hf_layout.index_json(shards) or b"")
    assert ours["weight_map"] == index["weight_map"]
    assert ours["metadata"]["total_size"] == index["metadata"]["total_size"]


def test_model_keys() -> None:
    w, b = torch.ones(2), torch.zeros(1)
    flat = st.flatten({"w": w, "b": b})
    assert hf_layout.model_keys(flat.skeleton) == {"w": "w", "b": "b"}
    module = torch.nn.Linear(2, 1)
    ck = st.flatten({"model": module.state_dict(), "optimizer": {"state": {}}, "step": 3})
    assert hf_layout.model_keys(ck.skeleton) == {"weight": "model/weight", "bias": "model/bias"}
    lightning = st.flatten({"epoch": 1, "state_dict": {"net.w": w}, "optimizer_states": []})
    assert hf_layout.model_keys(lightning.skeleton) == {"net.w": "state_dict/net.w"}
    tied = st.flatten({"a": w, "b": w})
    keys = hf_layout.model_keys(tied.skeleton)
    assert keys is not None and keys["a"] == keys["b"]
    assert hf_layout.model_keys(st.flatten({"x": {"y": w}}).skeleton) is None
    assert hf_layout.model_keys(st.flatten({"model": {"y": {"z": w}}}).skeleton) is None
    assert hf_layout.model_keys(st.flatten({}).skeleton) is None
    assert hf_layout.model_keys(st.flatten([w]).skeleton) is None
    assert hf_layout.model_keys({"d": "garbage"}) is None


def test_plan_refusals_and_sizes() -> None:
    with pytest.raises(UsageError):
        hf_layout.plan({}, 100)
    with pytest.raises(UsageError):
        hf_layout.plan({"a": ("float32", [1], "a")}, 0)
    with pytest.raises(UnsupportedState):
        hf_layout.plan({"a": ("complex128", [1], "a")}, 100)
    assert hf_layout.parse_size("5GB") == 5 * 10**9
    assert hf_layout.parse_size("500mb") == 5 * 10**8
    assert hf_layout.parse_size("2GiB") == 2 * 2**30
    assert hf_layout.parse_size(1234) == 1234
    assert hf_layout.parse_size("1000") == 1000
    for bad in ("", "5 parsecs", "-1GB", "0", 0):
        with pytest.raises(UsageError):
            hf_layout.parse_size(bad)


def test_weight_file_names() -> None:
    assert hf_layout.is_weight_file("model.safetensors")
    assert hf_layout.is_weight_file("model.safetensors.index.json")
    assert hf_layout.is_weight_file("model-00002-of-00003.safetensors")
    assert not hf_layout.is_weight_file("sub/model.safetensors")
    assert not hf_layout.is_weight_file("config.json")
