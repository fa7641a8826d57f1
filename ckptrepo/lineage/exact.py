"""Exact comparison of two tensors a -> b from the chunks that differ (``diff(exact=True)``).

For two tensors of one dtype, shape and chunk size, chunk ``seq`` of both covers the same
elements; where the chunk ids are equal the difference is zero. So only differing chunk
pairs are read (through the verifying ``ChunkReader``), each pair reduced in float64
(complex128 for complex dtypes) to five sums; identical chunks' share of the norms comes
from the stored L2 norms (see ``exact_delta``). Tensors of different chunk sizes are read
whole. Reads run on the caller's executor, one job per chunk pair; sums are added in
position order, so results do not depend on scheduling.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckptrepo.locations import ChunkLocation
from ckptrepo.rows import TensorRow
from ckptrepo.types import ExactDelta

if TYPE_CHECKING:  # torch is imported by the functions that read chunks: a diff --stat never does
    import torch

    from ckptrepo.chunks.store import ChunkReader

ChunkPair = tuple[ChunkLocation, ChunkLocation]
Sums = tuple[float, float, float, float, float]


@dataclass(frozen=True)
class ExactRequest:
    """One changed tensor to compare exactly.

    ``pairs``: the differing chunk pairs in position order (equal chunk sizes); ``shared``:
    whether some positions hold identical chunks; ``l2_a``/``l2_b``: the stored L2 norms.
    ``whole``: instead of pairs, both tensors' rows and ordered chunk rows, read in full.
    """

    name: str
    dtype: str
    l2_a: float
    l2_b: float
    pairs: Sequence[ChunkPair] = ()
    shared: bool = False
    whole: tuple[tuple[TensorRow, list[ChunkLocation]], tuple[TensorRow, list[ChunkLocation]]] | None = None


def _widen(x: torch.Tensor) -> torch.Tensor:
    import torch

    if x.dtype.is_complex:
        return (x.to(torch.complex64) if x.dtype == torch.complex32 else x).to(torch.complex128).reshape(-1)
    return x.to(torch.float64).reshape(-1)


def sums(xa: torch.Tensor, xb: torch.Tensor) -> Sums:
    """(Σ|b−a|², max|b−a|, Σ|a|², Σ|b|², Σ Re(conj(a)·b)) over two tensors of equal size."""
    import torch

    xa, xb = _widen(xa), _widen(xb)
    if xa.numel() == 0:
        return 0.0, 0.0, 0.0, 0.0, 0.0
    d = xb - xa
    if d.is_complex():
        ad = d.abs()
        na, nb = float(torch.linalg.vector_norm(xa)), float(torch.linalg.vector_norm(xb))
        return float(torch.dot(ad, ad)), float(ad.max()), na * na, nb * nb, float(torch.vdot(xa, xb).real)
    dot = torch.dot
    return float(dot(d, d)), float(d.abs().max()), float(dot(xa, xa)), float(dot(xb, xb)), float(dot(xa, xb))


def _read_chunk(reader: ChunkReader, loc: ChunkLocation, dtype: str) -> torch.Tensor:
    import torch

    from ckptrepo import state as st

    buf = torch.empty(loc.raw_length, dtype=torch.uint8)
    if loc.raw_length:
        reader.read_into(loc, buf.numpy().data)
    return st.tensor_from_bytes(buf, dtype, [loc.raw_length // st.dtype_from_name(dtype).itemsize])


def _pair_job(reader: ChunkReader, dtype: str, pair: ChunkPair) -> Sums:
    return sums(_read_chunk(reader, pair[0], dtype), _read_chunk(reader, pair[1], dtype))


def exact_delta(parts: Sequence[Sums], *, l2_a: float, l2_b: float, shared: bool, reads: int = 0,
                nbytes: int = 0) -> ExactDelta:
    """Exact figures from sums over the differing chunks.

    Identical chunks add the same S = Σ|a|² = Σ|b|² = Σ Re(conj(a)·b) to ‖a‖², ‖b‖² and ⟨a,b⟩,
    and nothing to ‖b−a‖. S is recovered from the stored norms (‖a‖² − Σ_differing |a|², the
    mean of both sides' estimates); it is 0 when nothing is ``shared``. In the cosine an error
    in S scales numerator and denominator alike, so it stays accurate for nearly equal tensors.
    """
    d2, sum_a, sum_b, dot = (math.fsum(p[i] for p in parts) for i in (0, 2, 3, 4))
    max_abs = max((p[1] for p in parts), default=0.0)
    s_shared = max(0.0, ((l2_a * l2_a - sum_a) + (l2_b * l2_b - sum_b)) / 2) if shared else 0.0
    norm_a, norm_b = math.sqrt(s_shared + sum_a), math.sqrt(s_shared + sum_b)
    cosine = max(-1.0, min(1.0, (s_shared + dot) / (norm_a * norm_b))) if norm_a > 0 and norm_b > 0 else None
    l2 = math.sqrt(d2)
    return ExactDelta(l2, l2 / norm_a if norm_a > 0 else None, cosine, max_abs, reads, nbytes)


def compare(reader: ChunkReader, pool: Executor, requests: Sequence[ExactRequest]) -> dict[str, ExactDelta]:
    """An ``ExactDelta`` per request name. Chunk pairs of every request are submitted to ``pool``
    first, then collected; IntegrityError (from the reader) when a chunk fails its hash check."""
    from ckptrepo.chunks.tensors import read_tensors

    jobs: dict[str, list[Future[Sums]]] = {
        r.name: [pool.submit(_pair_job, reader, r.dtype, p) for p in r.pairs] for r in requests if r.whole is None
    }
    out: dict[str, ExactDelta] = {}
    for r in requests:
        if r.whole is None:
            nbytes = sum(a.raw_length + b.raw_length for a, b in r.pairs)
            out[r.name] = exact_delta([j.result() for j in jobs[r.name]], l2_a=r.l2_a, l2_b=r.l2_b, shared=r.shared,
                                      reads=2 * len(r.pairs), nbytes=nbytes)
            continue
        (ta, ca), (tb, cb) = r.whole
        xa = read_tensors(reader, pool, [(r.name, ta, ca)], commit_id=ta.tensor_id)[r.name]
        xb = read_tensors(reader, pool, [(r.name, tb, cb)], commit_id=tb.tensor_id)[r.name]
        out[r.name] = exact_delta([sums(xa, xb)], l2_a=r.l2_a, l2_b=r.l2_b, shared=False,
                                  reads=len(ca) + len(cb), nbytes=ta.nbytes + tb.nbytes)
    return out
