"""The Hugging Face folder a commit exports as: which tensors are the model's weights, how they
are cut into safetensors shards, and each shard's header and the index, byte for byte.

Pure functions over a commit's skeleton and tensor rows: no repository, no tensor bytes. A
folder is the commit's files, then either one ``model.safetensors`` or the shards
``model-00001-of-0000N.safetensors`` ... and ``model.safetensors.index.json``, as
``PreTrainedModel.save_pretrained`` writes weights given in the commit's key order (huggingface_hub's
``split_torch_state_dict_into_shards``: greedy, in key order, a tensor larger than the limit alone
in its shard; each shard as ``safetensors.torch.save_file(..., metadata={"format": "pt"})``). A
commit read from a sharded folder holds its keys in the shards' order, not the model's, so its
shards may group the keys otherwise than the folder it came from did: ``from_pretrained`` reads
either the same way (the index maps every key to its file).
A shard file is its ``header`` followed by its tensors' C-order bytes in ``tensors`` order; the
``ckptrepo`` filesystem view and ``Repo.export(format="hf")`` both build files from this plan.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckptrepo.errors import UnsupportedState, UsageError

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
SHARD_NAME = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
METADATA = {"format": "pt"}  # what save_pretrained passes to save_file
DEFAULT_MAX_SHARD_SIZE = 5 * 10**9  # "5GB": huggingface_hub's default (transformers 5 passes "50GB")
_MODEL_KEYS = ("model", "state_dict")  # Checkpointer's and Lightning's key of the model's weights
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


@dataclass(frozen=True)
class Shard:
    """One safetensors file of the folder: ``header`` (length prefix and JSON, padded as the
    library pads it), then the bytes of ``tensors`` (``(key in the file, entry name)``) in that
    order; ``size``: the whole file's bytes."""

    name: str
    header: bytes
    tensors: list[tuple[str, str]]
    size: int


def is_weight_file(path: str) -> bool:
    """Whether ``path`` (relative to a folder) is one of the weight files or the index that an
    export writes itself: those are never kept as files of a commit."""
    return path in (WEIGHTS_NAME, INDEX_NAME) or SHARD_NAME.fullmatch(path) is not None


def model_keys(skeleton: Any) -> dict[str, str] | None:
    """``{key in the HF weight files: entry name}`` of the model's weights in a commit whose
    state has ``skeleton``: the state itself when it is a flat dict of tensors (``ckpt commit``
    of a safetensors file or an HF folder), else its ``"model"`` value (``Checkpointer``) or
    ``"state_dict"`` value (Lightning) when that is one; None otherwise. Two keys may name one
    entry (tied weights committed as one tensor)."""
    keys = flat_keys(skeleton)
    if keys:
        return keys
    if not isinstance(skeleton, dict) or not isinstance(skeleton.get("d"), list):
        return None
    items = skeleton["d"]
    values = dict(zip(items[0::2], items[1::2], strict=True)) if len(items) % 2 == 0 else {}
    for name in _MODEL_KEYS:
        value = values.get(name)
        if value is not None:
            keys = flat_keys(value)
            if keys:
                return keys
    return None


def flat_keys(skeleton: Any) -> dict[str, str] | None:
    """``{key: entry name}`` when ``skeleton`` describes a flat dict of tensors, else None."""
    import torch

    from ckptrepo import state as st

    probe: dict[str, torch.Tensor] = {}

    class Entries(dict[str, torch.Tensor]):
        def __contains__(self, name: object) -> bool:
            return True

        def __getitem__(self, name: str) -> torch.Tensor:
            return probe.setdefault(name, torch.empty(0))

    try:
        state = st.unflatten(skeleton, Entries())
    except Exception:
        return None
    if not st.is_flat_tensor_dict(state):
        return None
    by_object = {id(t): name for name, t in probe.items()}
    return {key: by_object[id(t)] for key, t in state.items()}


def parse_size(size: int | str) -> int:
    """Bytes of a shard size limit: an int, or digits and a unit (``"5GB"``, ``"500MB"``,
    ``"2GiB"``, ``"1000"``) as huggingface_hub reads them; UsageError otherwise."""
    if isinstance(size, int) and not isinstance(size, bool):
        value = size
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B|)\s*", str(size), re.IGNORECASE)
        if match is None:
            raise UsageError(f"cannot read shard size {size!r}",
                             hint="Give bytes or a size such as 500MB, 5GB or 2GiB.")
        value = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if value <= 0:
        raise UsageError(f"the shard size must be positive, not {size!r}")
    return value


def plan(specs: Mapping[str, tuple[str, list[int], str]], max_shard_size: int) -> list[Shard]:
    """The safetensors files of a folder holding ``specs`` (``{key: (dtype name as in
    TensorRow.dtype, shape, entry name)}``, in the order the shards take the keys):
    one ``model.safetensors`` when all fits in ``max_shard_size`` bytes, else shards split as
    huggingface_hub splits them. UnsupportedState for a dtype safetensors cannot hold;
    UsageError for no tensors or a limit below one byte."""
    from ckptrepo import state as st
    from ckptrepo.formats.safetensors_io import SAFETENSORS_DTYPES, flat_header

    if not specs:
        raise UsageError("there are no model weights to write")
    if max_shard_size <= 0:
        raise UsageError(f"the shard size must be positive, not {max_shard_size}")
    dtypes = {}
    for key, (dtype_name, _, _) in specs.items():
        dtype = st.dtype_from_name(dtype_name)
        if dtype not in SAFETENSORS_DTYPES:
            raise UnsupportedState(path=key, reason=f"safetensors has no type for {dtype_name}")
        dtypes[key] = dtype
    sizes = {key: math.prod(shape) * dtypes[key].itemsize for key, (_, shape, _) in specs.items()}
    groups: list[list[str]] = []
    current: list[str] = []
    current_size = 0
    for key in specs:  # huggingface_hub's split_state_dict_into_shards_factory, step by step
        if sizes[key] > max_shard_size:
            groups.append([key])
            continue
        if current_size + sizes[key] > max_shard_size:
            groups.append(current)
            current, current_size = [], 0
        current.append(key)
        current_size += sizes[key]
    if current:
        groups.append(current)
    shards = []
    for i, group in enumerate(groups):
        name = WEIGHTS_NAME if len(groups) == 1 else f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        made = flat_header({k: (dtypes[k], list(specs[k][1])) for k in group}, METADATA)
        if made is None:
            reason = "this safetensors library writes headers ckptrepo cannot reproduce"
            raise UnsupportedState(path=name, reason=reason)
        header, order = made
        size = len(header) + sum(sizes[k] for k in group)
        shards.append(Shard(name=name, header=header, tensors=[(k, specs[k][2]) for k in order], size=size))
    return shards


def index_json(shards: list[Shard]) -> bytes | None:
    """The ``model.safetensors.index.json`` save_pretrained writes beside ``shards`` (``{"metadata":
    {"total_size": bytes of the tensors}, "weight_map": {key: shard}}``, keys sorted, two-space
    indent, a final newline); None for a single ``model.safetensors``, which has none."""
    if len(shards) < 2:
        return None
    total = sum(s.size - len(s.header) for s in shards)
    weight_map = {key: s.name for s in shards for key, _ in s.tensors}
    doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
