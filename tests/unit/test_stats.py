"""Ingest statistics: the one-pass C kernel agrees with the numpy reference on every dtype it covers."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hst

from ckptrepo.ingest import stats
from ckptrepo.ingest.stats import Moments, combine, moments
from ckptrepo.state import SUPPORTED_DTYPES, dtype_name, tensor_bytes

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


def _decoded_by_torch(x: torch.Tensor) -> np.ndarray[Any, Any] | None:
    """The values of ``x`` (flat) widened by torch's own conversions, as ingest widens them from
    bytes: fp16/bf16/fp8 to float32, complex32 to complex64, integers and bool to float64; None
    for dtypes without numeric meaning (float4, bits*)."""
    name = dtype_name(x.dtype)
    if name in ("float32", "float64", "complex64", "complex128"):
        return x.numpy()
    if name == "complex32":
        return x.to(torch.complex64).numpy()
    if name in ("float16", "bfloat16") or name.startswith("float8"):
        return x.float().numpy()
    if name == "bool" or name.startswith(("int", "uint")):
        return x.to(torch.float64).numpy()
    return None


def _samples(name: str) -> list[torch.Tensor]:
    """Flat tensors of ``name``: every bit pattern at random (NaNs, infinities, subnormals) and,
    where torch converts to it, ordinary values."""
    d = SUPPORTED_DTYPES[name]
    raw = torch.randint(0, 256, (4000 * d.itemsize,), dtype=torch.uint8, generator=torch.Generator().manual_seed(7))
    if d == torch.bool:
        raw %= 2
    out = [raw.view(d)]
    with contextlib.suppress(RuntimeError, TypeError):  # no conversion into float4 or bits*
        out.append((torch.randn(3001, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 40).to(d))
    return out


def _same(a: Moments, b: Moments) -> bool:
    """Equal field by field, a NaN equal to a NaN (the C pass's sums of float64 values near the
    top of the range overflow to inf - inf)."""
    return all(x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))
               for x, y in zip(dataclasses.astuple(a), dataclasses.astuple(b), strict=True))


@contextlib.contextmanager
def _without_native() -> Iterator[None]:
    """Within the block, statistics take the numpy path (what builds without the extension use)."""
    saved = stats._native
    stats._native = None  # type: ignore[assignment]
    try:
        yield
    finally:
        stats._native = saved


@pytest.mark.parametrize("name", list(SUPPORTED_DTYPES))
def test_names_and_torch_dtypes_give_equal_moments(name: str) -> None:
    """Ingest passes stored names where it used to pass torch dtypes: nothing changes."""
    d = SUPPORTED_DTYPES[name]
    assert stats.summarized(name) == stats.summarized(d)
    for x in _samples(name):
        raw = tensor_bytes(x)
        assert _same(stats.moments_of_bytes(raw, name), stats.moments_of_bytes(raw, d))
        with _without_native():
            assert stats.moments_of_bytes(raw, name) == stats.moments_of_bytes(raw, d)
        assert stats.moments_of_bytes(memoryview(b""), name) == stats.moments_of_bytes(memoryview(b""), d) == Moments()


@pytest.mark.parametrize("name", list(SUPPORTED_DTYPES))
def test_moments_of_bytes_equal_those_of_torchs_own_conversion(name: str) -> None:
    """The byte path (numpy only: fp8 tables, bf16 shift, fp16 and complex32 widening, integers
    to float64) sees exactly the values torch's conversions give, so the same statistics."""
    d = SUPPORTED_DTYPES[name]
    for x in _samples(name):
        arr = _decoded_by_torch(x)
        expected = Moments(real=not d.is_complex) if arr is None else stats._array_moments(arr)
        with _without_native():
            assert stats.moments_of_bytes(tensor_bytes(x), name) == expected
            assert moments(x) == expected
        if arr is None:
            assert not stats.summarized(name) and moments(x) == expected
        assert _same(moments(x), stats.moments_of_bytes(tensor_bytes(x), name))  # with the extension, if built


def test_moments_of_a_non_contiguous_tensor_are_those_of_its_values() -> None:
    x = torch.randn(40, 30, dtype=torch.float64)
    assert moments(x.t()) == moments(x.t().contiguous())
    assert moments(x[:, ::3]) == moments(x[:, ::3].contiguous())
    c = torch.randn(8, 4, dtype=torch.complex64)
    assert moments(c.conj()) == moments(c.conj().resolve_conj())


@needs_native
def test_copy_moments_many_takes_names_or_torch_dtypes() -> None:
    xs = [torch.randn(1000).to(d) for d in (torch.float32, torch.float64, torch.bfloat16)]
    srcs = [tensor_bytes(x) for x in xs]
    by_name, by_dtype = [bytearray(len(s)) for s in srcs], [bytearray(len(s)) for s in srcs]
    names = [dtype_name(x.dtype) for x in xs]
    a = stats.copy_moments_many([(s, memoryview(o), n) for s, o, n in zip(srcs, by_name, names, strict=True)])
    b = stats.copy_moments_many([(s, memoryview(o), x.dtype) for s, o, x in zip(srcs, by_dtype, xs, strict=True)])
    assert a == b == [stats.moments_of_bytes(s, x.dtype) for s, x in zip(srcs, xs, strict=True)]
    assert by_name == by_dtype == [bytearray(s) for s in srcs]


_KERNEL_CODE = """
import json, sys
import numpy as np
from ckptrepo.chunks import _planes
cases = np.load(sys.argv[1])
out, copies, copied = [], [], []
for i in range(int(cases["count"])):
    src, kind = cases[f"a{i}"].tobytes(), int(cases[f"k{i}"])
    out.append(_planes.moments(src, kind))
    room = bytearray(len(src) + 64)
    at = (-np.frombuffer(room, np.uint8).ctypes.data % 16) + i % 2  # 16-byte aligned, or not
    dst = memoryview(room)[at : at + len(src)]
    copies.append(_planes.copy_moments(src, dst, kind))
    copied.append(dst.tobytes() == src and not any(room[:at]) and not any(room[at + len(src):]))
print(json.dumps({"kernel": _planes.moments_kernel(), "results": out, "copies": copies, "copied": copied}))
"""

# Environments for each pass: the best the CPU has, AVX2 + FMA at most, the portable pass.
_PATHS: tuple[dict[str, str], ...] = ({}, {"CKPT_NO_AVX512": "1"}, {"CKPT_NO_AVX2": "1"})


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _kernel_cases() -> list[tuple[int, np.ndarray[Any, Any]]]:
    """(kind, elements) covering every loop of every pass: lengths around the vector widths
    (the AVX-512 loops take 32, 16 or 8 elements, AVX2 16, SSE2 4 or 8) and long enough to
    reach the prefetching main loop; offsets far from zero, negative values, wide magnitudes,
    values near the top of each range, signed zeros; NaN and ±Inf at the first element (no
    shift), inside the vector part and in the scalar tail; a float64 sum of squares that
    overflows."""
    rng = np.random.default_rng(2024)
    lengths = (1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 95, 127, 1000, 4099, 70001)
    f32max, f64max = float(np.finfo(np.float32).max), float(np.finfo(np.float64).max)
    raw: list[tuple[str, np.ndarray[Any, Any]]] = []
    for n in lengths:
        raw.append(("normal", rng.normal(0.0, 1.0, n)))
        raw.append(("offset", rng.normal(1e6, 1.0, n)))
        raw.append(("negative", -np.abs(rng.normal(1e3, 10.0, n))))
    for n in (33, 1000, 70001):
        signs = rng.choice([-1.0, 1.0], n)
        raw.append(("wide", signs * 10.0 ** rng.uniform(-30, 30, n)))
        raw.append(("near-f32-max", signs * rng.uniform(0.5, 1.0, n) * f32max))
        zeros = rng.normal(0.0, 1.0, n)
        zeros[rng.integers(0, n, n // 3)] = -0.0
        zeros[rng.integers(0, n, n // 3)] = 0.0
        raw.append(("zeros", zeros))
        raw.append(("constant", np.full(n, -2.5)))
    cases: list[tuple[int, np.ndarray[Any, Any]]] = []
    for label, values in raw:
        for kind in (0, 1, 2):
            if label == "near-f32-max" and kind == 2:
                continue  # rounds to bf16 infinity; the special cases below cover that
            cases.append((kind, _encode(values, kind)))
    for kind in (0, 1, 2):
        for n in (1, 5, 40, 77, 1000, 70001):
            for specials in ([math.nan], [math.inf], [-math.inf], [math.inf, -math.inf], [math.nan, math.inf]):
                for where in ("first", "body", "tail"):
                    values = rng.normal(5.0, 3.0, n)
                    for j, v in enumerate(specials):
                        pos = {"first": 0, "body": n // 3, "tail": n - 1}[where]
                        values[min(n - 1, pos + j)] = v
                    cases.append((kind, _encode(values, kind)))
            cases.append((kind, _encode(np.full(n, math.nan), kind)))
    big = rng.uniform(0.5, 1.0, 4099) * np.sqrt(f64max)  # finite elements, sum of squares past float64
    cases.append((1, big))
    cases.append((1, -big))
    return cases


def _encode(values: np.ndarray[Any, Any], kind: int) -> np.ndarray[Any, Any]:
    if kind == 1:
        return values.astype(np.float64)
    f = values.astype(np.float32)
    if kind == 0:
        return f
    return torch.from_numpy(f).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def _decode(arr: np.ndarray[Any, Any], kind: int) -> np.ndarray[Any, Any]:
    if kind == 2:
        return (arr.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return arr.astype(np.float64)


def _fsum(values: np.ndarray[Any, Any]) -> float:
    try:
        return math.fsum(values.tolist())
    except OverflowError:
        return math.inf


def _check_against_reference(kind: int, arr: np.ndarray[Any, Any], got: list[float]) -> None:
    """``got`` (a ``_planes.moments`` tuple) against the correctly rounded float64 figures."""
    x = _decode(arr, kind)
    finite = x[np.isfinite(x)]
    shift = float(x[0]) if math.isfinite(x[0]) else 0.0
    count, g_shift, s1, s2, lo, hi, _, nan, inf = got
    assert (count, nan, inf) == (finite.size, int(np.isnan(x).sum()), int(np.isinf(x).sum()))
    assert g_shift == shift
    if finite.size == 0:
        assert (s1, s2) == (0.0, 0.0) and lo == math.inf and hi == -math.inf
        return
    assert lo == float(finite.min()) and hi == float(finite.max())
    a = finite - shift
    ref1, abs1 = _fsum(a), _fsum(np.abs(a))
    with np.errstate(over="ignore"):
        ref2 = _fsum(a * a)
    # Double accumulation in any order is within a few n * 2**-53 of the sum of magnitudes
    # (float32 accumulation would miss by ~1e-7).
    assert abs(s1 - ref1) <= 1e-11 * abs1 + 1e-300, (s1, ref1)
    if math.isinf(ref2):
        assert s2 == math.inf
    else:
        assert abs(s2 - ref2) <= 1e-11 * ref2 + 1e-300, (s2, ref2)


@needs_native
def test_every_pass_matches_a_float64_reference(tmp_path: Path) -> None:
    """Where the CPU has AVX-512 (F, DQ, BW, VL) the statistics pass takes it, else AVX2 + FMA,
    else the portable pass; ``CKPT_NO_AVX512`` and ``CKPT_NO_AVX2`` (which turns both off),
    read once per process, select the others. Each pass, in its own process, agrees with
    exactly rounded float64 sums of the same elements, and the passes agree with one another:
    counts, shift, min and max exactly, sums to rounding. So does each pass's ``copy_moments``
    (block by block, into aligned and unaligned destinations), which copies every byte."""
    cases = _kernel_cases()
    path = tmp_path / "cases.npz"
    payload: dict[str, Any] = {"count": len(cases)}
    for i, (kind, arr) in enumerate(cases):
        payload[f"a{i}"], payload[f"k{i}"] = arr, kind
    np.savez(path, **payload)
    base_env = {k: v for k, v in os.environ.items() if k not in ("CKPT_NO_AVX512", "CKPT_NO_AVX2")}
    flags = _cpu_flags()
    has_avx2 = {"avx2", "fma"} <= flags
    has_avx512 = has_avx2 and {"avx512f", "avx512dq", "avx512bw", "avx512vl"} <= flags
    runs = {}
    for env in _PATHS:
        done = subprocess.run([sys.executable, "-c", _KERNEL_CODE, str(path)], env={**base_env, **env},
                              capture_output=True, text=True, check=True)
        runs[tuple(env)] = json.loads(done.stdout)
    kernels = [runs[tuple(env)]["kernel"] for env in _PATHS]
    assert kernels[2] == "portable" and kernels[1] != "avx512"
    if flags and sys.platform == "linux" and platform.machine() == "x86_64":
        assert kernels[0] == ("avx512" if has_avx512 else "avx2" if has_avx2 else "portable")
        assert kernels[1] == ("avx2" if has_avx2 else "portable")
    for run in runs.values():
        for (kind, arr), got in zip(cases, run["results"], strict=True):
            _check_against_reference(kind, arr, got)
        # The staging copy's pass (copy_moments): the same figures, every byte copied and no other.
        assert all(run["copied"])
        for (kind, arr), got in zip(cases, run["copies"], strict=True):
            _check_against_reference(kind, arr, got)
    first, *others = runs.values()
    for other in others:
        for a, b in zip(first["results"], other["results"], strict=True):
            assert a[0] == b[0] and a[1] == b[1] and a[4:] == b[4:], (a, b)
            assert math.isclose(a[2], b[2], rel_tol=1e-12, abs_tol=1e-9) and math.isclose(a[3], b[3], rel_tol=1e-12)
