"""Reading and writing checkpoint files people already have: safetensors, torch.save, HF folders.

``read_state`` validates the whole input before returning and raises InvalidInput naming the
path and the cause; ``write_state`` validates the whole state, then writes atomically (a temp
file in the same folder, fsynced, renamed), so no partial output file is ever visible.
Nothing here unpickles arbitrary objects unless the caller passes ``allow_pickle=True``.
Importing this package does not import torch: the readers and writers that make tensors
(``safetensors_io``, ``torch_io``, ``hf``) are imported by the calls that need them, and
``safetensors_file.read_flat`` reads a safetensors file without torch at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptrepo.errors import InvalidInput, UsageError
from ckptrepo.formats.prefetch import read_states
from ckptrepo.formats.readbuffer import ReadBuffer

__all__ = ["SAFETENSORS_SUFFIXES", "TORCH_SUFFIXES", "ReadBuffer", "read_state", "read_states", "write_state"]

SAFETENSORS_SUFFIXES = (".safetensors",)
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def _sniff(path: Path) -> str | None:
    """``"safetensors"`` or ``"torch"`` from a file's first bytes, None when neither."""
    with open(path, "rb") as f:
        head = f.read(9)
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":
        return "torch"
    if len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") > 1:
        return "safetensors"
    return None


def read_state(path: Path, *, allow_pickle: bool = False, mapped: bool = False,
               buffer: ReadBuffer | None = None) -> dict[str, Any]:
    """The state in a safetensors file, a torch.save file or a Hugging Face model folder.

    Safetensors files give a flat ``name -> tensor`` dict (nested again if ``write_state``
    stored a skeleton); torch.save files give the dict they hold, loaded with
    ``weights_only=True`` and memory-mapped; folders give all shards' tensors. Files with other
    suffixes are recognised by their first bytes. InvalidInput for anything unreadable, corrupt,
    truncated, incomplete or not a dict. ``mapped``: a safetensors file's tensors are views of
    a memory map of it, read when first touched; ``buffer``: a safetensors file's tensors are
    views of that ``ReadBuffer``, valid until its next read (see ``read_safetensors``).
    """
    path = Path(path)
    if path.is_dir():
        from ckptrepo.formats.hf import read_hf_folder

        return read_hf_folder(path, allow_pickle=allow_pickle)
    if not path.is_file():
        raise InvalidInput(path=str(path), reason="no such file or folder")
    suffix = path.suffix.lower()
    try:
        kind = (
            "safetensors" if suffix in SAFETENSORS_SUFFIXES else "torch" if suffix in TORCH_SUFFIXES else _sniff(path)
        )
    except OSError as e:
        raise InvalidInput(path=str(path), reason=e.strerror or str(e)) from e
    if kind == "safetensors":
        from ckptrepo.formats.safetensors_io import read_safetensors

        return read_safetensors(path, allow_pickle=allow_pickle, mapped=mapped, buffer=buffer)
    if kind is None:
        raise InvalidInput(path=str(path), reason="it is neither a safetensors nor a torch.save file")
    from ckptrepo.formats.torch_io import read_torch

    content = read_torch(path, allow_pickle=allow_pickle)
    if not isinstance(content, dict):
        raise InvalidInput(path=str(path), reason=f"it holds a {type(content).__name__}, not a dict")
    return content


def write_state(state: Any, path: Path, *, allow_pickle: bool = False) -> None:
    """Write ``state`` to ``path`` in the format its suffix names, atomically and validated first.

    ``.safetensors``: a flat ``dict[str, Tensor]`` as is, anything else with its structure in
    the metadata (see ``write_safetensors``); ``.pt``/``.pth``/``.bin``/``.ckpt``: ``torch.save``
    of the plain state. UsageError for other suffixes; UnsupportedState for values that cannot
    be stored (unless ``allow_pickle``).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in SAFETENSORS_SUFFIXES:
        from ckptrepo.formats.safetensors_io import write_safetensors

        write_safetensors(state, path, allow_pickle=allow_pickle)
    elif suffix in TORCH_SUFFIXES:
        from ckptrepo.formats.torch_io import write_torch

        write_torch(state, path, allow_pickle=allow_pickle)
    else:
        works = ", ".join(SAFETENSORS_SUFFIXES + TORCH_SUFFIXES)
        raise UsageError(f"cannot write {path}: unknown suffix {suffix or '(none)'!r}; use one of {works}")
