"""Reading and writing checkpoints people already have: safetensors, torch.save, HF and DCP folders.

``read_state`` validates the whole input before returning and raises InvalidInput naming the
path and the cause; ``write_state`` validates the whole state, then writes atomically (a temp
file or folder beside the target, fsynced, renamed), so no partial output is ever visible.
One state, several views: ``write_state(..., format=)`` writes any of ``FORMATS`` whatever the
name. Nothing here unpickles arbitrary objects unless the caller passes ``allow_pickle=True``.
Importing this package does not import torch: the readers and writers that make tensors
(``safetensors_io``, ``torch_io``, ``hf``, ``dcp_folder``) are imported by the calls that need
them, and ``safetensors_file.read_flat`` reads a safetensors file without torch at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptrepo.atomic import check_new
from ckptrepo.errors import InvalidInput, UsageError
from ckptrepo.formats.prefetch import read_states
from ckptrepo.formats.readbuffer import ReadBuffer
from ckptrepo.formats.run_meta import (
    RUN_HINT,
    RunMeta,
    checkpoint_step,
    fill_run_meta,
    lightning_meta,
    run_checkpoints,
    run_meta,
)

__all__ = [
    "DCP_METADATA",
    "FORMATS",
    "RUN_HINT",
    "SAFETENSORS_SUFFIXES",
    "TORCH_SUFFIXES",
    "ReadBuffer",
    "RunMeta",
    "check_file_target",
    "check_folder_target",
    "checkpoint_step",
    "fill_run_meta",
    "is_dcp_folder",
    "lightning_meta",
    "output_format",
    "read_ahead",
    "read_state",
    "read_states",
    "run_checkpoints",
    "run_meta",
    "suffix_format",
    "write_state",
]

SAFETENSORS_SUFFIXES = (".safetensors",)
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
FORMATS = ("safetensors", "torch", "dcp")  # what write_state writes; dcp: a torch.distributed.checkpoint folder
DCP_METADATA = ".metadata"  # the file that makes a folder a DCP checkpoint


def _sniff(path: Path) -> str | None:
    """``"safetensors"`` or ``"torch"`` from a file's first bytes, None when neither."""
    with open(path, "rb") as f:
        head = f.read(9)
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":
        return "torch"
    if len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") > 1:
        return "safetensors"
    return None


def read_ahead(path: Path) -> None:
    """Start reading the safetensors file ``path`` whole, on a thread of its own, once its header
    proved valid, so that this process reads it while it does other work (a ``ckpt commit FILE``
    process: while Python imports the library). The first ``ReadBuffer.read`` of the unchanged
    file in this process takes those bytes (``readbuffer.read_ahead``); memory: a buffer of the
    file's size, which a read-ahead nobody takes keeps until the process exits. Anything else
    (another format, a folder, a file that is no safetensors file or cannot be read) is left
    alone: its reader reports what is wrong."""
    path = Path(path)
    if path.suffix.lower() in SAFETENSORS_SUFFIXES and path.is_file():
        from ckptrepo.formats import readbuffer, safetensors_file

        readbuffer.read_ahead(path, safetensors_file.check_header)


def is_dcp_folder(path: Path) -> bool:
    """Whether ``path`` is a folder that torch.distributed.checkpoint wrote: it holds a ``.metadata``
    (or, saved without collectives, ``__RANK.metadata`` files, which ``read_state`` refuses by name)."""
    path = Path(path)
    return (path / DCP_METADATA).is_file() or (path.is_dir() and any(path.glob("__*" + DCP_METADATA)))


def read_state(path: Path, *, allow_pickle: bool = False, mapped: bool = False,
               buffer: ReadBuffer | None = None) -> dict[str, Any]:
    """The state in a safetensors file, a torch.save file, a DCP folder or a Hugging Face model folder.

    Safetensors files give a flat ``name -> tensor`` dict (nested again if ``write_state``
    stored a skeleton); torch.save files give the dict they hold, loaded with
    ``weights_only=True`` and memory-mapped; DCP folders (``is_dcp_folder``) give the nested
    state with every tensor whole, assembled from all ranks' shards (``read_dcp_folder``); other
    folders give all the shards' tensors of a Hugging Face model. Files with other
    suffixes are recognised by their first bytes. InvalidInput for anything unreadable, corrupt,
    truncated, incomplete or not a dict. ``mapped``: a safetensors file's tensors are views of
    a memory map of it, read when first touched; ``buffer``: a safetensors file's tensors are
    views of that ``ReadBuffer``, valid until its next read (see ``read_safetensors``).
    """
    path = Path(path)
    if path.is_dir() and is_dcp_folder(path):
        from ckptrepo.formats.dcp_folder import read_dcp_folder

        return read_dcp_folder(path, allow_pickle=allow_pickle)
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


def suffix_format(path: Path) -> str | None:
    """The format ``path``'s suffix names (``"safetensors"`` or ``"torch"``), None for other suffixes."""
    suffix = Path(path).suffix.lower()
    return "safetensors" if suffix in SAFETENSORS_SUFFIXES else "torch" if suffix in TORCH_SUFFIXES else None


def check_folder_target(folder: Path) -> None:
    """UsageError unless ``folder`` can become a new checkpoint folder: it does not exist or is an
    empty folder, and its parent folder exists. Changes nothing."""
    folder = Path(folder)
    if not folder.parent.is_dir():
        raise UsageError(f"cannot write {folder}: folder {folder.parent} does not exist")
    if folder.is_dir():
        try:
            empty = next(folder.iterdir(), None) is None
        except OSError as e:
            raise UsageError(f"cannot write {folder}: {e.strerror or e}") from e
        if empty:
            return
    if folder.exists() or folder.is_symlink():
        raise UsageError(
            f"cannot write {folder}: it exists and is not an empty folder",
            hint="Name a new folder (or an empty one); an existing checkpoint is never overwritten.",
        )


def check_file_target(path: Path, *, replace: bool = True) -> None:
    """UsageError when ``path`` is a folder, OutputExists when anything is there and not ``replace``
    (a symbolic link is never followed: a link is something there, and what ``replace`` replaces).
    Changes nothing."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():  # first: --force would not help
        raise UsageError(f"cannot write {path}: it is a folder, not a file",
                         hint="Name a file, or write a folder in format dcp (a torch.distributed.checkpoint folder).")
    if not replace:
        check_new(path)


def output_format(path: Path, format: str | None = None, *, replace: bool = True) -> str:
    """The format ``write_state(state, path, format=format, replace=replace)`` writes, checked before
    any state is made: ``format`` when given (one of ``FORMATS``), else the one ``path``'s suffix names.

    UsageError for an unknown format or suffix, and for a target that format cannot take: for
    ``dcp`` and ``hf`` (a model folder, which ``Repo.export`` writes), anything but a new or empty
    folder (``check_folder_target``); for a file format, a
    folder, or anything at all unless ``replace`` (``check_file_target``). Writes nothing and does
    not import torch.
    """
    path = Path(path)
    if format == "hf":  # a model folder: Repo.export(format="hf") writes it, from a commit
        check_folder_target(path)
        return format
    if format is not None and format not in FORMATS:
        raise UsageError(f"cannot write {path}: unknown format {format!r}",
                         hint=f"Use one of {', '.join(FORMATS)} or hf.")
    kind = format or suffix_format(path)
    if kind is None:
        works = ", ".join(SAFETENSORS_SUFFIXES + TORCH_SUFFIXES)
        raise UsageError(
            f"cannot write {path}: unknown suffix {path.suffix or '(none)'!r}; use one of {works}",
            hint=f"Name it {'/'.join(SAFETENSORS_SUFFIXES)}, or {'/'.join(TORCH_SUFFIXES)} for torch.save, or give "
            "the format: safetensors, torch or dcp (a torch.distributed.checkpoint folder).",
        )
    if kind == "dcp":
        check_folder_target(path)
    else:
        check_file_target(path, replace=replace)
    return kind


def write_state(state: Any, path: Path, *, allow_pickle: bool = False, format: str | None = None,
                replace: bool = True) -> None:
    """Write ``state`` to ``path`` in ``format`` (default: the one its suffix names), atomically and
    validated first (``output_format`` checks the format and the target before anything else).
    A file there is replaced (a symbolic link itself, never what it points at) unless ``replace``
    is false (OutputExists, also for a file that appears while the state is written); a folder
    is never replaced.

    ``safetensors``: a flat ``dict[str, Tensor]`` as is, anything else with its structure in
    the metadata (see ``write_safetensors``); ``torch`` (``.pt``/``.pth``/``.bin``/``.ckpt``):
    ``torch.save`` of the plain state; ``dcp``: a torch.distributed.checkpoint folder that
    ``dcp.load`` reads at any world size (``write_dcp_folder``). UnsupportedState for values that
    cannot be stored (unless ``allow_pickle``).
    """
    path = Path(path)
    kind = output_format(path, format, replace=replace)
    if kind == "safetensors":
        from ckptrepo.formats.safetensors_io import write_safetensors

        write_safetensors(state, path, allow_pickle=allow_pickle, replace=replace)
    elif kind == "torch":
        from ckptrepo.formats.torch_io import write_torch

        write_torch(state, path, allow_pickle=allow_pickle, replace=replace)
    else:
        from ckptrepo.formats.dcp_folder import write_dcp_folder

        write_dcp_folder(state, path, allow_pickle=allow_pickle)
