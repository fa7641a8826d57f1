"""Reading a commit's state back: its skeleton with the tensors it names, read from their chunks
(``chunks.tensors``)."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Executor
from typing import Any

from ckptrepo import state as st
from ckptrepo.chunks.store import ChunkReader
from ckptrepo.chunks.tensors import read_tensors
from ckptrepo.locations import ChunkLocation
from ckptrepo.rows import TensorRow


def read_state(reader: ChunkReader, pool: Executor, cid: str, skeleton: Any,
               items: Mapping[str, tuple[TensorRow, list[ChunkLocation]]], *, part: str | None = None,
               allow_pickle: bool = False) -> Any:
    """The state of commit ``cid`` (``restore.layout.layout_of``'s triple), or with ``part`` (an
    entry-name prefix: ``"model"``, ``"ranks/1"``) only the value at that key path, reading only
    the tensors it holds."""
    if part is not None:
        skeleton = st.skeleton_part(skeleton, st.split_path(part))
        wanted = st.skeleton_entries(skeleton)
        items = {n: i for n, i in items.items() if n in wanted}
    tensors = read_tensors(reader, pool, [(n, *i) for n, i in items.items()], commit_id=cid)
    return st.unflatten(skeleton, tensors, allow_pickle=allow_pickle)
