"""Weight-space merge methods: the arithmetic on one tensor, nothing else (no repository, no I/O).

The formulas are mergekit's (arcee-ai/mergekit, ``merge_methods``), so a merge here and one there
agree to the last bits of fp32 rounding:

- ``average`` / ``weighted`` (mergekit ``linear``, ``normalize: true``): ``sum_i w_i x_i / sum_i w_i``;
  ``average`` has every ``w_i = 1``.
- ``task-arithmetic``: ``base + lambda * sum_i w_i (x_i - base)`` (weights not normalised).
- ``ties``: each task vector ``x_i - base`` trimmed to its ``k = max(1, int(density * numel))``
  entries of largest magnitude (``density >= 1``: none trimmed), weighted by ``w_i``; the sign
  of each entry elected as the sign of the sum of the weighted trimmed vectors (a zero sum elects
  +); the entries agreeing with it (a zero never agrees) averaged with their weights
  (``sum_i w_i d_i [agree] / sum_i w_i [agree]``, 0 where none agrees), times ``lambda``, added
  to ``base``.
- ``slerp`` between exactly two tensors (``t = 0``: the first, ``t = 1``: the second), over the
  whole tensor as one vector: the angle from normalised copies (a norm at most ``eps`` counts as 1),
  falling back to linear interpolation when ``|cos| > 0.9995`` (nearly colinear or opposite).

Everything is computed in fp32 (fp64 for fp64 tensors; slerp's angle in fp64) and cast back to
the tensors' dtype by the caller (``merged``). Only floating tensors are merged: integer and bool
tensors must be equal in every input and are copied (``explore.merging``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ckptrepo.errors import UsageError, did_you_mean

if TYPE_CHECKING:
    import torch

METHODS = ("average", "weighted", "task-arithmetic", "ties", "slerp")
DOT_THRESHOLD = 0.9995  # slerp: |cos| above this interpolates linearly (mergekit's)
EPS = 1e-8  # slerp: a norm at most this is taken as 1 (mergekit's)
_WITH_BASE = ("task-arithmetic", "ties")


@dataclass(frozen=True)
class MergeSpec:
    """A merge method with its parameters resolved (``spec``): one weight per input (``average``:
    all 1; ``slerp``: none), ``density`` (``ties``), ``lam`` (``task-arithmetic``, ``ties``) and
    ``t`` (``slerp``); the others None."""

    method: str
    weights: tuple[float, ...] | None = None
    density: float | None = None
    lam: float | None = None
    t: float | None = None

    @property
    def uses_base(self) -> bool:
        """Whether the method needs a base (``task-arithmetic``, ``ties``)."""
        return self.method in _WITH_BASE

    def to_json(self) -> dict[str, Any]:
        """The method and the parameters that apply to it (what a merge commit's config records)."""
        out: dict[str, Any] = {"method": self.method}
        if self.weights is not None and self.method != "average":
            out["weights"] = list(self.weights)
        for key, value in (("density", self.density), ("lambda", self.lam), ("t", self.t)):
            if value is not None:
                out[key] = value
        return out


def spec(method: str, inputs: int, *, base: bool, weights: Sequence[float] | None = None,
         density: float | None = None, lam: float | None = None, t: float | None = None) -> MergeSpec:
    """``method`` with its parameters checked for ``inputs`` inputs (``base``: whether a base was
    given), defaults filled in as mergekit's (weights 1, density 1, lambda 1). UsageError naming
    the parameter for anything that does not apply or is out of range."""
    if method not in METHODS:
        raise UsageError(f"unknown merge method {method!r}", hint=did_you_mean(
            "method", method, METHODS, f"one of {', '.join(METHODS)}"))
    least = 1 if method in _WITH_BASE else 2
    if inputs < least or (method == "slerp" and inputs != 2):
        wanted = "exactly 2" if method == "slerp" else f"at least {least}"
        raise UsageError(f"{method} merges {wanted} commits, not {inputs}")
    if method in _WITH_BASE and not base:
        raise UsageError(f"{method} needs a base: the commit the inputs were fine-tuned from",
                         hint="Give it with --base REV (base=...).")
    if method not in _WITH_BASE and base:
        raise UsageError(f"{method} takes no base", hint="Leave out --base, or use task-arithmetic or ties.")
    given = {"weights": weights, "density": density, "lambda": lam, "t": t}
    allowed = {"average": (), "weighted": ("weights",), "task-arithmetic": ("weights", "lambda"),
               "ties": ("weights", "density", "lambda"), "slerp": ("t",)}[method]
    for name, value in given.items():
        if value is not None and name not in allowed:
            raise UsageError(f"{method} takes no {name}", hint=(
                f"{method} takes {', '.join(allowed)}." if allowed else f"{method} takes no parameters."))
    w: tuple[float, ...] | None = None
    if method == "average":
        w = (1.0,) * inputs
    elif method == "weighted" and weights is None:
        raise UsageError("weighted needs one weight per input", hint="Give them with --weights W... (weights=[...]).")
    elif method != "slerp":
        w = tuple(_finite("weight", x) for x in weights) if weights is not None else (1.0,) * inputs
        if len(w) != inputs:
            raise UsageError(f"{len(w)} weights given for {inputs} inputs", hint="Give one weight per input, in order.")
        if method == "weighted" and sum(w) == 0:
            raise UsageError("the weights sum to 0: a weighted average divides by their sum")
    if method == "ties":
        density = 1.0 if density is None else _finite("density", density)
        if not 0 < density <= 1:
            raise UsageError(f"density {density} is not in (0, 1]: the share of each task vector's entries kept")
    if method in _WITH_BASE:
        lam = 1.0 if lam is None else _finite("lambda", lam)
    if method == "slerp":
        if t is None:
            raise UsageError("slerp needs t, the point between the two inputs (0: the first, 1: the second)",
                             hint="Give it with --t T (t=...).")
        t = _finite("t", t)
        if not 0 <= t <= 1:
            raise UsageError(f"t {t} is not in [0, 1]")
    return MergeSpec(method, w, density if method == "ties" else None, lam, t)


def _finite(what: str, value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{what} {value!r} is not a number") from exc
    if not math.isfinite(out):
        raise UsageError(f"{what} {value!r} is not a finite number")
    return out


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """What a tensor of ``dtype`` is merged in: fp64 for fp64, else fp32."""
    import torch

    return torch.float64 if dtype == torch.float64 else torch.float32


# Elements per slice of the elementwise methods: at most ATen's grain size, so every op runs on the
# calling thread (no OpenMP team competing with the threads that read and hash chunks, which cost
# several times the arithmetic on two cores), and a slice of each operand stays in cache.
SLICE = 1 << 15


def merged(s: MergeSpec, inputs: Sequence[torch.Tensor], base: torch.Tensor | None = None, *,
           reuse: bool = False) -> torch.Tensor:
    """The merge of one floating tensor of every input (and of the base, for the methods that use
    one), of the inputs' dtype and shape. The inputs share dtype and shape (``explore.merging``
    checks). ``reuse``: the inputs (not the base) were read for this merge alone, and the first
    one's memory may hold the result (no tensor more); else no input is modified."""
    import torch

    first = inputs[0]
    if s.method == "ties":
        assert s.weights is not None and s.lam is not None and s.density is not None and base is not None
        return ties(base, inputs, s.weights, s.density, s.lam).to(first.dtype)
    out = first if reuse and first.is_contiguous() else torch.empty_like(first, memory_format=torch.contiguous_format)
    if s.method in ("average", "weighted"):
        assert s.weights is not None
        linear(inputs, s.weights, out=out)
    elif s.method == "task-arithmetic":
        assert s.weights is not None and s.lam is not None and base is not None
        task_arithmetic(base, inputs, s.weights, s.lam, out=out)
    else:
        assert s.t is not None
        c0, c1 = slerp_coefficients(inputs[0], inputs[1], s.t)
        linear(inputs, (c0, c1), normalize=False, out=out)
    return out


def _slices(out: torch.Tensor, *tensors: torch.Tensor) -> Iterator[tuple[torch.Tensor, list[torch.Tensor]]]:
    """``(out slice, [the same slice of each tensor])`` over the flattened tensors, ``SLICE`` elements at a time."""
    flat_out = out.view(-1)
    flats = [t.reshape(-1) for t in tensors]
    for i in range(0, flat_out.numel(), SLICE):
        yield flat_out[i : i + SLICE], [f[i : i + SLICE] for f in flats]


def linear(inputs: Sequence[torch.Tensor], weights: Sequence[float], *, normalize: bool = True,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """``sum_i w_i x_i`` (divided by ``sum_i w_i`` when ``normalize``), computed in the compute dtype
    a slice at a time and written to ``out`` (default: a new tensor of the inputs' dtype), which may
    be ``inputs[0]`` itself."""
    import torch

    ct = compute_dtype(inputs[0].dtype)
    out = torch.empty_like(inputs[0], memory_format=torch.contiguous_format) if out is None else out
    divisor = math.fsum(weights) if normalize else None
    # In place when the result goes over the first input, already of the compute dtype.
    direct = out.dtype == ct and out.data_ptr() == inputs[0].data_ptr() and inputs[0].is_contiguous()
    acc = None if direct else torch.empty(min(SLICE, out.numel()), dtype=ct)
    for dst, xs in _slices(out, *inputs):
        tmp = dst if acc is None else acc[: dst.numel()].copy_(xs[0])
        if weights[0] != 1:
            tmp.mul_(weights[0])
        for x, w in zip(xs[1:], weights[1:], strict=True):
            tmp.add_(x, alpha=w)
        if divisor is not None:
            tmp.div_(divisor)
        if acc is not None:
            dst.copy_(tmp)
    return out


def task_arithmetic(base: torch.Tensor, inputs: Sequence[torch.Tensor], weights: Sequence[float], lam: float, *,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """``base + lam * sum_i w_i (x_i - base)``, computed in the compute dtype a slice at a time and
    written to ``out`` (as ``linear``)."""
    import torch

    ct = compute_dtype(base.dtype)
    out = torch.empty_like(base, memory_format=torch.contiguous_format) if out is None else out
    n = min(SLICE, out.numel())
    acc, delta = torch.empty(n, dtype=ct), torch.empty(n, dtype=ct)
    for dst, (b, *xs) in _slices(out, base, *inputs):
        tmp, d = acc[: dst.numel()], delta[: dst.numel()]
        tmp.zero_()
        for x, w in zip(xs, weights, strict=True):
            tmp.add_(d.copy_(x).sub_(b), alpha=w)
        if lam != 1:
            tmp.mul_(lam)
        dst.copy_(tmp.add_(b))
    return out


def trim(delta: torch.Tensor, density: float) -> torch.Tensor:
    """``delta`` with all but its ``max(1, int(density * numel))`` entries of largest magnitude set
    to 0 (a new tensor; ``density >= 1``: ``delta`` itself). Among equal magnitudes at the cut,
    which are kept is unspecified (as with mergekit's sort)."""
    import torch

    if density >= 1 or delta.numel() == 0:
        return delta
    k = max(1, int(density * delta.numel()))
    flat = delta.reshape(-1)
    keep = torch.topk(flat.abs(), k, sorted=False).indices
    out = torch.zeros_like(flat)
    out[keep] = flat[keep]
    return out.reshape(delta.shape)


def ties(base: torch.Tensor, inputs: Sequence[torch.Tensor], weights: Sequence[float], density: float,
         lam: float) -> torch.Tensor:
    """TIES: trim, elect sign, disjoint (weighted) mean, times ``lam``, added to ``base``; in the
    compute dtype (whole tensors: trimming ranks a tensor's entries). Holds every input's
    weighted task vector of this tensor at once."""
    import torch

    ct = compute_dtype(base.dtype)
    b = base.to(ct)
    deltas = [trim(x.to(ct, copy=True).sub_(b), density).mul_(w) for x, w in zip(inputs, weights, strict=True)]
    elected = torch.zeros_like(b)
    for d in deltas:
        elected.add_(d)
    elected = torch.where(elected >= 0, 1.0, -1.0).to(ct)
    mixed = torch.zeros_like(b)
    divisor = torch.zeros_like(b)
    for d, w in zip(deltas, weights, strict=True):
        agree = torch.sign(d) == elected
        mixed.add_(torch.where(agree, d, 0.0))
        divisor.add_(agree.to(ct), alpha=w)
    del deltas
    divisor[divisor == 0] = 1
    mixed.div_(divisor)
    if lam != 1:
        mixed.mul_(lam)
    return mixed.add_(b)


def slerp_coefficients(a: torch.Tensor, b: torch.Tensor, t: float) -> tuple[float, float]:
    """``(c0, c1)`` with ``slerp(a, b, t) = c0 a + c1 b``: spherical interpolation from ``a`` (``t =
    0``) to ``b`` (``t = 1``) over the whole tensor as one vector, its angle from the normalised
    vectors in fp64 (a norm at most ``EPS`` taken as 1); linear, ``(1 - t, t)``, when they are
    nearly colinear or opposite (``|cos| > DOT_THRESHOLD``) or empty."""
    import torch

    if not a.numel():
        return 1.0 - t, t
    aa = bb = ab = 0.0
    x, y = a.reshape(-1), b.reshape(-1)
    for i in range(0, x.numel(), SLICE):
        u, v = x[i : i + SLICE].to(torch.float64), y[i : i + SLICE].to(torch.float64)
        aa += float(torch.dot(u, u))
        bb += float(torch.dot(v, v))
        ab += float(torch.dot(u, v))
    na, nb = math.sqrt(aa), math.sqrt(bb)
    na, nb = (na if na > EPS else 1.0), (nb if nb > EPS else 1.0)
    dot = min(1.0, max(-1.0, ab / (na * nb)))
    if abs(dot) > DOT_THRESHOLD:
        return 1.0 - t, t
    theta = math.acos(dot)
    sin_theta = math.sin(theta)
    return math.sin((1 - t) * theta) / sin_theta, math.sin(t * theta) / sin_theta
