"""torch.save files, read with ``weights_only=True``: loading never runs code from the file."""

from __future__ import annotations

import contextlib
import importlib
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ckptrepo.atomic import atomic_output
from ckptrepo.errors import InvalidInput
from ckptrepo.formats._files import summarize
from ckptrepo.state import flatten, unflatten


def _numpy_globals() -> list[Any]:
    """What pickled numpy arrays and scalars of plain dtypes need: data constructors only."""
    multiarray = importlib.import_module("numpy._core.multiarray" if hasattr(np, "_core") else "numpy.core.multiarray")
    names = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
    names += ["float16", "float32", "float64", "complex64", "complex128"]
    return [multiarray._reconstruct, multiarray.scalar, np.ndarray, np.dtype] + [type(np.dtype(n)) for n in names]


def _weights_only_reason(error: BaseException) -> str:
    text = summarize(error)
    for line in str(error).splitlines():
        if "WeightsUnpickler error:" in line:
            detail = line.split("WeightsUnpickler error:", 1)[1].split(" Please use", 1)[0].strip(" .")
            text = f"it holds objects that are not plain data ({detail})"
    return f"{text}; torch.load(weights_only=True) refused it (allow_pickle=True loads it: trusted files only)"


def read_torch(path: Path, *, allow_pickle: bool = False) -> Any:
    """The object a ``torch.save`` file holds, on the CPU (memory-mapped for zip-format files).

    Unpickling runs with ``weights_only=True`` (numpy arrays of plain dtypes allowed) unless
    ``allow_pickle``. InvalidInput for an unreadable, truncated or refused file.
    """
    mmap = zipfile.is_zipfile(path)
    allowed = getattr(torch.serialization, "safe_globals", None)
    try:
        with allowed(_numpy_globals()) if allowed else contextlib.nullcontext():
            return torch.load(path, map_location="cpu", weights_only=not allow_pickle, mmap=mmap)
    except pickle.UnpicklingError as e:
        raise InvalidInput(path=str(path), reason=_weights_only_reason(e)) from e
    except Exception as e:
        raise InvalidInput(path=str(path), reason=_damage(path, mmap) or summarize(e)) from e


def _damage(path: Path, is_zip: bool) -> str | None:
    """What is wrong with a file torch.load failed on, when its first bytes tell."""
    with open(path, "rb") as f:
        head = f.read(4)
    if not head:
        return "the file is empty"
    if head == b"PK\x03\x04" and not is_zip:
        return "it is a truncated or damaged torch.save (zip) file: its central directory is missing"
    return None


def write_torch(state: Any, path: Path, *, allow_pickle: bool = False, replace: bool = True) -> None:
    """``torch.save`` the plain form of ``state`` (modules etc. as state dicts) to ``path`` atomically
    (``replace=False``: OutputExists rather than replace a file there, see ``atomic_output``).

    The state is validated first (UnsupportedState); the file is readable by ``read_torch``
    without ``allow_pickle`` unless pickled values were allowed in.
    """
    flat = flatten(state, allow_pickle=allow_pickle)
    plain = unflatten(flat.skeleton, flat.tensors, allow_pickle=True)
    with atomic_output(path, replace=replace) as tmp:
        torch.save(plain, tmp)
