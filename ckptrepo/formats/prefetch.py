"""Reading a sequence of checkpoint files one ahead of the caller, for imports.

Importing a folder of checkpoints (``repo.commit(state, blocking=True)`` per file) spends a
large part of its time reading: on this project's reference VM a cold 259 MiB safetensors
file takes ~0.13 s to read with direct I/O, ~2 s over the storage benchmark's 16 files,
while the commit of the previous file leaves the disk's read side idle. ``read_states``
reads file ``i + 1`` on a thread of its own while the caller commits file ``i``, into two
``ReadBuffer`` s used in turn, so the reads cost the import almost no wall time.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ckptrepo.formats.readbuffer import ReadBuffer


def read_states(
    paths: Iterable[Path | str], *, allow_pickle: bool = False
) -> Generator[tuple[Path, dict[str, Any]], None, None]:
    """``(path, state)`` for every path in order, as ``read_state(path)`` gives it, read one ahead.

    Contract: a yielded state may be a view of a reused buffer (safetensors files are read
    whole with direct I/O into one of two buffers taken in turn): it is valid until the
    caller asks for the item after it, so commit it (``blocking=True``, or wait until the
    handle is ``staged``) or copy it before advancing. While the caller holds item ``i``,
    item ``i + 1`` is being read; memory is two buffers of the largest file. Errors
    (``InvalidInput`` naming the file) are raised when the caller reaches that file's item,
    never earlier, so every file before it has been handed over. Closing the generator
    (``break``, an exception, ``close()``) waits for the read in flight and frees the buffers.
    """
    from ckptrepo.formats import read_state  # the package imports this module

    todo = [Path(p) for p in paths]
    buffers = (ReadBuffer(), ReadBuffer())
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-read")

    def load(i: int) -> dict[str, Any]:
        return read_state(todo[i], allow_pickle=allow_pickle, buffer=buffers[i % 2])

    ahead: Future[dict[str, Any]] | None = pool.submit(load, 0) if todo else None
    try:
        for i, path in enumerate(todo):
            assert ahead is not None
            current = ahead
            ahead = None
            state = current.result()  # raises this file's error here, in order
            if i + 1 < len(todo):
                ahead = pool.submit(load, i + 1)  # the other buffer: item i stays intact
            yield path, state
            del state
    finally:
        if ahead is not None:
            ahead.cancel()
        pool.shutdown(wait=True)  # no read may still be filling a buffer we free
        for b in buffers:
            b.close()
