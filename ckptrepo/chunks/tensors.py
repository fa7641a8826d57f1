"""Reading tensors back from their chunks: chunk locations -> decoded, verified bytes -> torch tensors.

Every tensor is allocated once at its final size and its chunks are decoded straight
into their slices by worker threads (``ChunkReader`` verifies each chunk's BLAKE3 on
the way). Callers get tensors that share no memory with any cache. What reads a commit
(``restore``) and what compares two (``lineage.exact``) both read through here; both import
it where they read, so that nothing which reads no tensor imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, wait

import torch

from ckptrepo import state as st
from ckptrepo.chunks.store import ChunkReader
from ckptrepo.errors import IntegrityError
from ckptrepo.locations import ChunkLocation
from ckptrepo.rows import TensorRow

# ``(entry name, its tensor row, the locations of the row's chunks, in order)``
Item = tuple[str, TensorRow, list[ChunkLocation]]


def _workers(pool: Executor) -> int:
    return int(getattr(pool, "_max_workers", 2))


def run_jobs(pool: Executor, count: int, run: Callable[[range], None], *, jobs_per_worker: int = 4) -> None:
    """``run`` over ``range(count)`` cut into about ``jobs_per_worker`` runs per worker of ``pool``
    (per-item futures would cost the GIL more than the work they schedule); returns when all are
    done, else raises the first failure once the other jobs are cancelled or finished."""
    per_job = max(1, -(-count // (jobs_per_worker * _workers(pool))))
    jobs = [pool.submit(run, range(i, min(i + per_job, count))) for i in range(0, count, per_job)]
    try:
        for job in jobs:
            job.result()
    finally:
        for job in jobs:
            job.cancel()
        wait(jobs)


def _read_run(reader: ChunkReader, run: list[tuple[str, ChunkLocation, memoryview]], commit_id: str,
              bases: Mapping[str, ChunkLocation], known: Mapping[str, memoryview] | None = None) -> None:
    for name, loc, out in run:
        try:
            if known is None:
                reader.read_into(loc, out, bases)
            else:
                reader.read_into(loc, out, bases, known=known)
        except IntegrityError as exc:
            detail = exc.fields.get("detail", exc.message)
            raise IntegrityError(detail=f"tensor {name!r} of commit {commit_id[:10]}: {detail}") from exc


def read_runs(reader: ChunkReader, pool: Executor, work: Sequence[tuple[str, ChunkLocation, memoryview]], *,
              commit_id: str, jobs_per_worker: int = 4, known: Mapping[str, memoryview] | None = None) -> None:
    """Decode every ``(tensor name, chunk location, output view)`` of ``work`` into its view, on
    ``pool``, verified; return when all are done (IntegrityError naming commit and tensor).
    ``known``: verified bytes of chunks the caller holds, by id, as delta bases (``ChunkReader.read_into``)."""
    if not work:
        return
    bases = reader.bases_for(loc for _, loc, _ in work)  # delta chains' bases, one query per chain level
    run_jobs(pool, len(work), lambda r: _read_run(reader, list(work[r.start : r.stop]), commit_id, bases, known),
             jobs_per_worker=jobs_per_worker)


def read_tensors(reader: ChunkReader, pool: Executor, items: Sequence[Item], *,
                 commit_id: str) -> dict[str, torch.Tensor]:
    """Materialise ``(name, tensor row, ordered chunk locations)`` items as tensors by name.

    Raises IntegrityError naming the commit and tensor when a chunk is missing, fails
    its hash check (a delta chunk's too when its base is damaged), or the chunks do not
    add up to the tensor's size.
    """
    return dict(iter_tensors(reader, pool, items, commit_id=commit_id))


def iter_tensors(reader: ChunkReader, pool: Executor, items: Sequence[Item], *, commit_id: str,
                 jobs_per_worker: int = 4) -> Iterator[tuple[str, torch.Tensor]]:
    """``read_tensors`` as a stream: every decoding job is submitted at once, and each tensor
    is yielded, in ``items`` order, as soon as the jobs holding its chunks are done, so a
    caller can write it while the later ones are still being decoded. Raises as
    ``read_tensors`` does, when the failing tensor's turn comes; jobs still running when the
    iteration stops early are waited for (none of them writes anywhere afterwards).
    """
    buffers: list[torch.Tensor] = []
    work: list[tuple[str, ChunkLocation, memoryview]] = []
    ends: list[int] = []  # one past each item's last chunk in ``work``
    for name, row, chunks in items:
        if sum(c.raw_length for c in chunks) != row.nbytes or len(chunks) != len(row.chunk_ids):
            raise IntegrityError(detail=f"tensor {name!r} of commit {commit_id[:10]} has missing chunks")
        buf = torch.empty(row.nbytes, dtype=torch.uint8)
        buffers.append(buf)
        view = buf.numpy().data if row.nbytes else memoryview(bytearray())
        offset = 0
        for chunk in chunks:
            work.append((name, chunk, view[offset : offset + chunk.raw_length]))
            offset += chunk.raw_length
        ends.append(len(work))
    # A few jobs per worker, each a run of chunks: per-chunk futures would cost the GIL more
    # than the decoding they schedule.
    bases = reader.bases_for(loc for _, loc, _ in work)  # delta chains' bases, one query per chain level
    per_job = max(1, -(-len(work) // (jobs_per_worker * _workers(pool))))
    jobs = [pool.submit(_read_run, reader, work[i : i + per_job], commit_id, bases)
            for i in range(0, len(work), per_job)]
    try:
        done = 0  # jobs finished, in order: they cover work[: done * per_job]
        for (name, row, _), buf, end in zip(items, buffers, ends, strict=True):
            while done * per_job < end:
                jobs[done].result()
                done += 1
            yield name, assemble(buf, row.dtype, list(row.shape), row.boxes)
    finally:
        for job in jobs:
            job.cancel()
        wait(jobs)


def assemble(stream: torch.Tensor, dtype: str, shape: list[int], boxes: list[list[list[int]]] | None) -> torch.Tensor:
    """The tensor whose stored bytes are ``stream`` (uint8): its row-major bytes (``boxes`` None,
    a view, no copy), or ``boxes`` (``TensorRow.boxes``), each box's own row-major bytes in
    order, copied into place. IntegrityError when the boxes do not add up to the stream."""
    if boxes is None:
        return st.tensor_from_bytes(stream, dtype, shape)
    out = torch.empty(shape, dtype=st.dtype_from_name(dtype))
    itemsize = out.element_size()
    pos = 0
    for offsets, sizes in boxes:
        n = math.prod(sizes) * itemsize
        box = st.tensor_from_bytes(stream[pos : pos + n], dtype, sizes)
        st.bit_view(out)[tuple(slice(o, o + z) for o, z in zip(offsets, sizes, strict=True))] = st.bit_view(box)
        pos += n
    if pos != stream.numel():
        raise IntegrityError(detail=f"the boxes of a {dtype} tensor of shape {shape} hold {pos} bytes, "
                                    f"its chunks {stream.numel()}")
    return out
