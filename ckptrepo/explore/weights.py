"""A model's weights as lineage inference sees them: per tensor its dtype, shape, ingest statistics
and chunk ids, and a way to read a chunk's bytes, whether the model is a stored commit or a state
(a checkpoint file) that is not committed.

A state is hashed as a commit would hash it (``chunks.chunker.spans_of`` cuts at the repository's
chunk size, ``ids.hash_bytes`` names each piece: ``ingest.identify``) and summarised as ingest
summarises it (``ingest.stats``), so its chunk ids and statistics compare with stored ones, and
nothing is stored. A commit's statistics come from the ``tensors`` table; its chunk locations are
read only when an exact comparison needs them (``Model.pieces``).

Which tensors are weights: the real floating-point tensors (float64/32/16, bfloat16) that are not
optimizer state (``is_optimizer_state``). Those are what distances, frozen fractions and the tail
index are taken over; optimizer step counters (``optimizer_step``) orient edges.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ckptrepo import dtypes
from ckptrepo.chunks.chunker import spans_of
from ckptrepo.ids import hash_bytes, tensor_id

#: Dtypes whose values are compared (widened to float64): the ones every torch widens exactly.
COMPARED_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})
# A name component that marks optimizer state (a state dict's ``optimizer/state/0/exp_avg``, a
# Lightning ``optimizer_states/0/...``, a flat file's ``optim.<param>.exp_avg``).
_OPTIMIZER_PARTS = frozenset({"optim", "optimizer", "optimizers", "optimizer_states", "optimizer_state",
                              "optim_state", "optimizer_state_dict"})
_OPTIMIZER_LEAVES = frozenset({"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "square_avg",
                               "acc_delta", "step"})
_SPLIT = re.compile(r"[./]")
# Tensors smaller than this are left out of the tail index (a bias's extremes say little).
TAIL_MIN_NUMEL = 4096


def name_parts(name: str) -> list[str]:
    """The components of an entry name (split at ``.`` and ``/``)."""
    return _SPLIT.split(name)


def is_optimizer_state(name: str) -> bool:
    """Whether entry ``name`` is optimizer state rather than weights: a component names an optimizer
    (``optim``, ``optimizer``, ``optimizer_states``...) or the last is an optimizer's per-parameter
    buffer (``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``, ``step``...)."""
    parts = name_parts(name)
    return parts[-1] in _OPTIMIZER_LEAVES or any(p in _OPTIMIZER_PARTS for p in parts)


class Piece(NamedTuple):
    """One chunk of a tensor: its id, its length and how to read its bytes."""

    chunk_id: str
    length: int
    read: Callable[[], bytes | memoryview]


@dataclass(frozen=True)
class TensorSummary:
    """One tensor of a model: stored dtype name, shape, statistics (``rows.STAT_KEYS``) and tensor id
    (``ids.tensor_id``: equal ids, equal bytes)."""

    dtype: str
    shape: tuple[int, ...]
    stats: Mapping[str, Any]
    tensor_id: str

    @property
    def numel(self) -> int:
        return int(self.stats.get("numel") or math.prod(self.shape))

    @property
    def l2(self) -> float:
        """The stored L2 norm (0.0 when none: an empty tensor, or values that have none)."""
        value = self.stats.get("l2_norm")
        return float(value) if value is not None and math.isfinite(value) else 0.0

    @property
    def compared(self) -> bool:
        """Whether its values are compared (``COMPARED_DTYPES``, at least one element)."""
        return self.dtype in COMPARED_DTYPES and self.numel > 0


@dataclass
class Model:
    """A model to place in a lineage: ``label`` (a commit id, or the path of a file), the commit it
    is (None for a state), its tensors by entry name, its recorded step (None: unknown), and
    ``pieces(names)``: the chunks of those tensors, read lazily (a commit's locations are looked up
    once, for all names asked)."""

    label: str
    commit_id: str | None
    tensors: dict[str, TensorSummary]
    step: int | None = None
    pieces: Callable[[Collection[str]], dict[str, list[Piece]]] = field(default=lambda names: {}, repr=False)

    def weights(self) -> dict[str, TensorSummary]:
        """The tensors that are weights: compared dtypes, not optimizer state; every compared tensor
        when all of them are optimizer state (a state holding nothing else)."""
        compared = {n: s for n, s in self.tensors.items() if s.compared}
        own = {n: s for n, s in compared.items() if not is_optimizer_state(n)}
        return own or compared

    def optimizer_step(self) -> float | None:
        """The largest optimizer step counter the model holds (a one-element tensor whose last name
        component is ``step``, under optimizer state; its stored mean is its value), else None."""
        found = [float(s.stats["mean"]) for n, s in self.tensors.items()
                 if s.numel == 1 and name_parts(n)[-1] == "step" and is_optimizer_state(n)
                 and s.stats.get("mean") is not None and math.isfinite(s.stats["mean"])]
        return max(found) if found else None

    def progress(self) -> float | None:
        """How far training went, where the weights say it: the optimizer step counter, else the
        recorded step; None when neither is known."""
        found = self.optimizer_step()
        return found if found is not None else (float(self.step) if self.step is not None else None)


def tail_index(model: Model, names: Collection[str]) -> float | None:
    """The mean over ``names`` (weights of at least ``TAIL_MIN_NUMEL`` elements) of
    ``log(abs_max / std)`` from stored statistics: how heavy a weight distribution's tail is, which
    grows as training goes on (MoTHer's observation, for kurtosis); None when no tensor qualifies."""
    logs = []
    for name in sorted(names):
        s = model.tensors.get(name)
        if s is None or s.numel < TAIL_MIN_NUMEL:
            continue
        top, std = s.stats.get("abs_max"), s.stats.get("std")
        if top is not None and std is not None and std > 0 and top > 0 and math.isfinite(top) and math.isfinite(std):
            logs.append(math.log(top / std))
    return math.fsum(logs) / len(logs) if logs else None


# -- a state, hashed and summarised as a commit would be --------------------------------------


def state_model(label: str, sources: Sequence[Any], chunk_size: int, pool: Executor, *,
                step: int | None = None) -> Model:
    """The model of a state's tensors (``ingest.sources.Source`` items: name, dtype, shape, bytes),
    cut and hashed as a commit with ``chunk_size`` would (equal chunk ids for equal bytes), with the
    ingest statistics of each; nothing is read from or written to a repository. The sources' bytes
    must stay valid while the model is used (its pieces are views of them)."""
    from ckptrepo.ingest.stats import combine, moments_of_bytes

    cuts = [spans_of(len(src.data), dtypes.dtype(src.dtype).itemsize, chunk_size) for src in sources]
    views = [src.data[offset:offset + length] for src, spans in zip(sources, cuts, strict=True)
             for offset, length in spans]
    ids = list(pool.map(hash_bytes, views))
    kinds = [src.dtype for src, spans in zip(sources, cuts, strict=True) for _ in spans]
    moments = list(pool.map(moments_of_bytes, views, kinds))
    tensors: dict[str, TensorSummary] = {}
    chunks: dict[str, list[Piece]] = {}
    at = 0
    for src, spans in zip(sources, cuts, strict=True):
        mine = range(at, at + len(spans))
        at += len(spans)
        tensors[src.name] = TensorSummary(src.dtype, tuple(src.shape), combine([moments[i] for i in mine], src.numel),
                                          tensor_id(src.dtype, list(src.shape), chunk_size, [ids[i] for i in mine]))
        chunks[src.name] = [Piece(ids[i], len(views[i]), _constant(views[i])) for i in mine]
    return Model(label, None, tensors, step, lambda names: {n: chunks[n] for n in names if n in chunks})


def _constant(view: memoryview) -> Callable[[], memoryview]:
    return lambda: view


# -- a stored commit -------------------------------------------------------------------------------


def commit_model(commit_id: str, rows: Mapping[str, tuple[str, Sequence[int], Mapping[str, Any], str]],
                 step: int | None, locate: Callable[[Collection[str]], Mapping[str, tuple[Any, Sequence[Any]]]],
                 read: Callable[[Any], bytes | memoryview]) -> Model:
    """The model of a stored commit from its tensors' rows (name -> dtype, shape, statistics, tensor
    id: no chunk list read). ``locate(names)``: name -> (``rows.TensorRow``, ordered ``ChunkLocation``s) of
    those tensors (the facade's layout read, which refuses a pruned or damaged commit); ``read(loc)``:
    a chunk's verified bytes (``ChunkReader.read``)."""
    tensors = {name: TensorSummary(dtype, tuple(shape), stats, tid)
               for name, (dtype, shape, stats, tid) in rows.items()}

    def pieces(names: Collection[str]) -> dict[str, list[Piece]]:
        found = locate(sorted(names)) if names else {}
        return {name: [Piece(loc.chunk_id, loc.raw_length, _reading(read, loc)) for loc in locations]
                for name, (_, locations) in found.items()}

    return Model(commit_id, commit_id, tensors, step, pieces)


def _reading(read: Callable[[Any], bytes | memoryview], loc: Any) -> Callable[[], bytes | memoryview]:
    return lambda: read(loc)
