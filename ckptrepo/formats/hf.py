"""Hugging Face model folders: one weights file, or shards listed by an ``*.index.json``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ckptrepo.errors import InvalidInput
from ckptrepo.formats.safetensors_io import read_safetensors
from ckptrepo.formats.torch_io import read_torch

Reader = Callable[..., Any]
_INDEXES: list[tuple[str, Reader]] = [
    ("model.safetensors.index.json", read_safetensors),
    ("pytorch_model.bin.index.json", read_torch),
]
_SINGLES: list[tuple[str, Reader]] = [("model.safetensors", read_safetensors), ("pytorch_model.bin", read_torch)]


def read_hf_folder(folder: Path, *, allow_pickle: bool = False) -> dict[str, Any]:
    """The tensors of a model folder, all shards read and checked against the index first.

    Looks for the standard names (safetensors before pytorch_model.bin), else for a single
    ``*.safetensors.index.json`` or a single ``*.safetensors`` file. InvalidInput for a folder
    with none of these, a broken index, a missing shard or a tensor the index promises but
    its shard lacks.
    """
    path, reader, sharded = _weights_of(folder)
    if sharded:
        return _read_sharded(path, reader, allow_pickle)
    return _as_dict(path, reader(path, allow_pickle=allow_pickle))


def weight_files(folder: Path) -> set[str]:
    """The names of the files ``read_hf_folder`` reads the tensors from: the weights file, or the
    index and the shards it names (InvalidInput as there)."""
    path, _, sharded = _weights_of(folder)
    if not sharded:
        return {path.name}
    return {path.name, *_weight_map(path).values()}


def _weights_of(folder: Path) -> tuple[Path, Reader, bool]:
    """The file ``read_hf_folder`` reads, its reader, and whether it is an index of shards."""
    for name, reader in _INDEXES:
        if (folder / name).is_file():
            return folder / name, reader, True
    for name, reader in _SINGLES:
        if (folder / name).is_file():
            return folder / name, reader, False
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if len(indexes) == 1:
        return indexes[0], read_safetensors, True
    files = sorted(folder.glob("*.safetensors"))
    if len(files) == 1 and not indexes:
        return files[0], read_safetensors, False
    wanted = ", ".join(n for n, _ in _SINGLES + _INDEXES)
    raise InvalidInput(path=str(folder), reason=f"no model weights found (looked for {wanted})")


def _as_dict(path: Path, content: Any) -> dict[str, Any]:
    if not isinstance(content, dict):
        raise InvalidInput(path=str(path), reason=f"it holds a {type(content).__name__}, not a dict of tensors")
    return content


def _weight_map(index_path: Path) -> dict[str, str]:
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InvalidInput(path=str(index_path), reason=f"the index is not readable JSON ({e})") from e
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(s, str) for s in weight_map.values()):
        raise InvalidInput(path=str(index_path), reason='it has no "weight_map" of tensor name -> shard file')
    return weight_map


def _read_sharded(index_path: Path, reader: Reader, allow_pickle: bool) -> dict[str, Any]:
    weight_map = _weight_map(index_path)
    contents: dict[str, dict[str, Any]] = {}
    for shard in dict.fromkeys(weight_map.values()):
        shard_path = index_path.parent / shard
        if Path(shard).name != shard or shard in (".", ".."):
            raise InvalidInput(path=str(index_path), reason=f"shard {shard!r} is not a file name in the folder")
        if not shard_path.is_file():
            holds = next(n for n, s in weight_map.items() if s == shard)
            raise InvalidInput(path=str(index_path), reason=f"shard {shard} (holding {holds!r} ...) is missing")
        contents[shard] = _as_dict(shard_path, reader(shard_path, allow_pickle=allow_pickle))
    state: dict[str, Any] = {}
    for name, shard in weight_map.items():
        if name not in contents[shard]:
            raise InvalidInput(path=str(index_path), reason=f"it puts {name!r} in {shard}, which lacks it")
        state[name] = contents[shard][name]
    for shard, content in contents.items():
        for name, value in content.items():
            if weight_map.get(name, shard) != shard:
                reason = f"{name!r} is in {shard} and in {weight_map[name]}"
                raise InvalidInput(path=str(index_path), reason=reason)
            state.setdefault(name, value)
    return state
