"""Per-tensor statistics computed at ingest (stored with the tensor, queried without reading bytes).

Statistics are gathered chunk by chunk while each chunk is hot in cache (``moments``),
then merged per tensor (``combine``) with Chan's parallel update, so mean and std are
exact to floating-point rounding however many chunks a tensor has. Floats narrower than
float32 (fp16, bf16, fp8) and integers are widened per chunk; NaN and ±Inf are counted
and left out of the other statistics. Dtypes torch cannot widen (float4, bits*) get none.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ckptrepo.state import SUPPORTED_DTYPES

_NATIVE = {torch.float32, torch.float64}


def _widens(dtype: torch.dtype) -> bool:
    try:
        torch.zeros(4, dtype=dtype).to(torch.complex64 if dtype.is_complex else torch.float64)
        return True
    except (RuntimeError, NotImplementedError):
        return False


# Dtypes torch can convert to a wide type (float4 and the bits* types cannot): only these get statistics.
_MEASURABLE = frozenset(d for d in SUPPORTED_DTYPES.values() if _widens(d))


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


def moments(x: torch.Tensor) -> Moments:
    """Summary of the elements of ``x`` (any supported dtype, CPU, any shape)."""
    x = x.reshape(-1)
    if x.numel() == 0 or x.dtype not in _MEASURABLE:
        return Moments(real=not x.dtype.is_complex)
    if x.dtype.is_complex:
        mag = (x.to(torch.complex64) if x.dtype == torch.complex32 else x).abs()
        nan, inf = 0, 0
        if not math.isfinite(float(mag.sum())):
            nan, inf, mag = _drop_nonfinite(mag)
        sumsq = _square(float(torch.linalg.vector_norm(mag.double()))) if mag.numel() else 0.0
        hi = float(mag.max()) if mag.numel() else -math.inf
        return Moments(n=mag.numel(), sumsq=sumsq, lo=0.0, hi=hi, nan=nan, inf=inf, real=False)
    if x.dtype not in _NATIVE:
        x = x.to(torch.float64 if not x.dtype.is_floating_point or x.dtype == torch.bool else torch.float32)
    total = float(x.sum())
    nan, inf = 0, 0
    if not math.isfinite(total):  # a finite sum means no NaN or Inf: count only otherwise
        nan, inf, x = _drop_nonfinite(x)
        total = float(x.sum())
    n = x.numel()
    if n == 0:
        return Moments(nan=nan, inf=inf)
    mean = total / n
    extremes = torch.aminmax(x)
    sumsq = _square(float(torch.linalg.vector_norm(x)))
    m2 = _square(float(torch.linalg.vector_norm(x - mean)))
    return Moments(n=n, mean=mean, m2=m2, sumsq=sumsq, lo=float(extremes.min), hi=float(extremes.max), nan=nan,
                   inf=inf)


def _square(v: float) -> float:
    return v * v  # inf past the float range, where ``v ** 2`` would raise OverflowError


def _drop_nonfinite(x: torch.Tensor) -> tuple[int, int, torch.Tensor]:
    nan = int(torch.isnan(x).sum())
    inf = int(torch.isinf(x).sum())
    return nan, inf, x[torch.isfinite(x)]


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


def combine(parts: Iterable[Moments], numel: int) -> dict[str, Any]:
    """Tensor-row statistics from the summaries of all of a tensor's chunks."""
    total = Moments()
    for part in parts:
        total = merge(total, part)
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
