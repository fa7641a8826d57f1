"""How ``dist.writer.ShareWriter`` spreads replicated tensors over the ranks that hold them.

DCP's save-plan dedup gives every replicated tensor to one rank; the coordinator then splits
each large one over all its holders in whole chunk-grid steps, largest tensors first, each
tensor's largest part to the least busy holder: every byte is written exactly once and the
ranks' loads end within a step of each other.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType

from ckptrepo.distributed.writer import ShareWriter, _Assignment

STEP = 4096


def _item(fqn: str, shape: tuple[int, ...]) -> WriteItem:
    size = torch.Size(shape)
    return WriteItem(index=MetadataIndex(fqn), type=WriteItemType.TENSOR,
                     tensor_data=TensorWriteData(chunk=ChunkStorageMetadata(offsets=torch.Size([0] * len(shape)),
                                                                            sizes=size),
                                                 properties=TensorProperties(dtype=torch.float32), size=size))


def _global_plan(owned: list[dict[str, tuple[int, ...]]]) -> tuple[list[_Assignment], dict[str, int]]:
    """Every rank holds every tensor whole; rank i's plan has the items ``owned[i]``."""
    writers = [ShareWriter(SimpleNamespace(chunk_size=STEP), {}) for _ in owned]  # type: ignore[arg-type]
    plans = []
    for rank, (writer, items) in enumerate(zip(writers, owned, strict=True)):
        writer.rank = rank
        every = [_item(f, s) for mine in owned for f, s in mine.items()]
        local = writer.prepare_local_plan(SavePlan(every))
        plans.append(SavePlan([_item(f, s) for f, s in items.items()], storage_data=local.storage_data))
    out = writers[0].prepare_global_plan(plans)
    sizes = {f: 4 * torch.Size(s).numel() for mine in owned for f, s in mine.items()}
    assigned = [p.storage_data for p in out]
    assert all(isinstance(a, _Assignment) for a in assigned)
    return assigned, sizes


def _written(assigned: list[_Assignment], owned: list[dict[str, Any]], sizes: dict[str, int]) -> list[int]:
    """Bytes each rank writes, as ``write_data`` decides; checks every byte is written once."""
    load = [0] * len(assigned)
    covered: dict[str, list[tuple[int, int]]] = {}
    for rank, a in enumerate(assigned):
        for fqn in owned[rank]:
            if fqn not in a.split:
                load[rank] += sizes[fqn]
                covered.setdefault(fqn, []).append((0, sizes[fqn]))
        for fqn, (lo, hi) in a.parts.items():
            load[rank] += hi - lo
            covered.setdefault(fqn, []).append((lo, hi))
    for fqn, spans in covered.items():
        spans.sort()
        assert spans[0][0] == 0 and spans[-1][1] == sizes[fqn], (fqn, spans)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), (fqn, spans)
        assert all(lo % STEP == 0 for lo, _ in spans), (fqn, spans)
    assert set(covered) == set(sizes)
    return load


@pytest.mark.parametrize("world", [2, 3, 4])
def test_replicated_tensors_are_written_once_and_evenly(world: int) -> None:
    shapes = {"a": (10 * STEP // 4,), "b": (2 * STEP // 4,), "c": (7, STEP // 4), "d": (100,), "e": (3 * STEP // 4,)}
    owned: list[dict[str, tuple[int, ...]]] = [{} for _ in range(world)]
    for i, (fqn, shape) in enumerate(shapes.items()):
        owned[i % world][fqn] = shape
    assigned, sizes = _global_plan(owned)
    load = _written(assigned, owned, sizes)
    assert max(load) - min(load) <= 1 * STEP + 400, load
    assert sum(load) == sum(sizes.values())


def test_a_tensor_of_fewer_steps_than_holders_is_not_written_whole_by_its_owner() -> None:
    # Rank 2's plan has "pair" (2 steps); the least busy ranks 0 and 1 get its parts.
    owned: list[dict[str, tuple[int, ...]]] = [{}, {}, {"pair": (2 * STEP // 4,)}]
    assigned, sizes = _global_plan(owned)
    assert "pair" in assigned[2].split and "pair" not in assigned[2].parts
    assert _written(assigned, owned, sizes) == [STEP, STEP, 0]
