"""Per-tensor statistics computed at ingest (stored with the tensor, queried without reading bytes).

Floating tensors are reduced in their own precision (float32 for narrower floats) with
torch's vectorised kernels: a few passes over memory; std is a second pass over centred
blocks. NaN/Inf are only counted when the sum is not finite, which is the only case
in which any exist.
"""

from __future__ import annotations

import math
from typing import Any

import torch

_BLOCK = 1 << 20
_FLOAT_NATIVE = {torch.float32, torch.float64, torch.float16, torch.bfloat16}


def tensor_stats(t: torch.Tensor) -> dict[str, Any]:
    """Statistics of ``t`` (a contiguous CPU tensor) as a dict of Tensor-row columns."""
    n = t.numel()
    out: dict[str, Any] = {
        "numel": n, "mean": None, "std": None, "min": None, "max": None,
        "l2_norm": None, "abs_max": None, "nan_count": 0, "inf_count": 0,
    }
    if n == 0:
        return out
    if t.dtype.is_complex:
        mag = t.abs()
        out["l2_norm"] = _f(torch.linalg.vector_norm(t))
        out["abs_max"] = _f(mag.max())
        _count_nonfinite(torch.view_as_real(t), out)
        return out
    if t.dtype == torch.bool:
        x = t.to(torch.float32)
    elif t.dtype in _FLOAT_NATIVE:
        x = t
    elif t.dtype.is_floating_point:  # float8 variants: few kernels, widen first
        x = t.to(torch.float32)
    else:
        x = t.to(torch.float64)
    total = _f(x.sum(dtype=torch.float64 if x.dtype == torch.float64 else None))
    if not math.isfinite(total):
        _count_nonfinite(x, out)
        if out["nan_count"] or out["inf_count"]:
            x = x[torch.isfinite(x)]
            n_fin = x.numel()
            if n_fin == 0:
                return out
            total = _f(x.sum(dtype=torch.float64))
    n_fin = x.numel()
    lo, hi = torch.aminmax(x)
    l2 = _f(torch.linalg.vector_norm(x))
    mean = total / n_fin
    out.update(mean=mean, min=_f(lo), max=_f(hi), l2_norm=l2, abs_max=max(abs(_f(lo)), abs(_f(hi))))
    out["std"] = _std(x, mean) if n_fin > 1 else 0.0
    return out


def _std(x: torch.Tensor, mean: float) -> float:
    """Sample std by a second pass over centred blocks (no cancellation, bounded temporaries)."""
    flat = x.reshape(-1)
    if flat.numel() <= _BLOCK:
        flat = flat.to(torch.float64)
    sq = 0.0
    for start in range(0, flat.numel(), _BLOCK):
        block = flat[start : start + _BLOCK]
        sq += _f(torch.linalg.vector_norm(block - mean)) ** 2
    return math.sqrt(sq / (flat.numel() - 1))


def _count_nonfinite(x: torch.Tensor, out: dict[str, Any]) -> None:
    if not x.dtype.is_floating_point:
        return
    out["nan_count"] = int(torch.isnan(x).sum())
    out["inf_count"] = int(torch.isinf(x).sum())


def _f(value: torch.Tensor) -> float:
    return float(value.item())
