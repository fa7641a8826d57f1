"""Writing a commit's state to a file (``Repo.export``, ``ckpt checkout REV -o FILE``).

A state that is a flat dict of tensors (what a safetensors file holds, and what ``ckpt commit
FILE.safetensors`` stores) is streamed into a ``.safetensors`` file: the header is known from
the tensor rows before any chunk is read, every decoding job starts at once, and each tensor
is written (direct I/O, on the file's own thread) as soon as its chunks are decoded, so the
disk writes overlap the decoding instead of following it. The file is byte for byte what
``write_state(repo.checkout(rev), path)`` writes; any other state or suffix goes that way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from ckptrepo import state as st
from ckptrepo.chunks.store import ChunkReader
from ckptrepo.chunks.tensors import iter_tensors
from ckptrepo.errors import UsageError
from ckptrepo.formats import SAFETENSORS_SUFFIXES, TORCH_SUFFIXES, check_file_target, write_state
from ckptrepo.formats.hf_layout import flat_keys
from ckptrepo.formats.safetensors_io import flat_header, write_flat
from ckptrepo.locations import ChunkLocation
from ckptrepo.rows import TensorRow

METADATA = {"format": "pt"}  # what write_state puts into a flat safetensors file


def export(
    path: Path,
    skeleton: Any,
    items: dict[str, tuple[TensorRow, list[ChunkLocation]]],
    reader: ChunkReader,
    pool: Executor,
    *,
    commit_id: str,
    checkout: Callable[[], Any],
    replace: bool = True,
) -> None:
    """Write the state of commit ``commit_id`` (its ``skeleton`` and its entries' tensor rows and
    chunk rows in ``items``) to ``path``. ``checkout()`` returns the whole state, for the
    states and suffixes that are not streamed. Atomic: on any error ``path`` is unchanged.
    UsageError, before anything is read, for a suffix that names no format or a folder at
    ``path``; OutputExists, before anything is read and at the end, when something is at ``path``
    and not ``replace`` (``atomic.atomic_output``)."""
    suffix = path.suffix.lower()
    if suffix not in SAFETENSORS_SUFFIXES + TORCH_SUFFIXES:  # refused before anything is read
        raise UsageError(f"cannot write {path}: unknown suffix {suffix or '(none)'!r}",
                         hint=f"Name it {'/'.join(SAFETENSORS_SUFFIXES)}, or {'/'.join(TORCH_SUFFIXES)} "
                              "for torch.save.")
    check_file_target(path, replace=replace)
    keys = flat_keys(skeleton) if suffix in SAFETENSORS_SUFFIXES else None
    header = None
    if keys is not None:
        header = flat_header({k: (st.dtype_from_name(items[e][0].dtype), list(items[e][0].shape))
                              for k, e in keys.items()}, METADATA)
    if keys is None or header is None:
        write_state(checkout(), path, replace=replace)
        return
    order = [(key, *items[keys[key]]) for key in header[1]]

    def payloads() -> Iterator[memoryview]:
        for _, tensor in iter_tensors(reader, pool, order, commit_id=commit_id, jobs_per_worker=16):
            yield st.tensor_bytes(tensor)

    write_flat(path, header[0], payloads(), replace=replace)
