"""Ingest statistics: the one-pass C kernel agrees with the numpy reference on every dtype it covers."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hst

from ckptrepo.ingest import stats
from ckptrepo.ingest.stats import Moments, combine, moments

needs_native = pytest.mark.skipif(stats._native is None, reason="the byte-plane extension is not built")


def _reference(x: torch.Tensor) -> Moments:
    """The numpy path (what builds without the extension use)."""
    saved = stats._native
    stats._native = None  # type: ignore[assignment]
    try:
        return moments(x)
    finally:
        stats._native = saved


def _close(a: float, b: float, scale: float) -> bool:
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= 1e-6 * max(1.0, scale)


@needs_native
@settings(max_examples=80, deadline=None)
@given(
    dtype=hst.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
    n=hst.integers(1, 3000),
    loc=hst.sampled_from([0.0, 1.0, -1e3, 1e6]),
    scale=hst.sampled_from([1e-3, 1.0, 1e4]),
    specials=hst.lists(hst.sampled_from([math.nan, math.inf, -math.inf]), max_size=4),
    seed=hst.integers(0, 2**16),
)
def test_native_moments_match_numpy(dtype: torch.dtype, n: int, loc: float, scale: float,
                                    specials: list[float], seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = rng.normal(loc, scale, n)
    for i, v in enumerate(specials):
        values[(i * 7919) % n] = v
    x = torch.from_numpy(values).to(dtype)
    got, ref = moments(x), _reference(x)
    assert (got.n, got.nan, got.inf) == (ref.n, ref.nan, ref.inf)
    if ref.n == 0:
        return
    assert got.lo == ref.lo and got.hi == ref.hi
    magnitude = abs(loc) + scale
    assert _close(got.mean, ref.mean, magnitude)
    assert math.isclose(got.sumsq, ref.sumsq, rel_tol=1e-5, abs_tol=1e-9)
    assert math.isclose(got.m2, ref.m2, rel_tol=1e-3, abs_tol=1e-6 * magnitude**2 * ref.n)


def test_combined_statistics_are_those_of_the_whole_tensor() -> None:
    x = torch.randn(10_000, dtype=torch.float64) * 3 + 2
    parts = [moments(x[i : i + 1000]) for i in range(0, 10_000, 1000)]
    merged = combine(parts, x.numel())
    assert merged["mean"] == pytest.approx(float(x.mean()), rel=1e-12)
    assert merged["std"] == pytest.approx(float(x.std(unbiased=False)), rel=1e-9) or merged["std"] == pytest.approx(
        float(x.std()), rel=1e-9)
    assert merged["min"] == float(x.min()) and merged["max"] == float(x.max())
    assert merged["l2_norm"] == pytest.approx(float(x.norm()), rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32,
                                   torch.bool, torch.uint8])
def test_moments_of_bytes_equal_moments_of_the_tensor(dtype: torch.dtype) -> None:
    """Ingest summarises chunks from their bytes: the same figures as from the tensor."""
    x = (torch.randn(10_001) * 3).to(dtype)
    if dtype.is_floating_point:
        x[7], x[100], x[2000] = math.nan, math.inf, -math.inf
    raw = x.view(torch.uint8).numpy().data if dtype.itemsize > 1 else x.numpy().view(np.uint8).data
    assert stats.moments_of_bytes(raw, dtype) == moments(x)
    assert stats.moments_of_bytes(memoryview(b""), dtype) == Moments()


@needs_native
def test_the_avx2_pass_and_the_portable_pass_agree() -> None:
    """Where the CPU has AVX2 the statistics pass takes it; with ``CKPT_NO_AVX2`` (read once per
    process) the portable pass runs: both agree with each other on every dtype and length."""
    code = (
        "import json, numpy as np\n"
        "from ckptrepo.chunks import _planes\n"
        "rng = np.random.default_rng(5)\n"
        "out = []\n"
        "for kind, size in ((0, 4), (1, 8), (2, 2)):\n"
        "    vals = (rng.normal(3.0, 2.0, 4099)).astype({0: np.float32, 1: np.float64, 2: np.float32}[kind])\n"
        "    if kind == 2:\n"
        "        vals = (vals.view(np.uint32) >> 16).astype(np.uint16)\n"
        "    for n in (1, 15, 16, 17, 64, 4099):\n"
        "        out.append(list(_planes.moments(vals[:n].tobytes(), kind)))\n"
        "print(json.dumps(out))\n"
    )
    runs = []
    for env in ({}, {"CKPT_NO_AVX2": "1"}):
        done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True,
                              text=True, check=True)
        runs.append(json.loads(done.stdout))
    for a, b in zip(*runs, strict=True):
        assert a[0] == b[0] and a[1] == b[1] and a[4:] == b[4:], (a, b)  # counts, shift, min, max exact
        assert math.isclose(a[2], b[2], rel_tol=1e-12, abs_tol=1e-9) and math.isclose(a[3], b[3], rel_tol=1e-12)
