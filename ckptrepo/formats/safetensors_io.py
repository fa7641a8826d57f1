"""safetensors files: flat dicts of tensors as is, nested states with their skeleton in the metadata."""

from __future__ import annotations

import functools
import json
import math
import mmap
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from safetensors import safe_open

from ckptrepo.atomic import atomic_output
from ckptrepo.errors import CkptError, InvalidInput, UnsupportedState, UsageError
from ckptrepo.formats._files import summarize
from ckptrepo.formats.readbuffer import ReadBuffer
from ckptrepo.state import SUPPORTED_DTYPES, flatten, is_flat_tensor_dict, tensor_bytes, unflatten
from ckptrepo.storage.appendfile import AppendFile

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


# safetensors' dtype names, for the tensors ``read_safetensors(mapped=True)`` maps itself.
_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64, "C64": torch.complex64,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}


def read_safetensors(path: Path, *, allow_pickle: bool = False, mapped: bool = False,
                     buffer: ReadBuffer | None = None) -> dict[str, Any]:
    """The tensors of a safetensors file; nested again when ``write_state`` stored a skeleton.

    The header and the data length are validated when the file is opened, before any tensor is
    returned. InvalidInput for an unreadable, truncated or corrupt file or skeleton.

    ``mapped``: the tensors are copy-on-write views of a private memory map of the file instead
    of copies read at once (``_mapped_tensors``): their bytes come from the page cache or the
    disk when first touched, read ahead by the kernel, so a consumer such as a blocking
    ``Repo.commit`` overlaps the reading with its own work. The file must not be truncated
    while the tensors are in use (touching a page past the end raises SIGBUS).

    ``buffer``: the file is read whole into that ``ReadBuffer`` (direct I/O) and the tensors
    are views of it, valid until the buffer's next read: the cheapest way to import many
    files one after another (see ``readbuffer``).
    """
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            names = list(f.keys())
            if buffer is not None:
                tensors = _views(buffer.read(path), names)
            else:
                tensors = _mapped_tensors(path, names) if mapped else {}
            for name in names:
                if name not in tensors:
                    tensors[name] = f.get_tensor(name)
    except CkptError:
        raise  # already says which file and why (ReadBuffer.read)
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


def _mapped_tensors(path: Path, names: list[str]) -> dict[str, torch.Tensor]:
    """Views of a private, copy-on-write map of ``path`` for the tensors ``names`` whose dtype
    and alignment allow it (the others are left for the caller to read). The header has been
    validated by ``safe_open`` (offsets inside the file, sizes matching shapes); the kernel is
    asked to read the whole file ahead."""
    with open(path, "rb") as f:  # not empty: ``safe_open`` read its header
        view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    if hasattr(mmap, "MADV_WILLNEED"):
        view.madvise(mmap.MADV_WILLNEED)
    return _views(view, names)


def _views(view: Any, names: list[str]) -> dict[str, torch.Tensor]:
    """Tensors over ``view`` (a writable buffer holding a whole safetensors file whose header
    ``safe_open`` validated) for the tensors ``names`` whose dtype and alignment allow it."""
    (length,) = struct.unpack("<Q", view[:8])
    header = json.loads(bytes(view[8 : 8 + length]))
    start = 8 + length
    out: dict[str, torch.Tensor] = {}
    for name in names:
        info = header[name]
        dtype = _DTYPES.get(info["dtype"])
        begin, end = info["data_offsets"]
        offset = start + begin
        if dtype is None or end == begin or offset % dtype.itemsize:
            continue
        raw = torch.frombuffer(view, dtype=torch.uint8, count=end - begin, offset=offset)
        out[name] = raw.view(dtype).view(info["shape"])
    return out


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


def write_safetensors(state: Any, path: Path, *, allow_pickle: bool = False, replace: bool = True) -> None:
    """Write ``state`` to ``path`` atomically, after validating all of it (``replace=False``:
    OutputExists rather than replace a file there, see ``atomic_output``).

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
    header = flat_header({n: (t.dtype, list(t.shape)) for n, t in tensors.items()}, metadata)
    if header is None:
        with atomic_output(path, replace=replace) as tmp:
            safetensors.torch.save_file(tensors, str(tmp), metadata=metadata)
        return
    write_flat(path, header[0], (tensor_bytes(tensors[name]) for name in header[1]), replace=replace)


def write_flat(path: Path, header: bytes, payloads: Iterable[memoryview], *, replace: bool = True) -> None:
    """Write a flat safetensors file from its header (``flat_header``) and its tensors' bytes
    in header order, atomically (as ``atomic_output``, ``replace`` as there) and with direct I/O
    where the folder's filesystem allows it (``AppendFile``). ``payloads`` may be a generator that
    produces each tensor while the earlier ones are being written."""
    with atomic_output(path, replace=replace) as tmp:
        out = AppendFile(path.parent, prefix=tmp.name + ".", suffix="")
        try:
            out.write(header)
            for data in payloads:
                if len(data):
                    out.write(data)
            out.finish()  # fsynced: atomic_output fsyncs again (cheap) before the rename
        except BaseException:
            out.abort()
            raise
        os.replace(out.path, tmp)


def flat_header(specs: dict[str, tuple[torch.dtype, list[int]]],
                metadata: dict[str, str]) -> tuple[bytes, list[str]] | None:
    """The header ``safetensors.torch.save_file`` writes for tensors of these names, dtypes and
    shapes, and the order of their bytes after it; None when it cannot be reproduced (the
    caller then uses save_file). A file is the header, then each tensor's C-order bytes in
    that order.

    The library orders tensors by dtype, then name, never by size, and names dtypes its own
    way: both are read off its header for zero-length stand-ins of the same dtypes (once per
    set of names and dtypes in a process: it costs ~0.15 ms a tensor). The header made here
    for those stand-ins must equal the library's byte for byte (padding aside), so a library
    that formats differently falls back to save_file instead of writing a file it would not
    have written. Tests compare whole files with save_file's output.
    """
    if len(metadata) > 1:  # the library writes several metadata keys in hash order
        return None
    key = tuple(sorted((name, dtype) for name, (dtype, _) in specs.items()))
    layout = _stand_in_layout(key, tuple(metadata.items()))
    if layout is None:
        return None
    names, dtype_names = layout
    sizes = {n: math.prod(shape) * dtype.itemsize for n, (dtype, shape) in specs.items()}
    return _render(names, dtype_names, {n: list(specs[n][1]) for n in names}, sizes, metadata), list(names)


def _render(names: tuple[str, ...], dtype_names: dict[str, str], shapes: dict[str, list[int]],
            sizes: dict[str, int], metadata: dict[str, str]) -> bytes:
    """A safetensors header as the library formats it: compact JSON, metadata first, padded to 8."""
    doc: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name in names:
        doc[name] = {"dtype": dtype_names[name], "shape": shapes[name], "data_offsets": [offset, offset + sizes[name]]}
        offset += sizes[name]
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


@functools.lru_cache(maxsize=16)
def _stand_in_layout(key: tuple[tuple[str, torch.dtype], ...],
                     metadata: tuple[tuple[str, str], ...]) -> tuple[tuple[str, ...], dict[str, str]] | None:
    """The library's tensor order and dtype names for tensors ``key`` (checked, see
    ``flat_header``), or None."""
    meta = dict(metadata)
    reference = safetensors.torch.save({name: torch.empty(0, dtype=dtype) for name, dtype in key}, metadata=meta)
    try:
        (length,) = struct.unpack_from("<Q", reference, 0)
        parsed = json.loads(reference[8 : 8 + length])
        names = tuple(k for k in parsed if k != "__metadata__")
        dtype_names = {n: parsed[n]["dtype"] for n in names}
        if sorted(names) != sorted(n for n, _ in key):
            return None
        if _render(names, dtype_names, {n: [0] for n in names}, dict.fromkeys(names, 0), meta) != reference:
            return None
    except (struct.error, KeyError, TypeError, ValueError):  # a header of another shape than this code knows
        return None
    return names, dtype_names
