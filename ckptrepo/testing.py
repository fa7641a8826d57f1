"""Helpers for tests and benchmarks of ckptrepo, in the manner of ``torch.testing``.

>>> from ckptrepo.testing import assert_states_equal, parts
>>> assert_states_equal(repo.checkout("main"), state)      # bit for bit, or AssertionError naming where
>>> with parts(repo).sessions() as s: ...                   # the catalog, below the facade

``parts(repo)`` gives the working parts of an open ``Repo`` (``RepoParts``: its database engine
and sessions, store, chunk reader, worker pool, retention runner and commit engine) to a test
that checks or stubs what lies below the facade, or a benchmark that times one part alone. It
is the one place outside ``repository.py`` and ``reads.py`` that knows ``Repo``'s private
fields. ``assert_states_equal`` is the one equality of nested training states.

Not a stable API for applications: the parts are the internals of this ckptrepo version, and
change with them. Nothing in ckptrepo imports this module; it imports neither torch nor numpy
(it compares their objects only when the caller has imported them).
"""

from __future__ import annotations

import math
import reprlib
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from sqlalchemy import Engine
    from sqlalchemy.orm import Session, sessionmaker

    from ckptrepo.chunks.store import ChunkReader
    from ckptrepo.db.engine import Sessions
    from ckptrepo.ingest.writer import CommitWriter
    from ckptrepo.maintenance.autoprune import AutoRetention
    from ckptrepo.repository import Repo
    from ckptrepo.storage import Backend

__all__ = ["RepoParts", "assert_states_equal", "parts"]


@dataclass(frozen=True)
class RepoParts:
    """The working parts of one open ``Repo``, shared with it (not copies): what a test does
    through them, the repository sees. Valid until the repository is closed."""

    engine: Engine  # the catalog's database engine
    sessions: sessionmaker[Session]  # sessions of the catalog
    reading: Sessions  # sessions whose snapshot holds no pending layout (``db.pending.reading``)
    backend: Backend  # the store
    reader: ChunkReader  # reads and verifies chunks
    pool: ThreadPoolExecutor  # the worker threads of reads and repacks
    retention: AutoRetention  # runs the retention setting after commits
    writer: CommitWriter | None  # the commit engine; None until a write made it (never, when read-only)


def parts(repo: Repo) -> RepoParts:
    """The working parts of ``repo`` (UsageError when it is closed). Makes nothing the
    repository had not made: the commit engine comes with the first write, not with this."""
    repo._check_open()
    writer: CommitWriter | None = repo.__dict__.get("_writer")
    return RepoParts(engine=repo._engine, sessions=repo._sessions, reading=repo._reading, backend=repo._backend,
                     reader=repo._reader, pool=repo._pool, retention=repo._retention, writer=writer)


def assert_states_equal(actual: Any, expected: Any, *, path: str = "", ordered: bool = False) -> None:
    """Raise AssertionError unless ``actual`` equals ``expected`` exactly, naming the first path
    (``path``, the name of the root, then ``['key'][0]...``) where they differ and how.

    At every path both values have the same type (an ``nn.Parameter`` is not a tensor, a tuple
    not a list), but for dicts: any two dicts compare as mappings (a module's ``state_dict()``,
    an ``OrderedDict``, equals the plain dict a checkout returns). Tensors and numpy arrays: the same dtype
    and shape and the same bytes in C order, whatever their strides or device (NaN payloads and
    the sign of zero count). Dicts: the same keys with the same key types (``1`` is not ``True``),
    and with ``ordered`` in the same order; their values compared by key, whatever the order.
    Lists and tuples: the same length, items compared in order. Floats: equal with the same sign
    (``-0.0`` is not ``0.0``), or both NaN (a plain float's NaN payload is not compared); numpy
    scalars by their bytes. Anything else by ``==``. Attributes (a ``state_dict()``'s
    ``_metadata``) are not compared.
    """
    found = _difference(actual, expected, path, ordered)
    if found is not None:
        where, what = found
        raise AssertionError(f"the states differ at {where or 'the root'}: {what}")


_short = reprlib.Repr()
_short.maxstring = _short.maxother = 80


def _type_name(value: Any) -> str:
    cls = type(value)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _difference(actual: Any, expected: Any, where: str, ordered: bool) -> tuple[str, str] | None:
    """``(path, what differs)`` of the first difference, depth first in ``expected``'s order; None if none."""
    if type(actual) is not type(expected) and not (isinstance(actual, dict) and isinstance(expected, dict)):
        return where, f"actual a {_type_name(actual)}, expected a {_type_name(expected)}"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(expected, torch.Tensor):
        return _tensor_difference(actual, expected, where)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(expected, np.ndarray):
        return _array_difference(actual, expected, where, ordered)
    if np is not None and isinstance(expected, np.generic):
        same = actual.dtype == expected.dtype and actual.tobytes() == expected.tobytes()
        return None if same else (where, f"actual {actual!r}, expected {expected!r} (numpy scalars, by their bytes)")
    if isinstance(expected, dict):
        return _dict_difference(actual, expected, where, ordered)
    if isinstance(expected, list | tuple):
        if len(actual) != len(expected):
            return where, f"actual length {len(actual)}, expected {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            if (found := _difference(a, e, f"{where}[{i}]", ordered)) is not None:
                return found
        return None
    if isinstance(expected, float):
        same = (math.isnan(actual) and math.isnan(expected)) or (
            actual == expected and math.copysign(1.0, actual) == math.copysign(1.0, expected))
    else:
        same = bool(actual == expected)
    return None if same else (where, f"actual {_short.repr(actual)}, expected {_short.repr(expected)}")


def _dict_difference(actual: dict[Any, Any], expected: dict[Any, Any], where: str,
                     ordered: bool) -> tuple[str, str] | None:
    keys = {k: k for k in actual}  # a lookup by an expected key gives actual's own key object
    missing, extra = [k for k in expected if k not in keys], [k for k in actual if k not in expected]
    if missing or extra:
        return where, "keys differ: " + ", ".join(
            f"{label} {_short.repr(ks)}" for label, ks in (("missing", missing), ("unexpected", extra)) if ks)
    for k in expected:
        if type(keys[k]) is not type(k):
            return where, f"key {k!r}: actual a {_type_name(keys[k])}, expected a {_type_name(k)}"
    if ordered and list(actual) != list(expected):
        return where, f"key order: actual {_short.repr(list(actual))}, expected {_short.repr(list(expected))}"
    for k in expected:
        if (found := _difference(actual[k], expected[k], f"{where}[{k!r}]", ordered)) is not None:
            return found
    return None


def _tensor_difference(actual: Any, expected: Any, where: str) -> tuple[str, str] | None:
    import numpy as np

    from ckptrepo.state import tensor_bytes

    if actual.dtype != expected.dtype:
        return where, f"actual dtype {actual.dtype}, expected {expected.dtype}"
    if actual.shape != expected.shape:
        return where, f"actual shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    return _bytes_difference(np.frombuffer(tensor_bytes(actual), np.uint8),
                             np.frombuffer(tensor_bytes(expected), np.uint8),
                             expected.element_size(), tuple(expected.shape), actual, expected, where)


def _array_difference(actual: Any, expected: Any, where: str, ordered: bool) -> tuple[str, str] | None:
    import numpy as np

    if actual.dtype != expected.dtype:
        return where, f"actual dtype {actual.dtype}, expected {expected.dtype}"
    if actual.shape != expected.shape:
        return where, f"actual shape {actual.shape}, expected {expected.shape}"
    if expected.dtype.hasobject:  # the bytes are pointers: compare the objects
        for i, (a, e) in enumerate(zip(actual.reshape(-1), expected.reshape(-1), strict=True)):
            index = ", ".join(str(int(x)) for x in np.unravel_index(i, expected.shape))
            if (found := _difference(a, e, f"{where}[{index}]", ordered)) is not None:
                return found
        return None
    return _bytes_difference(np.ascontiguousarray(actual).reshape(-1).view(np.uint8),
                             np.ascontiguousarray(expected).reshape(-1).view(np.uint8),
                             expected.dtype.itemsize, expected.shape, actual, expected, where)


def _bytes_difference(actual: Any, expected: Any, itemsize: int, shape: tuple[int, ...], actual_values: Any,
                      expected_values: Any, where: str) -> tuple[str, str] | None:
    """The difference of two tensors or arrays (``*_values``) of the same dtype and shape, given
    their C-order bytes (flat numpy uint8 arrays): how many elements differ, and the first one's
    index, values and bits."""
    import numpy as np

    if np.array_equal(actual, expected):
        return None
    differing = np.flatnonzero((actual != expected).reshape(-1, itemsize).any(axis=1))
    i = int(differing[0])
    index = tuple(int(x) for x in np.unravel_index(i, shape))
    bits = [f"0x{int.from_bytes(b[i * itemsize:(i + 1) * itemsize].tobytes(), sys.byteorder):0{2 * itemsize}x}"
            for b in (actual, expected)]
    return where, (f"{len(differing)} of {math.prod(shape)} elements differ; the first, at {index}: actual "
                   f"{_item(actual_values, i)} ({bits[0]}), expected {_item(expected_values, i)} ({bits[1]})")


def _item(values: Any, i: int) -> str:
    """Element ``i`` (in C order) of a tensor or array as a Python value, or ``?`` for a dtype
    that has none (bit and packed float types)."""
    try:
        return repr(values.reshape(-1)[i].item())
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        return "?"
