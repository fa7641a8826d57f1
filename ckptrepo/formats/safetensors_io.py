"""safetensors files: flat dicts of tensors as is, nested states with their skeleton in the metadata."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from safetensors import safe_open

from ckptrepo.errors import CkptError, InvalidInput, UnsupportedState, UsageError
from ckptrepo.formats._files import atomic_output, summarize
from ckptrepo.state import SUPPORTED_DTYPES, flatten, is_flat_tensor_dict, unflatten

SKELETON_KEY = "ckptrepo.skeleton"
_load_safetensors_bytes = safetensors.torch.load  # the safetensors format holds no pickle


def _round_trips(dtype: torch.dtype) -> bool:
    try:
        probe = torch.zeros(16, dtype=torch.uint8).view(dtype)
        restored = _load_safetensors_bytes(safetensors.torch.save({"t": probe}))
        return restored["t"].dtype == dtype
    except Exception:
        return False


# The dtypes this safetensors can store; others need a torch.save file.
SAFETENSORS_DTYPES = frozenset(d for d in SUPPORTED_DTYPES.values() if _round_trips(d))


def read_safetensors(path: Path, *, allow_pickle: bool = False) -> dict[str, Any]:
    """The tensors of a safetensors file; nested again when ``write_state`` stored a skeleton.

    The header and the data length are validated when the file is opened, before any tensor is
    returned. InvalidInput for an unreadable, truncated or corrupt file or skeleton.
    """
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 - not a dict
    except Exception as e:
        raise InvalidInput(path=str(path), reason=summarize(e)) from e
    if SKELETON_KEY not in metadata:
        return tensors
    try:
        state = unflatten(json.loads(metadata[SKELETON_KEY]), tensors, allow_pickle=allow_pickle)
    except (ValueError, CkptError) as e:
        raise InvalidInput(path=str(path), reason=f"its ckptrepo skeleton is unusable: {e}") from e
    if not isinstance(state, dict):
        raise InvalidInput(path=str(path), reason="its ckptrepo skeleton does not describe a dict")
    return state


def _writable(name: str, t: torch.Tensor, seen: set[int]) -> torch.Tensor:
    """``t`` on the CPU, contiguous and sharing memory with no earlier tensor (cloned if needed)."""
    if t.dtype not in SAFETENSORS_DTYPES:
        reason = f"safetensors has no type for {t.dtype}; write a .pt file to keep it"
        raise UnsupportedState(path=name, reason=reason)
    t = t.detach().cpu().resolve_conj().resolve_neg()
    if not t.is_contiguous() or (t.numel() and t.untyped_storage()._cdata in seen):
        t = t.clone(memory_format=torch.contiguous_format)
    seen.add(t.untyped_storage()._cdata)
    return t


def write_safetensors(state: Any, path: Path, *, allow_pickle: bool = False) -> None:
    """Write ``state`` to ``path`` atomically, after validating all of it.

    A flat ``dict[str, Tensor]`` is written under its own keys; anything else (a dict, module,
    optimizer ...) is written under its entry names with the skeleton JSON in the metadata key
    ``ckptrepo.skeleton``, which ``read_safetensors`` uses to rebuild it. Tensors that share
    memory are written as separate copies.
    """
    flat = flatten(state, allow_pickle=allow_pickle)
    metadata = {"format": "pt"}
    if is_flat_tensor_dict(state):
        named: dict[str, torch.Tensor] = dict(state)
    elif isinstance(flat.skeleton, dict) and "d" in flat.skeleton:
        named = flat.tensors
        metadata[SKELETON_KEY] = json.dumps(flat.skeleton, separators=(",", ":"), allow_nan=False)
    else:
        raise UsageError(f"cannot write {path}: a state file holds a dict, not {type(state).__name__}")
    seen: set[int] = set()
    tensors = {name: _writable(name, t, seen) for name, t in named.items()}
    with atomic_output(path) as tmp:
        safetensors.torch.save_file(tensors, str(tmp), metadata=metadata)
