"""Nested training state <-> named tensors plus a JSON skeleton; the only module that knows torch's layout.

``flatten`` turns what a training loop commits into ``Flattened``: a strict-JSON *skeleton*
(structure and non-tensor values) and the tensors it refers to by *entry name* (the key path
joined by ``join_path``, e.g. ``model/layer.0.weight``). ``unflatten`` inverts it;
``load_into`` pushes a restored state into live modules, optimizers and tensors.

Skeleton: each value is one node (short tags: optimizer states hold many small values).
``null``/``true``/``false``, a string, an integer (any size) or a finite float: that value (ints
and floats differ by JSON number syntax, ``1`` vs ``1.0``). ``[v, ...]`` a list; ``{"u": [v, ...]}``
a tuple; ``{"d": [k1, v1, k2, v2, ...]}`` a dict in order, keys (null/bool/int/float/string)
keeping their type, with an optional ``"m"`` holding torch's ``state_dict()._metadata``
(restored as an ``OrderedDict`` carrying it). Entries: ``{"t": name}`` a tensor,
``{"P": [name, requires_grad]}`` an ``nn.Parameter``, ``{"n": name}`` a numpy array,
``{"p": name}`` a pickled value (uint8 entry). Values: ``{"f": "nan"|"inf"|"-inf"}`` a float,
``{"dt": "float32"}`` a torch.dtype, ``{"sz": [ints]}`` a torch.Size, ``{"dv": "cuda:0"}`` a
torch.device, ``{"ns": [numpy dtype name, v]}`` a numpy scalar. Other nodes: FormatError.

Modules, optimizers and schedulers are stored as their ``state_dict()`` (restored as that dict);
tensors as their contiguous values (two different views of one storage come back separate).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import pickle
import warnings
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ckptrepo.entries import escape as _escape
from ckptrepo.entries import join_path as join_path  # entry names are defined in ``entries``
from ckptrepo.entries import split_path as split_path
from ckptrepo.errors import FormatError, IntegrityError, StateMismatch, UnsupportedState, UsageError

_DTYPE_CANDIDATES = (
    "float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "int8", "int16", "int32", "int64", "uint8",
    "uint16", "uint32", "uint64", "bool", "complex32", "complex64", "complex128",
    "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2",
)  # fmt: skip
_NUMPY_ARRAY_DTYPES = frozenset(n for n in _DTYPE_CANDIDATES if n in np.sctypeDict and np.dtype(n).name == n)
_NUMPY_DTYPES = _NUMPY_ARRAY_DTYPES - {"complex64", "complex128"}
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
_TORCH_DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


def _byte_viewable(dtype: torch.dtype) -> bool:
    """Whether this torch can view ``dtype`` as bytes and back, copy it and make it contiguous."""
    raw = torch.arange(4 * dtype.itemsize, dtype=torch.uint8) % 2
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            grid = raw.view(dtype).reshape(2, 2)
            copies = (grid.t().contiguous().t().contiguous(), torch.empty_like(grid).copy_(grid))
            return all(torch.equal(c.view(torch.uint8).reshape(-1), raw) for c in copies)
    except (RuntimeError, TypeError, NotImplementedError):
        return False


SUPPORTED_DTYPES: dict[str, torch.dtype] = {
    name: _TORCH_DTYPES[name] for name in _DTYPE_CANDIDATES
    if name in _TORCH_DTYPES and _byte_viewable(_TORCH_DTYPES[name])
}  # fmt: skip
_NAME_OF: dict[torch.dtype, str] = {dtype: name for name, dtype in SUPPORTED_DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """The stored name of ``dtype`` (``"float32"``); KeyError when it is not in SUPPORTED_DTYPES."""
    if dtype not in _NAME_OF:
        raise KeyError(f"dtype {dtype} is not supported; supported: {', '.join(SUPPORTED_DTYPES)}")
    return _NAME_OF[dtype]


def dtype_from_name(name: str) -> torch.dtype:
    """The dtype stored as ``name``; FormatError when this ckptrepo does not know it."""
    if not isinstance(name, str) or name not in SUPPORTED_DTYPES:
        raise FormatError(detail=f"unknown tensor dtype {name!r}")
    return SUPPORTED_DTYPES[name]


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bit_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed, strides unchanged, as the integer dtype of its element size (complex
    tensors as they are), so byte-moving kernels that some dtypes lack (strided copy,
    ``contiguous`` of float4/bits types) work for every dtype."""
    as_int = _SAME_SIZE_INT.get(t.element_size())
    if as_int is None or t.dtype.is_complex or t.dtype == as_int:
        return t
    return t.view(as_int)


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The C-order bytes of ``t``'s values as a flat ``'B'`` memoryview that keeps ``t`` alive.

    A contiguous CPU tensor is not copied (the view aliases it: later in-place changes show);
    other tensors (non-contiguous, conjugate/negative views, other devices) are copied once.
    """
    if t.device.type == "cpu" and t.numel() > 1 and t.is_contiguous() and not (t.is_conj() or t.is_neg()):
        # The common case (a staged tensor), in fewer calls: the same bytes, aliased.
        return t.detach().reshape(-1).view(torch.uint8).numpy().data
    flat = bit_view(t.detach().cpu().resolve_conj().resolve_neg()).contiguous().reshape(-1)
    if flat.numel() <= 1:  # contiguity ignores the stride of a size-0/1 dim; the byte view does not
        flat = flat.as_strided([flat.numel()], [1])
    return flat.view(torch.uint8).numpy().data


def tensors_bytes(tensors: Iterable[torch.Tensor]) -> list[memoryview]:
    """``tensor_bytes`` of each tensor, in order: the same bytes, aliased or copied alike.

    Contiguous CPU tensors that share a storage (the views of one staging arena, say) are
    sliced out of one memoryview of that storage: a slice costs a fraction of the four tensor
    calls ``tensor_bytes`` makes, which a commit of a few hundred tensors notices. Tensors that
    cannot be aliased go to ``tensor_bytes``; for a single tensor that is the cheaper call."""
    bases: dict[tuple[int, int], memoryview] = {}
    out: list[memoryview] = []
    for t in tensors:
        if not (t.is_cpu and t.is_contiguous()) or t.is_conj() or t.is_neg():
            out.append(tensor_bytes(t))
            continue
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())  # storages over the same bytes share a view
        base = bases.get(key)
        if base is None:
            base = bases[key] = torch.empty(0, dtype=torch.uint8).set_(storage).numpy().data
        size = t.element_size()
        start = t.storage_offset() * size
        out.append(base[start : start + t.numel() * size])  # the storage holds the whole range
    return out


def tensor_from_bytes(
    buf: bytes | bytearray | memoryview | torch.Tensor, dtype: str, shape: Sequence[int]
) -> torch.Tensor:
    """A tensor of ``dtype`` and ``shape`` over ``buf``, the values' C-order bytes.

    Writable buffers and uint8 tensors are aliased (copied only if misaligned); read-only ones
    (``bytes``) are copied once so the result is writable. IntegrityError when the length does
    not match or a bool byte is not 0/1; FormatError for an unknown dtype name.
    """
    dt = dtype_from_name(dtype)
    dims = [int(d) for d in shape]
    nbytes = math.prod(dims) * dt.itemsize
    if isinstance(buf, torch.Tensor):
        if buf.dtype != torch.uint8:
            raise UsageError(f"tensor_from_bytes takes a uint8 tensor, not {buf.dtype}")
        raw = buf.detach().reshape(-1)
    else:
        view = memoryview(buf)
        view = view.cast("B") if view.c_contiguous else memoryview(view.tobytes())
        writable = bytearray(view) if view.readonly else view
        raw = torch.frombuffer(writable, dtype=torch.uint8) if view.nbytes else torch.zeros(0).byte()
    if raw.numel() != nbytes or min(dims, default=0) < 0:
        raise IntegrityError(detail=f"{raw.numel()} bytes for a {dtype} tensor of shape {dims}")
    if not raw.is_contiguous() or raw.storage_offset() % dt.itemsize or raw.data_ptr() % dt.itemsize:
        raw = raw.clone()
    if dt == torch.bool and nbytes and bool((raw > 1).any()):
        raise IntegrityError(detail="a bool tensor holds bytes other than 0 and 1")
    return raw.view(dt).reshape(dims)


@dataclass
class Flattened:
    """A state taken apart: ``skeleton`` (strict JSON, see the module docstring), ``tensors``
    (entry name -> the caller's tensor, not copied, in traversal order, each tie once) and
    ``kinds`` (entry name -> ``"tensor"``, ``"ndarray"`` or ``"pickle"``)."""

    skeleton: Any
    tensors: dict[str, torch.Tensor]
    kinds: dict[str, str]


def _key_part(key: Any) -> str:
    return key if type(key) is str else repr(key) if type(key) is float else str(key)


def _is_key(key: Any) -> bool:
    return key is None or type(key) in (bool, int, str) or (type(key) is float and math.isfinite(key))


def _where(path: Sequence[str]) -> str:
    """A flattener's key path (parts already escaped) as people read it."""
    return "/".join(path) if path else "the top level"


def _describe(value: Any) -> str:
    cls = type(value)
    if cls.__module__ != "builtins":
        return f"an object of type {cls.__module__}.{cls.__qualname__}"
    return f"a function ({value.__qualname__})" if cls.__name__ == "function" else f"a {cls.__name__}"


def _tensor_refusal(t: torch.Tensor) -> str | None:
    if type(t) not in _TENSOR_TYPES:
        return f"a tensor subclass {type(t).__qualname__}"
    if t.is_quantized:
        return "a quantized tensor; store t.dequantize(), or t.int_repr() and its scales"
    if t.is_nested or t.layout != torch.strided:
        return f"a {'nested' if t.is_nested else t.layout} tensor; only dense tensors are stored"
    if t.is_meta:
        return "a meta tensor, which has no data"
    if t.dtype not in _NAME_OF:
        return f"a tensor of dtype {t.dtype}; supported: {', '.join(SUPPORTED_DTYPES)}"
    return None


class _Flattener:
    """One ``flatten``: key paths are lists of parts escaped as ``join_path`` escapes them (once,
    on the way down), so an entry's name is their plain join."""

    def __init__(self, allow_pickle: bool) -> None:
        self.allow_pickle = allow_pickle
        self.tensors: dict[str, torch.Tensor] = {}
        self.kinds: dict[str, str] = {}
        self.seen: dict[tuple[Any, ...], str] = {}
        self.keep: list[Any] = []  # arrays whose id() is a tie key stay alive while flattening
        self.active: set[int] = set()

    def entry(self, key: tuple[Any, ...], path: list[str], t: torch.Tensor, kind: str) -> str:
        if key not in self.seen:
            name = self.seen[key] = "/".join(path)
            self.tensors[name], self.kinds[name] = t, kind
        return self.seen[key]

    def node(self, value: Any, path: list[str]) -> Any:
        cls = type(value)
        if value is None or cls in (bool, int, str) or (cls is float and math.isfinite(value)):
            return value
        if cls is float:
            return {"f": "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"}
        if isinstance(value, torch.Tensor):
            return self.tensor(value, path)
        if isinstance(value, np.ndarray | np.generic):
            return self.numpy(value, path)
        if cls in (dict, OrderedDict, defaultdict, list, tuple):
            if id(value) in self.active:
                raise UnsupportedState(path=_where(path), reason="a container that contains itself")
            self.active.add(id(value))
            try:
                if isinstance(value, dict):
                    return self.mapping(value, path)
                # An index is digits: nothing to escape.
                items = [self.node(item, [*path, str(i)]) for i, item in enumerate(value)]
                return items if cls is list else {"u": items}
            finally:
                self.active.discard(id(value))
        if isinstance(value, torch.Size):
            return {"sz": list(value)}
        if isinstance(value, torch.dtype | torch.device):
            return {"dt" if isinstance(value, torch.dtype) else "dv": str(value).removeprefix("torch.")}
        if callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None)):
            return self.node(value.state_dict(), path)
        return self.pickled(value, path, _describe(value))

    def mapping(self, value: dict[Any, Any], path: list[str]) -> Any:
        items: list[Any] = []
        parts: dict[str, Any] = {}
        for key, item in value.items():
            part = _key_part(key)
            if not _is_key(key):
                reason = f"dict key {key!r}: keys must be str, int, bool, None or a finite float"
                raise UnsupportedState(path=_where(path), reason=reason)
            if part in parts:
                reason = f"keys {parts[part]!r} and {key!r} would share the entry name part {part!r}"
                raise UnsupportedState(path=_where(path), reason=reason)
            parts[part] = key
            items += [key, self.node(item, [*path, _escape(part)])]
        meta = getattr(value, "_metadata", None)  # module versions in a state_dict(); kept when plain JSON
        with contextlib.suppress(TypeError, ValueError):
            if isinstance(meta, dict) and json.loads(json.dumps(meta)) == meta:
                return {"d": items, "m": meta}
        return {"d": items}

    def tensor(self, t: torch.Tensor, path: list[str]) -> Any:
        if (reason := _tensor_refusal(t)) is not None:
            raise UnsupportedState(path=_where(path), reason=reason)
        view = (t.storage_offset(), tuple(t.shape), t.stride(), t.dtype, t.is_conj(), t.is_neg())
        name = self.entry((t.device, t.untyped_storage()._cdata, *view), path, t, "tensor")
        # ``type``, not ``isinstance`` (slow through Parameter's metaclass): subclasses were refused above.
        return {"P": [name, t.requires_grad]} if type(t) is torch.nn.Parameter else {"t": name}

    def numpy(self, a: np.ndarray[Any, Any] | np.generic[Any], path: list[str]) -> Any:
        if isinstance(a, np.generic):
            if a.dtype.isnative and a.dtype.name in _NUMPY_DTYPES:
                return {"ns": [a.dtype.name, self.node(a.item(), path)]}
            return self.pickled(a, path, f"a numpy scalar of dtype {a.dtype}")
        if type(a) is not np.ndarray or not a.dtype.isnative or a.dtype.name not in _NUMPY_ARRAY_DTYPES:
            return self.pickled(a, path, f"a {type(a).__name__} of dtype {a.dtype}, which torch cannot hold")
        self.keep.append(a)
        arr = a if a.flags.c_contiguous and a.flags.writeable and a.flags.aligned else np.array(a, order="C")
        return {"n": self.entry(("n", id(a)), path, torch.from_numpy(arr), "ndarray")}

    def pickled(self, value: Any, path: list[str], reason: str) -> Any:
        if not self.allow_pickle:
            raise UnsupportedState(path=_where(path), reason=reason)
        try:
            data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise UnsupportedState(path=_where(path), reason=f"{reason} that cannot be pickled ({e})") from e
        name = "/".join(path)
        self.tensors[name], self.kinds[name] = torch.frombuffer(bytearray(data), dtype=torch.uint8), "pickle"
        return {"p": name}


def flatten(state: Any, *, allow_pickle: bool = False) -> Flattened:
    """Take ``state`` apart into a skeleton and named tensors, validating all of it first.

    Raises UnsupportedState (naming the key path) for anything the module docstring does not
    list, unless ``allow_pickle`` is set, in which case such values are pickled into uint8
    entries of kind ``"pickle"``. Tensors are referenced, not copied; the caller snapshots them.
    """
    flat = _Flattener(allow_pickle)
    return Flattened(flat.node(state, []), flat.tensors, flat.kinds)


_VALUE_TAGS: dict[str, Callable[[Any], Any]] = {
    "f": {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}.__getitem__,
    "dt": _TORCH_DTYPES.__getitem__,
    "sz": lambda arg: torch.Size([int(x) for x in arg]),
    "dv": torch.device,
}
_ENTRY_TAGS: dict[str, Callable[[torch.Tensor, Any], Any]] = {
    "t": lambda t, _: t,
    "P": lambda t, grad: torch.nn.Parameter(t, requires_grad=bool(grad)),
    "n": lambda t, _: t.numpy(),
}


def unflatten(skeleton: Any, tensors: Mapping[str, torch.Tensor], *, allow_pickle: bool = False) -> Any:
    """Rebuild the state ``flatten`` described, over ``tensors`` (entry name -> restored tensor).

    Tensors are used as given (not copied); one entry referenced twice comes back as the same
    object. Pickled values raise UsageError unless ``allow_pickle``; FormatError for a
    skeleton this version cannot read, IntegrityError for an entry missing from ``tensors``.
    """
    made: dict[tuple[str, str, Any], Any] = {}

    def entry(name: str) -> torch.Tensor:
        if name not in tensors:
            raise IntegrityError(detail=f"the state refers to entry {name!r}, which was not restored")
        return tensors[name]

    def node(n: Any) -> Any:
        if n is None or type(n) in (bool, int, float, str):
            return n
        if type(n) is list:
            return [node(x) for x in n]
        tag, arg = next(iter(n.items())) if type(n) is dict and n else (None, n)
        try:
            if tag == "d":
                keys, vals = arg[0::2], arg[1::2]
                if len(keys) != len(vals) or not all(map(_is_key, keys)):
                    raise ValueError("bad dict items")
                out: dict[Any, Any] = OrderedDict() if "m" in n else {}
                out.update(zip(keys, map(node, vals), strict=True))
                if "m" in n:
                    out._metadata = n["m"]  # type: ignore[attr-defined]
                return out
            if tag == "u":
                return tuple(map(node, arg))
            if tag == "ns" and arg[0] in _NUMPY_DTYPES:
                return np.dtype(arg[0]).type(node(arg[1]))
            if tag in _VALUE_TAGS:
                return _VALUE_TAGS[tag](arg)
            if tag in _ENTRY_TAGS:
                name, extra = arg if type(arg) is list else (arg, None)
                if (tag, name, extra) not in made:
                    made[tag, name, extra] = _ENTRY_TAGS[tag](entry(name), extra)
                return made[tag, name, extra]
            if tag == "p" and allow_pickle:
                return pickle.loads(tensor_bytes(entry(arg)))  # allow_pickle: the caller opted in
            if tag == "p":
                hint = "pass allow_pickle=True, for repositories you trust only: unpickling can run code"
                raise UsageError(f"the value at {arg!r} was stored pickled; {hint}")
        except (ValueError, TypeError, KeyError, AttributeError, RuntimeError) as e:
            raise FormatError(detail=f"malformed state skeleton node {str(n)[:80]!r}: {e}") from e
        raise FormatError(detail=f"unknown state skeleton node {str(n)[:80]!r} (from a newer ckptrepo?)")

    return node(skeleton)


def skeleton_part(skeleton: Any, path: Sequence[str]) -> Any:
    """The node of ``skeleton`` at key path ``path`` (keys compared as entry names write them:
    ``"1"`` finds the int key ``1``). UsageError naming the keys where the path leaves the state."""
    node = skeleton
    for depth, part in enumerate(path):
        items = node.get("d") if type(node) is dict else None
        if items is None:  # a list, tuple or leaf: its positions are not keys
            raise UsageError(f"the commit has no {join_path(path[:depth + 1])!r}: {join_path(path[:depth]) or 'it'} "
                             "is not a dict")
        keys = [_key_part(k) for k in items[0::2]]
        if part not in keys:
            have = ", ".join(map(repr, keys)) or "nothing"
            raise UsageError(f"the commit has no {join_path(path[:depth + 1])!r}; at that level it has: {have}")
        node = items[2 * keys.index(part) + 1]
    return node


def skeleton_entries(node: Any) -> set[str]:
    """The entry names a skeleton node refers to (tensors, arrays and pickled values)."""
    found: set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if type(n) is list:
            stack.extend(n)
        elif type(n) is dict and n:
            tag, arg = next(iter(n.items()))
            if tag in _ENTRY_TAGS or tag == "p":
                found.add(arg[0] if type(arg) is list else arg)
            elif tag in ("d", "u"):
                stack.extend(arg)
    return found


def is_flat_tensor_dict(state: Any) -> bool:
    """True for a dict of str -> tensor and nothing else (what a safetensors file holds)."""
    return isinstance(state, dict) and all(type(k) is str and isinstance(v, torch.Tensor) for k, v in state.items())


def load_into(targets: Mapping[Any, Any], restored: Any) -> None:
    """Load ``restored[key]`` into ``targets[key]`` in place, for every key of ``targets``, or
    nothing at all.

    Everything is checked before anything is written: every key of every target (a key the
    commit lacks, listing those it has), modules against their ``state_dict()`` (keys missing from
    the commit, keys it has that the module lacks, tensors of another shape or no tensor; dtypes
    are cast, as ``load_state_dict`` does; a lazy module's parameters take the commit's shapes),
    optimizers (as many parameter groups, each with as many parameters), tensors and numpy
    arrays (same shape and dtype), dicts recursively, and a target of another kind (a bare
    tensor committed, loaded into a dict). StateMismatch lists every difference (naming each key
    path) and leaves every target as it was. Then tensors are copied
    into, and ``load_state_dict`` is called on modules, optimizers and other objects (schedulers:
    nothing to check; they are loaded first, so one that fails leaves the checked targets untouched).
    UsageError, loading nothing, when ``targets`` is not a mapping (a module given alone).
    """
    if not isinstance(targets, Mapping):
        raise UsageError(f"the targets to load into are {_describe(targets)}, not a dict of them",
                         hint="Name each target: into={'model': model, 'optimizer': optimizer}, as committed "
                              "(commit({'model': model, ...})).")
    loads: list[tuple[int, Callable[[], None]]] = []
    problems: list[str] = []
    _plan_loads(targets, restored, [], loads, problems)
    if problems:
        shown = "; ".join(problems[:_SHOWN_PROBLEMS])
        more = f"; and {len(problems) - _SHOWN_PROBLEMS} more" if len(problems) > _SHOWN_PROBLEMS else ""
        raise StateMismatch(count=len(problems), detail=shown + more, differences=problems)
    for _, load in sorted(loads, key=lambda x: x[0]):  # stable: within one kind, in the targets' order
        load()


_SHOWN_PROBLEMS = 10
_OTHER, _OPTIMIZER, _CHECKED = 0, 1, 2  # load order: what cannot be checked first


def _plan_loads(targets: Mapping[Any, Any], restored: Any, prefix: list[str],
                loads: list[tuple[int, Callable[[], None]]], problems: list[str]) -> None:
    """Check ``restored`` against ``targets``; append a difference to ``problems`` for each thing that
    does not fit, and to ``loads`` what writes each target that does."""
    where = repr(join_path(prefix)) if prefix else "the top level"
    if not isinstance(restored, Mapping):
        problems.append(f"the commit has {_describe_value(restored)} at {where}, which cannot be loaded into "
                        f"{_describe(targets)}")
        return
    for key, target in targets.items():
        path = [*prefix, _key_part(key)]
        name = repr(join_path(path))
        if key not in restored:
            have = ", ".join(map(repr, restored)) or "nothing"
            problems.append(f"the commit has no {name} to load; at that level it has: {have}")
            continue
        value = restored[key]
        if isinstance(target, torch.Tensor | np.ndarray):
            why = _tensor_misfit(target, value)
            if why is None:
                loads.append((_CHECKED, functools.partial(_copy_into, target, value)))
            else:
                problems.append(f"{name}: {why}")
        elif isinstance(target, Mapping) and isinstance(value, Mapping):
            _plan_loads(target, value, path, loads, problems)
        elif callable(getattr(target, "load_state_dict", None)) and isinstance(value, Mapping):
            found = _module_misfits(target, value) if isinstance(target, torch.nn.Module) else (
                _optimizer_misfits(target, value) if isinstance(target, torch.optim.Optimizer) else [])
            problems.extend(f"{name}: {why}" for why in found)
            if not found:
                kind = _CHECKED if isinstance(target, torch.nn.Module) else (
                    _OPTIMIZER if isinstance(target, torch.optim.Optimizer) else _OTHER)
                loads.append((kind, functools.partial(_load_state_dict, target, value, name)))
        else:
            problems.append(f"{name}: {_describe_value(value)} cannot be loaded into {_describe(target)}")


def _describe_value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor ({_dtype_shape(value)})"
    return _describe(value)


def _dtype_shape(t: torch.Tensor) -> str:
    return f"{t.dtype} {list(t.shape)}"


def _tensor_misfit(target: torch.Tensor | np.ndarray[Any, Any], value: Any) -> str | None:
    """Why ``value`` cannot be copied into ``target`` (same shape and dtype needed), or None."""
    src = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
    dst = torch.from_numpy(target) if isinstance(target, np.ndarray) else target
    if not isinstance(src, torch.Tensor) or src.shape != dst.shape or src.dtype != dst.dtype:
        got = _dtype_shape(src) if isinstance(src, torch.Tensor) else _describe(value)
        return f"the commit has {got}, the target is {_dtype_shape(dst)}"
    return None


def _module_misfits(module: torch.nn.Module, value: Mapping[Any, Any]) -> list[str]:
    """What ``module.load_state_dict(value)`` (strict) would refuse: keys missing from ``value``,
    keys the module lacks, tensors of another shape (but for a lazy module's uninitialized
    parameters, which take the commit's), values that are no tensor."""
    own = module.state_dict()
    missing = [k for k in own if k not in value]
    unexpected = [k for k in value if k not in own]
    out = []
    if missing:
        out.append(f"{len(missing)} key(s) missing from the commit: {_names(missing)}")
    if unexpected:
        out.append(f"{len(unexpected)} key(s) the module does not have: {_names(unexpected)}")
    for key, mine in own.items():
        theirs = value.get(key)
        if not isinstance(mine, torch.Tensor) or key not in value:
            continue
        if not isinstance(theirs, torch.Tensor):
            out.append(f"{key!r} is {_describe(theirs)} in the commit, a tensor in the module")
        elif not torch.nn.parameter.is_lazy(mine) and mine.shape != theirs.shape:  # a lazy one takes the commit's
            out.append(f"{key!r} has shape {list(theirs.shape)} in the commit, {list(mine.shape)} in the module")
    return out


def _optimizer_misfits(optimizer: torch.optim.Optimizer, value: Mapping[Any, Any]) -> list[str]:
    """What ``optimizer.load_state_dict(value)`` would refuse: another number of parameter groups,
    or of parameters in a group."""
    groups = value.get("param_groups")
    if not isinstance(groups, list | tuple) or not isinstance(value.get("state"), Mapping):
        return ["the commit's value is not an optimizer's state_dict (no 'state' and 'param_groups')"]
    if len(groups) != len(optimizer.param_groups):
        return [f"{len(groups)} parameter group(s) in the commit, {len(optimizer.param_groups)} in the optimizer"]
    out = []
    for i, (theirs, mine) in enumerate(zip(groups, optimizer.param_groups, strict=True)):
        params = theirs.get("params") if isinstance(theirs, Mapping) else None
        if not isinstance(params, list | tuple) or len(params) != len(mine["params"]):
            got = len(params) if isinstance(params, list | tuple) else "no"
            out.append(f"parameter group {i} has {got} parameter(s) in the commit, {len(mine['params'])} in the "
                       "optimizer")
    return out


def _names(keys: Sequence[Any], shown: int = 5) -> str:
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return ", ".join(map(repr, keys[:shown])) + more


def _load_state_dict(target: Any, value: Mapping[Any, Any], name: str) -> None:
    try:
        target.load_state_dict(value)
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"cannot load {name}: {e}") from e


def _copy_into(target: torch.Tensor | np.ndarray[Any, Any], value: Any) -> None:
    src = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
    dst = torch.from_numpy(target) if isinstance(target, np.ndarray) else target
    with torch.no_grad():
        dst.copy_(src)
