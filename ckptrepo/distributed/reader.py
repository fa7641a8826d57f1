"""``CommitReader``: a ``torch.distributed.checkpoint`` StorageReader over one commit.

``read_metadata`` describes the commit as DCP's planners expect a checkpoint: the committed
state rebuilt (without reading a tensor) and flattened as DCP flattens a state dict, every tensor
one chunk at its global shape, every other value a bytes item. DCP's load planner then computes,
on each rank, the regions of each tensor its shards need, whatever layout and world size wrote
the commit; ``read_data`` reads for each region only the chunks it overlaps
(``restore.ranges``), verified, into the target DCP resolves (straight into its memory when it is
contiguous and the region is whole rows). Any commit loads this way: one made
by ``dcp.save`` through ``ShareWriter`` or by ``Repo.commit`` on one process.

Reading never unpickles: a value the commit stores pickled is refused unless ``allow_pickle``.
"""

from __future__ import annotations

import io
import pickle
from concurrent.futures import Executor
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from ckptrepo import state as st
from ckptrepo.chunks.store import ChunkReader
from ckptrepo.chunks.tensors import read_tensors
from ckptrepo.db.engine import Sessions
from ckptrepo.errors import UsageError
from ckptrepo.locations import ChunkLocation
from ckptrepo.restore.layout import layout_of
from ckptrepo.restore.ranges import read_region
from ckptrepo.rows import TensorRow


class CommitReader(StorageReader):
    """Serves DCP loads from commit ``rev`` (resolved once, at ``read_metadata``)."""

    def __init__(self, reading: Sessions, reader: ChunkReader, pool: Executor, rev: str, *,
                 allow_pickle: bool = False) -> None:
        super().__init__()
        self._reading, self._reader, self._pool = reading, reader, pool
        self._rev = rev
        self._allow_pickle = allow_pickle
        self._commit_id = ""
        self._tensors: dict[str, tuple[str, TensorRow, list[ChunkLocation]]] = {}  # fqn -> (entry name, row, chunks)
        self._values: dict[str, Any] = {}  # fqn -> a non-tensor value
        self._pickled: dict[str, tuple[TensorRow, list[ChunkLocation]]] = {}  # fqn -> a pickled value's row, chunks

    @property
    def commit_id(self) -> str:
        """The full id of the commit being read (set by ``read_metadata``)."""
        return self._commit_id

    def reset(self, checkpoint_id: Any = None) -> None:
        pass

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        from torch.distributed.checkpoint._nested_dict import flatten_state_dict

        cid, skeleton, items = layout_of(self._reading, self._rev)
        self._commit_id = cid
        marks: dict[int, str] = {}
        pickled_names: set[str] = set()

        def placeholder(name: str) -> torch.Tensor:
            mark = torch.empty(0)
            marks[id(mark)] = name
            return mark

        state = st.unflatten(_pickled_as_tensors(skeleton, pickled_names), _Placeholders(placeholder))
        flat, mappings = flatten_state_dict(state)
        described: dict[str, Any] = {}
        for fqn, obj in flat.items():
            name = marks.get(id(obj)) if isinstance(obj, torch.Tensor) else None
            if name is None:
                self._values[fqn] = obj
                described[fqn] = BytesStorageMetadata()
            elif name in pickled_names:
                self._pickled[fqn] = items[name]
                described[fqn] = BytesStorageMetadata()
            else:
                row, chunks = items[name]
                shape = torch.Size(row.shape)
                self._tensors[fqn] = (name, row, chunks)
                described[fqn] = TensorStorageMetadata(
                    properties=TensorProperties(dtype=st.dtype_from_name(row.dtype)), size=shape,
                    chunks=[ChunkStorageMetadata(offsets=torch.Size([0] * len(shape)), sizes=shape)])
        # The commit's id travels with the metadata DCP hands every rank: all read the same commit
        # even if ``rev`` names a branch that moves meanwhile.
        return Metadata(state_dict_metadata=described, planner_data=mappings,
                        storage_meta=StorageMeta(checkpoint_id=cid))

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if not self._commit_id:  # DCP read the metadata on another rank: read that commit here too
            meta = metadata.storage_meta
            if meta is not None and isinstance(meta.checkpoint_id, str):
                self._rev = meta.checkpoint_id
            self.read_metadata()

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        for req in plan.items:
            fqn = req.storage_index.fqn
            if req.type == LoadItemType.BYTE_IO:
                buf = io.BytesIO()
                torch.save(self._value(fqn), buf)
                buf.seek(0)
                planner.load_bytes(req, buf)
                continue
            name, row, chunks = self._tensors[fqn]
            target = planner.resolve_tensor(req).detach()
            read_region(self._reader, self._pool, row, chunks, req.storage_offsets, req.lengths,
                        name=name, commit_id=self._commit_id, out=target)
            planner.commit_tensor(req, target)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _value(self, fqn: str) -> Any:
        if fqn in self._values:
            return self._values[fqn]
        if not self._allow_pickle:
            raise UsageError(f"the value at {fqn!r} was stored pickled",
                             hint="pass allow_pickle=True, for repositories you trust only: unpickling can run code")
        row, chunks = self._pickled[fqn]
        data = read_tensors(self._reader, self._pool, [(fqn, row, chunks)], commit_id=self._commit_id)[fqn]
        return pickle.loads(st.tensor_bytes(data))  # allow_pickle: the caller opted in


class _Placeholders(dict[str, torch.Tensor]):
    """Any entry name maps to a fresh placeholder tensor (the state's structure, no bytes)."""

    def __init__(self, make: Any) -> None:
        super().__init__()
        self._make = make

    def __contains__(self, name: object) -> bool:
        return True

    def __getitem__(self, name: str) -> torch.Tensor:
        if not dict.__contains__(self, name):
            dict.__setitem__(self, name, self._make(name))
        return dict.__getitem__(self, name)


def _pickled_as_tensors(node: Any, names: set[str]) -> Any:
    """The skeleton with every pickled value (``{"p": name}``) as a tensor entry of that name,
    whose names are added to ``names``: its structure, without unpickling."""
    if isinstance(node, list):
        return [_pickled_as_tensors(x, names) for x in node]
    if isinstance(node, dict):
        if set(node) == {"p"} and isinstance(node["p"], str):
            names.add(node["p"])
            return {"t": node["p"]}
        return {k: _pickled_as_tensors(v, names) for k, v in node.items()}
    return node
