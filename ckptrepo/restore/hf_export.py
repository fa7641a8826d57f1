"""Writing a commit as a Hugging Face model folder (``Repo.export(rev, DIR, format="hf")``,
``ckpt checkout REV -o DIR --format hf``).

The folder holds the commit's files (``entries.is_file_entry``: config.json, tokenizer files,
model card, subfolders) and the model's weights (``formats.hf_layout.model_keys``) as
``hf_layout.plan`` cuts them: ``model.safetensors``, or shards and their index, each file byte
for byte what ``save_pretrained`` writes for those weights. A file of the commit with a weight
file's name is left out (the weights written are the commit's tensors).

Atomic: built in a temporary folder beside ``DIR``, every file fsynced, then renamed
(``atomic.atomic_build``); ``DIR`` must not exist or be empty (``formats.check_folder_target``),
so nothing is ever overwritten and a failure leaves nothing that looks like a model folder.
Streamed: every file's and tensor's decoding jobs start at once (``chunks.tensors.iter_tensors``)
and each is written as soon as it is decoded, so memory holds the decoded tensors not yet
written, not the state; every chunk is verified against its id (IntegrityError, nothing
published, when a stored byte changed).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from ckptrepo import state as st
from ckptrepo.atomic import atomic_build
from ckptrepo.chunks.store import ChunkReader
from ckptrepo.chunks.tensors import iter_tensors
from ckptrepo.entries import check_file_path, file_path, is_file_entry
from ckptrepo.errors import IntegrityError, OutputExists, UsageError
from ckptrepo.formats import check_folder_target, hf_layout
from ckptrepo.ids import short
from ckptrepo.locations import ChunkLocation
from ckptrepo.rows import TensorRow

Items = dict[str, tuple[TensorRow, list[ChunkLocation]]]
NO_CONFIG = ("commit {commit} keeps no config.json: {folder} holds the weights, and from_pretrained will "
             "need a config (from_pretrained(folder, config=...), or one saved into the folder)")


def model_specs(skeleton: Any, items: Items, commit_id: str) -> dict[str, tuple[str, list[int], str]]:
    """``hf_layout.plan``'s specs of the model weights of a commit (``hf_layout.model_keys``);
    UsageError when it holds none a Hugging Face folder can hold."""
    keys = hf_layout.model_keys(skeleton)
    if not keys:
        raise UsageError(
            f"commit {short(commit_id)} holds no model weights for a Hugging Face folder",
            hint="Its state must be a flat dict of tensors (`ckpt commit` of a model folder or safetensors file), "
                 "or hold one under \"model\" (Checkpointer) or \"state_dict\" (Lightning); "
                 "`ckpt checkout REV -o FILE` writes any other state.")
    return {key: (items[entry][0].dtype, list(items[entry][0].shape), entry) for key, entry in keys.items()}


def export_hf(folder: Path, skeleton: Any, items: Items, reader: ChunkReader, pool: Executor, *, commit_id: str,
              max_shard_size: int) -> list[str]:
    """Write the folder (see the module); returns the relative paths written, in writing order.
    ``items``: the commit's entries, its files' among them (``restore.layout.layout_of(files=True)``).
    Warns (UserWarning) when the commit keeps no config.json."""
    folder = Path(folder)
    shards = hf_layout.plan(model_specs(skeleton, items, commit_id), max_shard_size)
    index = hf_layout.index_json(shards)
    files = {file_path(n): n for n in sorted(items) if is_file_entry(n) and not hf_layout.is_weight_file(file_path(n))}
    for path in files:  # checked when committed; a name that is no plain relative path now is damage
        problem = check_file_path(path)
        if problem is not None:
            raise IntegrityError(detail=f"commit {short(commit_id)} names a file {path!r}: {problem}")
    check_folder_target(folder)
    order = [(path, *items[entry]) for path, entry in files.items()]
    order += [(key, *items[entry]) for shard in shards for key, entry in shard.tensors]
    written: list[str] = []
    try:
        with atomic_build(folder) as tmp:
            tmp.mkdir()
            decoded: Iterator[tuple[str, Any]] = iter_tensors(reader, pool, order, commit_id=commit_id,
                                                              jobs_per_worker=16)
            for path in files:
                _, tensor = next(decoded)
                target = tmp.joinpath(*path.split("/"))
                target.parent.mkdir(parents=True, exist_ok=True)
                _write(target, [st.tensor_bytes(tensor)])
                written.append(path)
            for shard in shards:
                payloads = (st.tensor_bytes(next(decoded)[1]) for _ in shard.tensors)
                _write(tmp / shard.name, [memoryview(shard.header)], payloads)
                written.append(shard.name)
            if index is not None:
                _write(tmp / hf_layout.INDEX_NAME, [memoryview(index)])
                written.append(hf_layout.INDEX_NAME)
    except OutputExists:
        check_folder_target(folder)  # the refusal a folder that got content meanwhile gets
        raise
    if "config.json" not in files:
        warnings.warn(NO_CONFIG.format(commit=short(commit_id), folder=folder), UserWarning, stacklevel=3)
    return written


def _write(path: Path, *parts: Any) -> None:
    """Create ``path`` (new: never through a link) and write every memoryview of ``parts`` in
    order; ``atomic_build`` fsyncs it before the folder is published."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "wb") as f:
        for group in parts:
            for data in group:
                if len(data):
                    f.write(data)
