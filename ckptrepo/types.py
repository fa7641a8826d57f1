"""Public value types returned by the ``Repo`` API (plain frozen dataclasses, JSON-friendly)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from ckptrepo.ids import short


@dataclass(frozen=True)
class Parent:
    """An edge from a commit to one of its parents."""

    id: str
    kind: str  # "parent" | "merge" | "transfer"
    mapping: dict[str, str] | None = None


@dataclass(frozen=True)
class Commit:
    """A commit as stored: identity, lineage, training context and ingest figures.

    Byte figures: ``logical_bytes`` is the state's tensor bytes, ``new_bytes`` the raw
    bytes of chunks this commit added to the store, ``stored_bytes`` what those chunks
    occupy encoded. Seconds: ``stall_s`` the caller was blocked, ``wait_s`` of that spent
    waiting for an in-flight slot, ``persist_s`` from the end of the stall until durable.
    """

    id: str
    message: str
    created_at: datetime
    author: str
    host: str
    branch: str | None
    step: int | None
    epoch: int | None
    parents: tuple[Parent, ...]
    metrics: dict[str, float]
    config: Any
    code_version: str | None
    n_tensors: int
    logical_bytes: int
    new_bytes: int
    stored_bytes: int
    stall_s: float
    wait_s: float
    persist_s: float
    nonfinite: int = 0
    refs: tuple[str, ...] = field(default=())

    @property
    def short_id(self) -> str:
        return short(self.id)

    @property
    def parent_ids(self) -> list[str]:
        return [p.id for p in self.parents]

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict (times as ISO 8601)."""
        data = asdict(self)
        data["created_at"] = self.created_at.isoformat()
        data["short_id"] = self.short_id
        return data


@dataclass(frozen=True)
class TensorStats:
    """Statistics computed at ingest over a tensor's elements (None where not meaningful)."""

    numel: int
    mean: float | None
    std: float | None
    min: float | None
    max: float | None
    l2_norm: float | None
    abs_max: float | None
    nan_count: int
    inf_count: int


@dataclass(frozen=True)
class TensorInfo:
    """A named tensor of a commit, without its bytes."""

    name: str
    tensor_id: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    n_chunks: int
    stats: TensorStats

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["shape"] = list(self.shape)
        return data


@dataclass(frozen=True)
class RefInfo:
    """A branch or tag and the commit it names."""

    name: str
    kind: str  # "branch" | "tag"
    commit_id: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RepoStats:
    """Sizes of a repository. ``logical_bytes`` sums every commit's state; ``unique_bytes``
    is the raw size of distinct chunks; ``stored_bytes`` what those occupy encoded in packs;
    ``pack_bytes`` the pack files' total size (including unreferenced packs and indexes)."""

    commits: int
    branches: int
    tags: int
    tensors: int
    chunks: int
    packs: int
    logical_bytes: int
    unique_bytes: int
    stored_bytes: int
    pack_bytes: int

    @property
    def dedup_ratio(self) -> float:
        return self.logical_bytes / self.unique_bytes if self.unique_bytes else 1.0

    @property
    def compression_ratio(self) -> float:
        return self.unique_bytes / self.stored_bytes if self.stored_bytes else 1.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["dedup_ratio"] = self.dedup_ratio
        data["compression_ratio"] = self.compression_ratio
        return data
