"""``ShareWriter``: a ``torch.distributed.checkpoint`` StorageWriter that commits to a repository.

DCP drives it on every rank: ``prepare_local_plan`` (each rank says which tensors it holds
whole), ``prepare_global_plan`` (DCP's own dedup gave every replicated item to one rank; the
coordinator spreads the large ones over all ranks that hold them, in whole chunk-grid steps,
largest tensors first and each part to the least busy holder, so each is hashed and written
once and in parts, DeepFreeze style), ``write_data`` (each rank ingests its items and parts,
``CommitWriter.write_packs``: no tensor bytes travel to the coordinator; the packs are durable
when it returns), ``finish`` (the coordinator merges the ranks' shares, ``merge``, and records
one commit in one transaction, ``CommitWriter.record``). The commit's id is set on the
checkpoint ``Metadata`` DCP returns on every rank: ``commit_id(metadata)``.

Write ordering across ranks: a rank's ``write_data`` returns only once its packs are durable;
DCP gathers every rank's result before ``finish`` runs on the coordinator, and runs no
``finish`` when a rank failed. So the transaction that makes the commit visible follows the
last rank's last pack, and a failed or killed rank leaves only unreferenced packs, which ``gc``
reclaims (after its grace period).

Leases (``ledger.leases``): each rank takes one before its first pack in ``write_data`` and
hands its key to the coordinator with its result (``LEASE``); the coordinator releases them
all once its transaction has committed or failed, so no rank's packs look like garbage to a
``gc`` before then. A rank whose own ``write_data`` failed releases its lease at once (no
``finish`` will use its packs); one whose peers failed keeps it, since it cannot know that
the coordinator is not recording: it goes when the rank's process ends (stale to ``gc`` on
that host) or after the ``LEASE_TTL``.

Layout (``layout``): a shard that is one range of its tensor's row-major bytes is cut on the
tensor's own chunk grid; any other shard is stored as a box. Tensors keep their global shape;
the commit's state is the nested state DCP flattened (its ``planner_data``; an optimizer's
per-parameter keys ints again, ``keys``), so it checks out like any other commit.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from ckptrepo import state as st
from ckptrepo.chunks.chunker import chunk_step
from ckptrepo.distributed import layout
from ckptrepo.distributed.keys import int_keys
from ckptrepo.distributed.merge import Share, merge
from ckptrepo.errors import UnsupportedState
from ckptrepo.ingest.request import CommitRequest
from ckptrepo.ingest.sources import Source
from ckptrepo.ingest.writer import CommitWriter
from ckptrepo.ledger.leases import Lease
from ckptrepo.types import Commit

SHARE = MetadataIndex("__ckptrepo_share__")  # the extra write result that carries a rank's share
LEASE = MetadataIndex("__ckptrepo_lease__")  # and the one that carries the key of its lease
_SPLIT_MIN_STEPS = 2  # a replicated tensor of at least this many chunk steps is spread over ranks


@dataclass
class _Holdings:
    """A rank's local plan data: its rank, and the tensors it holds whole (fqn -> bytes)."""

    rank: int
    whole: dict[str, int] = field(default_factory=dict)


@dataclass
class _Assignment:
    """What the coordinator asks one rank to write instead of its plan's items whole: byte
    ranges of replicated tensors, fqn -> (start, end); ``split``: every tensor written in parts
    (one of its plan's items without a part here is written by other ranks only)."""

    rank: int
    parts: dict[str, tuple[int, int]] = field(default_factory=dict)
    split: set[str] = field(default_factory=set)


def commit_id(metadata: Metadata) -> str:
    """The id of the commit a save through ``ShareWriter`` made (from the Metadata ``dcp.save``
    returns on every rank, or its async future's result)."""
    meta = metadata.storage_meta
    if meta is None or not isinstance(meta.checkpoint_id, str):
        raise ValueError("this checkpoint metadata was not written by ckptrepo")
    return meta.checkpoint_id


class ShareWriter(StorageWriter):
    """Commits one DCP save per ``reset`` to the repository of ``engine`` (``meta``:
    ``CommitRequest``'s metadata fields, validated by the caller; ``per_save_time``: each save's
    own time instead of ``meta``'s). ``allow_pickle``: non-tensor values that are not plain data
    are stored pickled (else refused with UnsupportedState). After a save, ``commit`` is the
    commit on the coordinator. ``timing``: the ``(stall_s, wait_s, staged_at)`` of the caller's
    phase 1 (``Repo.commit`` on every rank); without it a commit records no stall and its
    ``persist_s`` counts from the start of the save (DCP's ``reset``)."""

    def __init__(self, engine: CommitWriter, meta: dict[str, Any], *, allow_pickle: bool = False,
                 per_save_time: bool = False, timing: tuple[float, float, float] | None = None) -> None:
        super().__init__()
        self._engine = engine
        # A writer reused for several saves records each at its own time.
        self._meta = {k: v for k, v in meta.items() if not (per_save_time and k == "created_at")}
        self._allow_pickle = allow_pickle
        self._staged_by_caller = timing is not None
        self._timing = timing or (0.0, 0.0, time.perf_counter())
        self.commit: Commit | None = None
        self.rank = 0
        self.is_coordinator = True
        self._lease: Lease | None = None

    def reset(self, checkpoint_id: Any = None) -> None:
        self.commit = None
        self._lease = None  # a new save, a new lease (the last one's went with its commit)
        if not self._staged_by_caller:  # a save through the DCP Writer: its persist_s counts from here
            self._timing = (0.0, 0.0, time.perf_counter())

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        self.rank = int(kwargs.get("rank", 0) or 0)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False  # chosen explicitly, never guessed from an id

    def storage_meta(self) -> StorageMeta | None:
        return None

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        whole = {item.index.fqn: _nbytes(item) for item in plan.items
                 if item.type == WriteItemType.TENSOR and item.tensor_data is not None}
        return SavePlan(plan.items, storage_data=_Holdings(self.rank, whole), planner_data=plan.planner_data)

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        holders: dict[str, list[int]] = {}
        for i, plan in enumerate(plans):
            held = plan.storage_data.whole if isinstance(plan.storage_data, _Holdings) else {}
            for fqn in held:
                holders.setdefault(fqn, []).append(i)
        assignments = [_Assignment(i) for i in range(len(plans))]
        step = self._engine.chunk_size
        load = [0] * len(plans)  # bytes each rank writes
        split: list[tuple[int, str, int, list[int]]] = []  # (bytes, fqn, grid step, holders)
        for i, plan in enumerate(plans):
            for item in plan.items:
                if item.type != WriteItemType.TENSOR or item.tensor_data is None:
                    continue
                nbytes, ranks = _nbytes(item), holders.get(item.index.fqn, [])
                if len(ranks) < 2 or nbytes < _SPLIT_MIN_STEPS * step:
                    load[i] += nbytes
                else:
                    split.append((nbytes, item.index.fqn,
                                  chunk_step(item.tensor_data.properties.dtype.itemsize, step), ranks))
        # Largest first, each tensor's largest part to its least busy holder so far.
        for nbytes, fqn, grid, ranks in sorted(split, key=lambda x: (-x[0], x[1])):
            parts = sorted(layout.grid_split(nbytes, len(ranks), grid), key=lambda p: p[0] - p[1])
            for rank, part in zip(sorted(ranks, key=lambda r: (load[r], r)), parts, strict=False):
                assignments[rank].parts[fqn] = part
                load[rank] += part[1] - part[0]
        for a in assignments:
            a.split = {fqn for _, fqn, _, _ in split}
        return [SavePlan(p.items, storage_data=a, planner_data=p.planner_data) for p, a in zip(plans, assignments,
                                                                                               strict=True)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        assigned = plan.storage_data if isinstance(plan.storage_data, _Assignment) else _Assignment(self.rank)
        parts = assigned.parts
        sources: list[Source] = []
        values: dict[str, bytes] = {}
        keep: list[torch.Tensor] = []  # the tensors the sources' bytes alias, alive until ingested
        results: list[WriteResult] = []
        done: set[str] = set()
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                assert isinstance(data, io.BytesIO)
                values[item.index.fqn] = data.getvalue()
                results.append(WriteResult(index=item.index, size_in_bytes=len(values[item.index.fqn]),
                                           storage_data=None))
                continue
            assert isinstance(data, torch.Tensor) and item.tensor_data is not None
            if item.index.fqn not in assigned.split or item.index.fqn in parts:
                sources.extend(_sources(item.index.fqn, item, data, parts.get(item.index.fqn), keep))
            done.add(item.index.fqn)
            results.append(WriteResult(index=item.index, size_in_bytes=_nbytes(item), storage_data=None))
        for fqn, part in parts.items():  # parts of replicated tensors another rank's plan holds
            if fqn not in done:
                whole = WriteItem(index=MetadataIndex(fqn), type=WriteItemType.TENSOR)
                tensor = planner.resolve_data(whole)
                assert isinstance(tensor, torch.Tensor)
                sources.extend(_sources(fqn, None, tensor, part, keep))
        lease = self._lease_of_save()
        try:
            share = self._write(sources)
        except BaseException:
            lease.release()  # DCP runs no finish after a failed write_data: nothing will name its packs
            raise
        share.values = values
        results.append(WriteResult(index=SHARE, size_in_bytes=share.new_bytes, storage_data=share))
        results.append(WriteResult(index=LEASE, size_in_bytes=0, storage_data=lease.key))
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)  # a torch future, as DCP waits on one
        return future

    def _lease_of_save(self) -> Lease:
        """This rank's lease for the save in progress (made on first use, not taken yet)."""
        if self._lease is None:
            self._lease = self._engine.lease(f"rank {self.rank}")
        return self._lease

    def _write(self, sources: list[Source]) -> Share:
        """Write durable packs of ``sources`` (write-ordering step 1 of this rank's share), under
        this rank's lease, taken first."""
        defer = self._engine.defers(blocking=False)
        plan = self._engine.plan(_request(self._meta, None, self._timing), defer=defer, shared=True)
        if sources:
            self._lease_of_save().take()
        result = self._engine.write_packs(sources, plan, self._engine.pool, defer=defer)
        return Share.of(self.rank, result)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        keys = [r.storage_data for rank in results for r in rank
                if r.index == LEASE and isinstance(r.storage_data, str)]
        try:
            self._record(metadata, results)
        finally:
            # The transaction committed or failed: rows name every rank's packs, or nothing will.
            own = self._lease.key if self._lease is not None else None
            if self._lease is not None:
                self._lease.release()
            self._engine.release_leases([k for k in keys if k != own])

    def _record(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Merge the ranks' shares and record the commit (write-ordering steps 2 and 3)."""
        shares = [r.storage_data for rank in results for r in rank if isinstance(r.storage_data, Share)]
        values: dict[str, bytes] = {}
        for share in shares:
            values.update(share.values)
        skeleton, entries, extra = _state_of(metadata, values, self._allow_pickle)
        if extra:  # tensors inside non-tensor values: written by the coordinator, under its lease
            shares.append(self._write([Source(name, st.dtype_name(t.dtype), tuple(t.shape), st.tensor_bytes(t))
                                       for name, t in extra.items()]))
        result = merge(shares, self._engine.chunk_size)
        result.tensors = [replace(r, name=entries.get(r.name, r.name)) for r in result.tensors]
        defer = self._engine.defers(blocking=False)
        req = _request(self._meta, skeleton, self._timing)
        plan = self._engine.plan(req, defer=defer, shared=True)
        self._lease_of_save().take()  # for the manifest, when this rank wrote no pack
        self.commit = self._engine.record(result, plan, req)
        if result.deferred:
            self._engine.repack_later()
        metadata.storage_meta = StorageMeta(checkpoint_id=self.commit.id)


def _nbytes(item: WriteItem) -> int:
    return item.tensor_storage_size() or 0


def _request(meta: dict[str, Any], skeleton: Any, timing: tuple[float, float, float]) -> CommitRequest:
    stall_s, wait_s, staged_at = timing
    fields = {**meta, "created_at": meta.get("created_at") or datetime.now(timezone.utc)}
    return CommitRequest(skeleton=skeleton, stall_s=stall_s, wait_s=wait_s, staged_at=staged_at, **fields)


def _sources(fqn: str, item: WriteItem | None, tensor: torch.Tensor, part: tuple[int, int] | None,
             keep: list[torch.Tensor]) -> list[Source]:
    """The sources of one item's tensor (``item`` None: a whole replicated tensor): whole, one
    byte range of it (``part``), or a shard (a range of the global bytes, or a box)."""
    local = tensor.detach()
    if local.device.type != "cpu" or not local.is_contiguous():
        local = local.cpu().contiguous()
    keep.append(local)
    data = st.tensor_bytes(local)
    dtype = st.dtype_name(local.dtype)
    if item is None or item.type == WriteItemType.TENSOR:
        shape = tuple(local.shape)
        if part is None:
            return [Source(fqn, dtype, shape, data)]
        zeros = (0,) * len(shape)
        return [Source(fqn, dtype, shape, data[part[0] : part[1]], box=(zeros, shape), start=part[0])]
    assert item.tensor_data is not None
    shape = tuple(item.tensor_data.size)
    offsets, sizes = tuple(item.tensor_data.chunk.offsets), tuple(item.tensor_data.chunk.sizes)
    start = layout.range_start(shape, offsets, local.element_size()) if layout.is_range(shape, offsets, sizes) else None
    return [Source(fqn, dtype, shape, data, box=(offsets, sizes), start=start)]


def _state_of(metadata: Metadata, values: dict[str, bytes],
              allow_pickle: bool) -> tuple[Any, dict[str, str], dict[str, torch.Tensor]]:
    """The commit's skeleton (the nested state DCP flattened, from its ``planner_data``), the
    entry name of every tensor fqn, and tensors found inside non-tensor values (by entry name)."""
    from torch.distributed.checkpoint._nested_dict import unflatten_state_dict
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    flat: dict[str, Any] = {}
    placeholders: dict[int, str] = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            mark = torch.empty(0)
            placeholders[id(mark)] = fqn
            flat[fqn] = mark
        else:
            flat[fqn] = _value(fqn, values.get(fqn), allow_pickle)
    mappings = metadata.planner_data
    nested = unflatten_state_dict(flat, mappings) if isinstance(mappings, dict) and mappings else flat
    # DCP's key paths are strings: an optimizer's per-parameter keys become ints again, as a
    # single process's commit of the same optimizer records them (``keys``).
    taken = st.flatten(int_keys(nested), allow_pickle=allow_pickle)
    entries: dict[str, str] = {}
    extra: dict[str, torch.Tensor] = {}
    for name, t in taken.tensors.items():
        if id(t) in placeholders:
            entries[placeholders[id(t)]] = name
        else:
            extra[name] = t
    return taken.skeleton, entries, extra


def _value(fqn: str, data: bytes | None, allow_pickle: bool) -> Any:
    """A non-tensor value from the bytes DCP serialised (``torch.save``): read with
    ``weights_only`` (plain data), else only with ``allow_pickle`` (the value is the caller's own,
    being saved now)."""
    if data is None:
        raise UnsupportedState(path=fqn, reason="no rank wrote this value")
    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:
        if not allow_pickle:
            raise UnsupportedState(path=fqn, reason=f"a value that is not plain data ({exc}); "
                                                    "pass allow_pickle=True to store it pickled") from exc
    return torch.load(io.BytesIO(data), weights_only=False)  # allow_pickle: the caller's own value
