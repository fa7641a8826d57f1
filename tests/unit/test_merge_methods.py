"""Weight-space merge methods (``explore.merge``): each equals its published formula, written plainly
here over whole tensors in fp32 (fp64 for slerp's angle), and mergekit's own methods when mergekit
is installed.

What is checked: average, weighted (weights normalised), task arithmetic, TIES (trimming to the top
``density`` magnitudes, sign election by the sum of the weighted trimmed task vectors, a zero sum
electing +, the disjoint weighted mean, lambda) and slerp (angle from normalised copies, the linear
fallback for nearly colinear or opposite vectors, zero vectors); shapes that are not a multiple of
a slice, 0-d and empty tensors, bf16 and fp64; ``reuse`` (the result in the first input's memory)
and inputs left alone otherwise; every parameter error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch

from ckptrepo.errors import UsageError
from ckptrepo.explore import merge as m

# -- the formulas, written plainly ------------------------------------------------------------------


def ref_linear(xs: Sequence[torch.Tensor], w: Sequence[float]) -> torch.Tensor:
    total = sum(wi * x.float() for wi, x in zip(w, xs, strict=True))
    return (total / sum(w)).to(xs[0].dtype)


def ref_task_arithmetic(base: torch.Tensor, xs: Sequence[torch.Tensor], w: Sequence[float], lam: float) -> torch.Tensor:
    b = base.float()
    return (b + lam * sum(wi * (x.float() - b) for wi, x in zip(w, xs, strict=True))).to(base.dtype)


def ref_trim(d: torch.Tensor, density: float) -> torch.Tensor:
    if density >= 1:
        return d
    k = max(1, int(density * d.numel()))
    order = sorted(range(d.numel()), key=lambda i: -abs(float(d.reshape(-1)[i])))
    out = torch.zeros(d.numel())
    for i in order[:k]:
        out[i] = d.reshape(-1)[i]
    return out.reshape(d.shape)


def ref_ties(base: torch.Tensor, xs: Sequence[torch.Tensor], w: Sequence[float], density: float,
             lam: float) -> torch.Tensor:
    b = base.float()
    ds = [wi * ref_trim(x.float() - b, density) for wi, x in zip(w, xs, strict=True)]
    sign = torch.where(sum(ds) >= 0, 1.0, -1.0)
    num = sum(torch.where(torch.sign(d) == sign, d, 0.0) for d in ds)
    den = sum(torch.where(torch.sign(d) == sign, wi, 0.0) for d, wi in zip(ds, w, strict=True))
    den = torch.where(den == 0, 1.0, den)
    return (b + lam * (num / den)).to(base.dtype)


def ref_slerp(a: torch.Tensor, b: torch.Tensor, t: float) -> torch.Tensor:
    x, y = a.double().reshape(-1), b.double().reshape(-1)
    nx, ny = float(x.norm()), float(y.norm())
    nx, ny = (nx if nx > 1e-8 else 1.0), (ny if ny > 1e-8 else 1.0)
    dot = max(-1.0, min(1.0, float(((x / nx) * (y / ny)).sum())))
    if abs(dot) > 0.9995:
        c0, c1 = 1 - t, t
    else:
        theta = math.acos(dot)
        c0, c1 = math.sin((1 - t) * theta) / math.sin(theta), math.sin(t * theta) / math.sin(theta)
    return (c0 * a.float() + c1 * b.float()).to(a.dtype)


def models(shape: tuple[int, ...], n: int = 3, dtype: torch.dtype = torch.float32,
           seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(shape, generator=g)
    return base.to(dtype), [(base + 0.1 * torch.randn(shape, generator=g)).to(dtype) for _ in range(n)]


def close(actual: torch.Tensor, expected: torch.Tensor, rtol: float = 1e-6, atol: float = 1e-6) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=atol)


SHAPES = [(40, 30), (70_001,), (3, 1, 5), (), (0, 4)]


# -- each method against its formula ----------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
def test_average_and_weighted(shape: tuple[int, ...]) -> None:
    _, xs = models(shape)
    close(m.merged(m.spec("average", 3, base=False), xs), ref_linear(xs, [1, 1, 1]), 0, 0)
    close(m.merged(m.spec("weighted", 3, base=False, weights=[0.2, 0.5, 1.3]), xs), ref_linear(xs, [0.2, 0.5, 1.3]))


def test_weights_are_normalised() -> None:
    _, xs = models((50, 20), n=2)
    scaled = m.merged(m.spec("weighted", 2, base=False, weights=[2.0, 6.0]), xs)
    close(scaled, m.merged(m.spec("weighted", 2, base=False, weights=[0.25, 0.75]), xs))
    close(scaled, 0.25 * xs[0] + 0.75 * xs[1])
    with pytest.raises(AssertionError):  # the test can fail: unnormalised weights are another merge
        close(scaled, 2.0 * xs[0] + 6.0 * xs[1])
    negative = m.merged(m.spec("weighted", 2, base=False, weights=[-1.0, 3.0]), xs)
    close(negative, -0.5 * xs[0] + 1.5 * xs[1])


@pytest.mark.parametrize("shape", SHAPES)
def test_task_arithmetic(shape: tuple[int, ...]) -> None:
    base, xs = models(shape)
    s = m.spec("task-arithmetic", 3, base=True, weights=[0.5, 1.0, -0.25], lam=0.7)
    close(m.merged(s, xs, base), ref_task_arithmetic(base, xs, [0.5, 1.0, -0.25], 0.7))
    close(m.merged(m.spec("task-arithmetic", 3, base=True), xs, base), ref_task_arithmetic(base, xs, [1, 1, 1], 1))


@pytest.mark.parametrize("density", [1.0, 0.5, 0.2, 1e-9])
def test_ties(density: float) -> None:
    base, xs = models((20, 15))
    s = m.spec("ties", 3, base=True, weights=[0.3, 1.0, 0.6], density=density, lam=1.5)
    close(m.merged(s, xs, base), ref_ties(base, xs, [0.3, 1.0, 0.6], density, 1.5), 1e-5, 1e-6)


def test_ties_trims_to_the_largest_magnitudes() -> None:
    d = torch.tensor([0.1, -5.0, 0.3, 4.0, -0.2, 0.05, 2.0, -1.0, 0.0, 3.0])
    assert m.trim(d, 0.3).tolist() == [0, -5.0, 0, 4.0, 0, 0, 0, 0, 0, 3.0]
    assert m.trim(d, 1e-6).tolist() == [0, -5.0, 0, 0, 0, 0, 0, 0, 0, 0]  # at least one kept
    assert m.trim(d, 0.19).tolist() == [0, -5.0, 0, 0, 0, 0, 0, 0, 0, 0]  # int(1.9) = 1
    assert m.trim(d, 1.0) is d
    assert m.trim(torch.zeros(0), 0.5).numel() == 0


def test_ties_elects_signs_by_the_sum_and_averages_the_agreeing_entries() -> None:
    base = torch.zeros(5)
    # entry 0: +1 and -3, sum -2 elects -: only -3 agrees, mean -3
    # entry 1: +2 and -2, sum 0 elects +: only +2 agrees
    # entry 2: +1 and +3 agree: weighted mean (1 * 1 + 1 * 3) / 2
    # entry 3: both 0: nothing agrees (0 never agrees): stays the base
    # entry 4: +4 and 0: the zero does not count in the mean
    a = torch.tensor([1.0, 2.0, 1.0, 0.0, 4.0])
    b = torch.tensor([-3.0, -2.0, 3.0, 0.0, 0.0])
    got = m.merged(m.spec("ties", 2, base=True), [a, b], base)
    assert got.tolist() == [-3.0, 2.0, 2.0, 0.0, 4.0]
    # weights count in the election and in the mean: entry 0 with weights 3, 1 -> +3 vs -3 sums to 0: +
    weighted = m.merged(m.spec("ties", 2, base=True, weights=[3.0, 1.0]), [a, b], base)
    assert weighted.tolist() == [3.0 / 3.0, 6.0 / 3.0, (3.0 + 3.0) / 4.0, 0.0, 12.0 / 3.0]
    # lambda scales the merged task vector, added to the base
    shifted = m.merged(m.spec("ties", 2, base=True, lam=0.5), [a + 10, b + 10], base + 10)
    assert shifted.tolist() == [10 - 1.5, 10 + 1.0, 10 + 1.0, 10.0, 10 + 2.0]
    # a negative weight flips its task vector's sign before the election, and the mean divides by the
    # sum of the agreeing entries' weights as they are (mergekit's), 0 replaced by 1: entry 0 is +1, +3
    # with weights 1, -1: 4 / 1; entry 2 is +1, -3: -3 alone, divided by -1
    flipped = m.merged(m.spec("ties", 2, base=True, weights=[1.0, -1.0]), [a, b], base)
    assert flipped.tolist() == [4.0, 4.0, 3.0, 0.0, 4.0]


def test_ties_trims_each_task_vector_before_the_election() -> None:
    base = torch.zeros(4)
    a = torch.tensor([0.1, 9.0, 0.0, 0.0])  # trimmed to its largest entry (density 0.25: k = 1)
    b = torch.tensor([-5.0, 0.0, 0.2, 0.0])
    got = m.merged(m.spec("ties", 2, base=True, density=0.25), [a, b], base)
    assert got.tolist() == [-5.0, 9.0, 0.0, 0.0]


@pytest.mark.parametrize("t", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("shape", [(40, 30), (70_001,), (7,)])
def test_slerp(t: float, shape: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(shape, generator=g), torch.randn(shape, generator=g)  # far apart: a real angle
    close(m.merged(m.spec("slerp", 2, base=False, t=t), [a, b]), ref_slerp(a, b, t), 1e-5, 1e-6)


def test_slerp_is_spherical_between_orthogonal_vectors() -> None:
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    got = m.merged(m.spec("slerp", 2, base=False, t=0.5), [a, b])
    close(got, torch.tensor([math.sqrt(0.5), math.sqrt(0.5)]))  # on the unit circle, not (0.5, 0.5)
    with pytest.raises(AssertionError):
        close(got, torch.tensor([0.5, 0.5]))


@pytest.mark.parametrize("other", ["colinear", "opposite", "nearly", "zero"])
def test_slerp_falls_back_to_linear_interpolation(other: str) -> None:
    g = torch.Generator().manual_seed(2)
    a = torch.randn(1000, generator=g)
    b = {"colinear": 3 * a, "opposite": -2 * a, "nearly": a + 1e-4 * torch.randn(1000, generator=g),
         "zero": torch.zeros(1000)}[other]
    got = m.merged(m.spec("slerp", 2, base=False, t=0.25), [a, b])
    if other == "zero":  # a zero vector's norm counts as 1: cos 0, a quarter turn
        close(got, ref_slerp(a, b, 0.25))
    else:
        close(got, 0.75 * a + 0.25 * b)
    quarter = (math.sin(0.75 * math.pi / 2), math.sin(0.25 * math.pi / 2))
    assert m.slerp_coefficients(a, b, 0.25) == pytest.approx(quarter if other == "zero" else (0.75, 0.25))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_other_dtypes_are_merged_in_fp32_and_cast_back(dtype: torch.dtype) -> None:
    base, xs = models((30, 20), dtype=dtype)
    got = m.merged(m.spec("weighted", 3, base=False, weights=[0.2, 0.3, 0.5]), xs)
    assert got.dtype == dtype
    close(got, ref_linear(xs, [0.2, 0.3, 0.5]), 1e-3 if dtype != torch.float64 else 1e-12, 1e-6)
    got = m.merged(m.spec("task-arithmetic", 3, base=True, lam=0.5), xs, base)
    close(got, ref_task_arithmetic(base, xs, [1, 1, 1], 0.5), 1e-2 if dtype != torch.float64 else 1e-12, 1e-3)
    if dtype == torch.float64:
        assert m.compute_dtype(dtype) == torch.float64


def test_reuse_puts_the_result_in_the_first_input_and_otherwise_leaves_inputs_alone() -> None:
    _, xs = models((64, 33))
    kept = [x.clone() for x in xs]
    s = m.spec("weighted", 3, base=False, weights=[1.0, 2.0, 3.0])
    fresh = m.merged(s, xs)
    for x, k in zip(xs, kept, strict=True):
        assert torch.equal(x, k)
    reused = m.merged(s, xs, reuse=True)
    assert reused.data_ptr() == xs[0].data_ptr()
    assert torch.equal(reused, fresh)
    assert torch.equal(xs[1], kept[1]) and torch.equal(xs[2], kept[2])
    halves = [x.to(torch.bfloat16) for x in kept]
    again = m.merged(s, halves, reuse=True)
    assert again.data_ptr() == halves[0].data_ptr() and again.dtype == torch.bfloat16


def test_against_mergekit() -> None:
    mk = pytest.importorskip("mergekit.merge_methods")
    base, xs = models((48, 40), n=3, seed=3)
    w = [0.3, 1.2, 0.5]
    cases = [
        (m.spec("average", 3, base=False), [*xs], "linear", {"weight": [1.0] * 3}, None),
        (m.spec("weighted", 3, base=False, weights=w), [*xs], "linear", {"weight": w}, None),
        (m.spec("task-arithmetic", 3, base=True, weights=w, lam=0.8), [base, *xs], "task_arithmetic",
         {"weight": w, "lambda": 0.8}, 0),
        (m.spec("ties", 3, base=True, weights=w, density=0.3, lam=1.1), [base, *xs], "ties",
         {"weight": w, "density": 0.3, "lambda": 1.1}, 0),
        (m.spec("slerp", 2, base=False, t=0.35), [xs[0], xs[1]], "slerp", {"t": 0.35}, 0),
    ]
    for s, group, name, params, base_index in cases:
        theirs = mk.merge_tensors(group, name, parameters=params, base_index=base_index)
        mine = m.merged(s, xs[:2] if s.method == "slerp" else xs, base if s.uses_base else None)
        close(mine, theirs, 1e-5, 1e-6)


# -- parameters -------------------------------------------------------------------------------------


def test_spec_defaults_and_json() -> None:
    assert m.spec("average", 2, base=False).to_json() == {"method": "average"}
    assert m.spec("weighted", 2, base=False, weights=[1, 3]).to_json() == {"method": "weighted", "weights": [1.0, 3.0]}
    assert m.spec("task-arithmetic", 1, base=True).to_json() == {"method": "task-arithmetic", "weights": [1.0],
                                                                 "lambda": 1.0}
    assert m.spec("ties", 2, base=True, density=0.2).to_json() == {"method": "ties", "weights": [1.0, 1.0],
                                                                   "density": 0.2, "lambda": 1.0}
    assert m.spec("slerp", 2, base=False, t=0.5).to_json() == {"method": "slerp", "t": 0.5}


@pytest.mark.parametrize(("method", "n", "kwargs", "message"), [
    ("avg", 2, {}, "unknown merge method 'avg'"),
    ("average", 1, {}, "average merges at least 2 commits, not 1"),
    ("slerp", 3, {"t": 0.5}, "slerp merges exactly 2 commits, not 3"),
    ("ties", 2, {}, "ties needs a base"),
    ("task-arithmetic", 0, {"base": True}, "at least 1"),
    ("average", 2, {"base": True}, "average takes no base"),
    ("average", 2, {"weights": [1, 2]}, "average takes no weights"),
    ("weighted", 2, {}, "weighted needs one weight per input"),
    ("weighted", 2, {"weights": [1.0]}, "1 weights given for 2 inputs"),
    ("weighted", 2, {"weights": [1.0, -1.0]}, "the weights sum to 0"),
    ("weighted", 2, {"weights": [1.0, float("nan")]}, "weight nan is not a finite number"),
    ("weighted", 2, {"weights": [1.0, "x"]}, "weight 'x' is not a number"),
    ("weighted", 2, {"weights": [1, 2], "density": 0.5}, "weighted takes no density"),
    ("ties", 2, {"base": True, "density": 0.0}, "density 0.0 is not in (0, 1]"),
    ("ties", 2, {"base": True, "density": 1.5}, "density 1.5 is not in (0, 1]"),
    ("ties", 2, {"base": True, "lam": float("inf")}, "lambda inf is not a finite number"),
    ("task-arithmetic", 2, {"base": True, "t": 0.5}, "task-arithmetic takes no t"),
    ("slerp", 2, {}, "slerp needs t"),
    ("slerp", 2, {"t": 1.5}, "t 1.5 is not in [0, 1]"),
    ("slerp", 2, {"t": 0.5, "lam": 2.0}, "slerp takes no lambda"),
])
def test_bad_parameters_are_refused(method: str, n: int, kwargs: dict[str, object], message: str) -> None:
    base = bool(kwargs.pop("base", False))
    with pytest.raises(UsageError) as err:
        m.spec(method, n, base=base, **kwargs)  # type: ignore[arg-type]
    assert message in err.value.message
    if method == "avg":
        assert "average" in err.value.hint


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n", [2, 3, 5])
def test_the_plain_average_on_bytes_gives_linears_bits(dtype: str, n: int) -> None:
    """``explore.fused`` merges an unweighted average of float32/64 chunks with numpy on their bytes;
    that must be ``merge.linear``'s result bit for bit, special values included."""
    import numpy as np

    from ckptrepo.explore import fused
    from ckptrepo.explore import merge as m

    spec = m.spec("average", n, base=False)
    assert fused._plain_average(spec, dtype) == dtype
    assert fused._plain_average(m.spec("weighted", n, base=False, weights=[0.5] * n), dtype) is None
    assert fused._plain_average(spec, "bfloat16") is None
    g = torch.Generator().manual_seed(n)
    xs = [torch.randn(4096, generator=g, dtype=getattr(torch, dtype)) * 10.0 ** (i - 1) for i in range(n)]
    xs[0][:6] = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0, 1e-40, 3e38], dtype=xs[0].dtype)
    expected = m.linear(xs, [1.0] * n)
    acc = xs[0].numpy().copy()
    for x in xs[1:]:
        np.add(acc, x.numpy(), out=acc)
    np.divide(acc, float(n), out=acc)
    assert acc.tobytes() == expected.numpy().tobytes()
