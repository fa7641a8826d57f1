"""Per-tensor statistics computed at ingest (stored with the tensor, queried without reading bytes).

Statistics are gathered chunk by chunk while each chunk is hot in cache (``moments``),
then merged per tensor (``combine``) with Chan's parallel update, so mean and std are
exact to floating-point rounding however many chunks a tensor has. Floats narrower than
float32 (fp16, bf16, fp8) and integers are widened per chunk; NaN and ±Inf are counted
and left out of the other statistics. Dtypes without numeric meaning (float4, bits*) get
none. The arithmetic is numpy's, on the worker thread (see ``_values`` for why not torch),
except for float32, bfloat16 and float64, which one pass of the byte-plane extension
summarises (``_planes.moments``: shifted double accumulators). That pass uses AVX-512 where
the CPU has it, else AVX2 + FMA, else a portable SSE2 or scalar loop (``CKPT_NO_AVX512``
/ ``CKPT_NO_AVX2`` step down).
Measured on one core of this project's Xeon over a 117 MiB state in 4 MiB chunks, bytes in
memory rather than cache: float32 14-17 GB/s with AVX-512, about as fast as that core reads
memory (down to ~10 GB/s on buffers whose memory reads slower), against 6.5-8 GB/s with
AVX2 and ~1.2 GB/s for numpy; bfloat16 ~15 GB/s (AVX2: ~2-3); float64 ~14-15 GB/s (AVX2:
~11-13). From cache, AVX-512 reaches ~35 GB/s for float32.

The staging copy of an asynchronous commit takes these moments in its own pass over memory
(``copy_moments_many``, used by ``ingest.staging.Slot.copy_summarized``), so phase 2 only hashes
those chunks.

Dtypes are given as stored names (``"bfloat16"``) or torch dtypes, with equal results
(``ckptrepo.dtypes``). Only ``moments`` and ``tensor_stats`` take tensors; the byte path never
needs torch, so this module imports without it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ckptrepo import dtypes
from ckptrepo.dtypes import BYTE_FLOAT_TABLES, DType, DTypeLike

if TYPE_CHECKING:
    import torch

try:
    import ckptrepo.chunks._planes as _native
except ImportError:  # pragma: no cover - exercised when the extension is not compiled
    _native = None  # type: ignore[assignment]

_NATIVE_KINDS = {"float32": 0, "float64": 1, "bfloat16": 2}


@dataclass(frozen=True)
class Moments:
    """Mergeable summary of some elements: counts, mean, centred sum of squares, extremes."""

    n: int = 0  # finite elements
    mean: float = 0.0
    m2: float = 0.0  # sum of squared deviations from mean
    sumsq: float = 0.0
    lo: float = math.inf
    hi: float = -math.inf
    nan: int = 0
    inf: int = 0
    real: bool = True  # False for complex tensors: only the L2 norm and abs-max apply


def _values(raw: memoryview | bytes | bytearray, dt: DType) -> np.ndarray[Any, Any] | None:
    """The elements whose bytes (host order) are ``raw`` as a flat float32/float64/complex numpy
    array, or None for dtypes without numeric meaning (float4, bits*). Statistics use numpy
    only: torch kernels on ckptrepo's worker threads would start OpenMP thread teams there, and
    with more OpenMP threads than cores every later parallel region of the training thread pays
    a wake-up (measured: steps 23-31% slower for as long as the repository stays open)."""
    name = dt.name
    if name in ("float32", "float64", "complex64", "complex128"):
        return np.frombuffer(raw, dtype=name)
    if name == "float16":
        return np.frombuffer(raw, dtype=np.float16).astype(np.float32)
    if name == "bfloat16":  # bf16 is the high half of a float32: widen by shifting, exactly
        widened: np.ndarray[Any, Any] = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
        return widened.view(np.float32)
    if name == "complex32":  # two float16 halves, real first
        return np.frombuffer(raw, dtype=np.float16).astype(np.float32).view(np.complex64)
    table = BYTE_FLOAT_TABLES.get(name)
    if table is not None:
        decoded: np.ndarray[Any, Any] = table[np.frombuffer(raw, dtype=np.uint8)]
        return decoded
    if dt.kind in ("int", "uint", "bool"):
        return np.frombuffer(raw, dtype=dt.numpy).astype(np.float64)
    return None


def _native_summary(buffer: Any, kind: int) -> Moments:
    return _summary(_native.moments(buffer, kind))


def _summary(result: tuple[int, float, float, float, float, float, float, int, int]) -> Moments:
    """``Moments`` from the extension's tuple (its shifted sums)."""
    finite, shift, s1, s2, lo, hi, _, nan, inf = result
    if finite == 0:
        return Moments(nan=nan, inf=inf)
    mean = shift + s1 / finite
    m2 = max(0.0, s2 - s1 * s1 / finite)
    sumsq = s2 + 2.0 * shift * s1 + finite * shift * shift
    return Moments(n=finite, mean=mean, m2=m2, sumsq=sumsq, lo=lo, hi=hi, nan=nan, inf=inf)


def summarized(dtype: DTypeLike) -> bool:
    """Whether ``copy_moments_many`` takes ``dtype`` (a stored name or a torch.dtype): float32,
    float64, bfloat16, with the extension built."""
    return _native is not None and dtypes.dtype(dtype).name in _NATIVE_KINDS


def copy_moments_many(pairs: list[tuple[Any, Any, DTypeLike]]) -> list[Moments]:
    """For each ``(src, dst, dtype)`` in order (``dtype`` a stored name or a torch.dtype): copy
    the bytes of ``src`` into ``dst`` (buffers of equal length) and return the moments of those
    elements, equal to ``moments_of_bytes``'s up to rounding, in one pass over memory (the C
    pass, block by block: a block's moments bring it into cache, its copy leaves from there with
    non-temporal stores). Only for the dtypes of ``summarized``. One call releases the GIL once
    for all pairs: a thread copying its share of a commit's chunks does not hand the GIL back
    and forth with the other copying thread at every chunk (on a VM each hand-off may wake a
    halted virtual CPU)."""
    jobs = [(s, d, _NATIVE_KINDS[dtypes.dtype(t).name]) for s, d, t in pairs]
    return [_summary(r) for r in _native.copy_moments_many(jobs)]


def moments_of_bytes(raw: memoryview | bytes | bytearray, dtype: DTypeLike) -> Moments:
    """``moments`` of the elements whose bytes are ``raw`` (a flat buffer holding a whole number
    of ``dtype`` elements in the host's byte order), ``dtype`` a stored name or a torch.dtype,
    either giving the same result. float32/float64/bfloat16 go to the C pass straight from the
    buffer; the others are decoded with numpy (ingest calls this once per chunk, and without
    torch). Empty ``raw``: ``Moments()``."""
    dt = dtypes.dtype(dtype)
    if not len(raw):
        return Moments()
    kind = _NATIVE_KINDS.get(dt.name)
    if kind is not None and _native is not None:
        return _native_summary(raw, kind)
    arr = _values(raw, dt)
    if arr is None:
        return Moments(real=not dt.is_complex)
    return _array_moments(arr)


def moments(x: torch.Tensor) -> Moments:
    """Summary of the elements of ``x`` (any supported dtype, any device, any shape): those of
    its C-order bytes (``moments_of_bytes``)."""
    if not x.numel():
        return Moments(real=not x.dtype.is_complex)
    from ckptrepo.state import tensor_bytes  # the caller has torch: so may this

    return moments_of_bytes(tensor_bytes(x), x.dtype)


def _array_moments(arr: np.ndarray[Any, Any]) -> Moments:
    """Summary of a flat float32/float64/complex array (``_values``)."""
    if np.iscomplexobj(arr):
        nan, inf, mag = _drop_nonfinite(np.abs(arr))
        hi = float(mag.max()) if mag.size else -math.inf
        return Moments(n=mag.size, sumsq=_sumsq(mag), lo=0.0, hi=hi, nan=nan, inf=inf, real=False)
    nan, inf, arr = _drop_nonfinite(arr)
    n = arr.size
    if n == 0:
        return Moments(nan=nan, inf=inf)
    # Finite elements near the float32 limit can overflow a float32 sum: redo those in float64.
    with np.errstate(over="ignore", invalid="ignore"):
        total = float(arr.sum())
        if not math.isfinite(total):
            total = float(arr.sum(dtype=np.float64))
        mean = total / n
        centred = arr - arr.dtype.type(mean) if abs(mean) < np.finfo(arr.dtype).max else arr.astype(np.float64) - mean
        return Moments(n=n, mean=mean, m2=_sumsq(centred), sumsq=_sumsq(arr),
                       lo=float(arr.min()), hi=float(arr.max()), nan=nan, inf=inf)


def _sumsq(a: np.ndarray[Any, Any]) -> float:
    """Sum of squares in the array's precision (ufuncs, which release the GIL), redone in
    float64 past its range."""
    with np.errstate(over="ignore", invalid="ignore"):
        total = float(np.square(a).sum())
        if not math.isfinite(total) and a.dtype != np.float64:
            total = float(np.square(a, dtype=np.float64).sum())
    return total


def _drop_nonfinite(a: np.ndarray[Any, Any]) -> tuple[int, int, np.ndarray[Any, Any]]:
    """(NaN count, ±Inf count, the finite elements); a finite sum means there are none (cheap)."""
    with np.errstate(over="ignore", invalid="ignore"):
        if math.isfinite(float(a.sum())):
            return 0, 0, a
    finite = np.isfinite(a)
    nan = int(np.isnan(a).sum())
    return nan, int(a.size - finite.sum()) - nan, a[finite]


def merge(a: Moments, b: Moments) -> Moments:
    """The summary of both sets of elements (Chan et al.)."""
    if b.n == 0:
        return Moments(a.n, a.mean, a.m2, a.sumsq, a.lo, a.hi, a.nan + b.nan, a.inf + b.inf, a.real and b.real)
    if a.n == 0:
        return Moments(b.n, b.mean, b.m2, b.sumsq, b.lo, b.hi, a.nan + b.nan, a.inf + b.inf, a.real and b.real)
    n = a.n + b.n
    delta = b.mean - a.mean
    return Moments(
        n=n,
        mean=a.mean + delta * b.n / n,
        m2=a.m2 + b.m2 + delta * delta * a.n * b.n / n,
        sumsq=a.sumsq + b.sumsq,
        lo=min(a.lo, b.lo),
        hi=max(a.hi, b.hi),
        nan=a.nan + b.nan,
        inf=a.inf + b.inf,
        real=a.real and b.real,
    )


def merged(parts: Iterable[Moments]) -> Moments:
    """The summary of all the parts' elements together."""
    chunks = parts if isinstance(parts, list) else list(parts)
    if len(chunks) == 1 and chunks[0].n:
        return chunks[0]  # what merging it into an empty summary gives (most tensors are one chunk)
    total = Moments()
    for part in chunks:
        total = merge(total, part)
    return total


def combine(parts: Iterable[Moments], numel: int) -> dict[str, Any]:
    """Tensor-row statistics from the summaries of all of a tensor's chunks."""
    total = merged(parts)
    out: dict[str, Any] = {
        "numel": numel, "mean": None, "std": None, "min": None, "max": None,
        "l2_norm": None, "abs_max": None, "nan_count": total.nan, "inf_count": total.inf,
    }
    if total.n == 0:
        return out
    out["l2_norm"] = math.sqrt(total.sumsq)
    out["abs_max"] = max(abs(total.lo), abs(total.hi))
    if total.real:
        out.update(
            mean=total.mean,
            std=math.sqrt(total.m2 / (total.n - 1)) if total.n > 1 else 0.0,
            min=total.lo,
            max=total.hi,
        )
    return out


def tensor_stats(t: torch.Tensor) -> dict[str, Any]:
    """Statistics of a whole tensor in one piece (reference for the chunked path)."""
    return combine([moments(t)], t.numel())
