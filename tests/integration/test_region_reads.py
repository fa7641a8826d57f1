"""Reading regions of stored tensors (``restore.ranges.read_region``), as resharding loads do.

A region read into a target (``out``) decodes whole rows straight into the target's memory,
edge chunks through buffers; anything else (a column range, a non-contiguous or other-dtype
target, a tensor stored as boxes) reads the region and copies it. Every path must give the
same bytes as slicing the whole tensor.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from ckptrepo import Repo
from ckptrepo.errors import UsageError
from ckptrepo.restore import ranges
from ckptrepo.restore.layout import layout_of
from ckptrepo.testing import parts

CHUNK = 64 * 1024


@pytest.fixture
def stored(tmp_path: Path) -> Any:
    torch.manual_seed(0)
    state = {
        "f32": torch.randn(300, 257),  # 1028-byte rows: chunk edges fall inside rows
        "bf16": torch.randn(97, 1031).to(torch.bfloat16),
        "flags": torch.rand(211, 333) > 0.5,
        "vec": torch.arange(50_000, dtype=torch.int64),
        "cube": torch.randn(9, 40, 70),
    }
    with Repo.init(tmp_path / "r", chunk_size=CHUNK) as repo:
        repo.commit(state, blocking=True)
        cid, _, items = layout_of(parts(repo).reading, "main")
        yield repo, cid, items, state


def _read(stored: Any, name: str, offsets: list[int], lengths: list[int], out: torch.Tensor | None = None) -> Any:
    repo, cid, items, _ = stored
    row, chunks = items[name]
    p = parts(repo)
    return ranges.read_region(p.reader, p.pool, row, chunks, offsets, lengths, name=name, commit_id=cid, out=out)


def _random_region(shape: torch.Size, rng: random.Random, whole_rows: bool) -> tuple[list[int], list[int]]:
    offsets, lengths = [], []
    for d, size in enumerate(shape):
        if whole_rows and d > 0:
            offsets.append(0)
            lengths.append(size)
            continue
        lo = rng.randrange(size)
        offsets.append(lo)
        lengths.append(rng.randint(1, size - lo))
    return offsets, lengths


def _box(offsets: list[int], lengths: list[int]) -> tuple[slice, ...]:
    return tuple(slice(o, o + n) for o, n in zip(offsets, lengths, strict=True))


@pytest.mark.parametrize("whole_rows", [True, False], ids=["rows", "boxes"])
def test_regions_read_into_a_target_equal_the_slices_of_the_tensor(stored: Any, whole_rows: bool,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    direct = []
    into = ranges._into
    monkeypatch.setattr(ranges, "_into", lambda *a: (direct.append(a[7]), into(*a)))
    rng = random.Random(7)
    _, _, _, state = stored
    for name, full in state.items():
        for _ in range(6):
            offsets, lengths = _random_region(full.shape, rng, whole_rows)
            expected = full[_box(offsets, lengths)]
            assert torch.equal(_read(stored, name, offsets, lengths), expected)
            out = torch.full(lengths, 3, dtype=full.dtype)
            assert _read(stored, name, offsets, lengths, out=out) is out
            assert torch.equal(out, expected), (name, offsets, lengths)
    # Whole rows of every tensor but the bools go the direct way (any range of a 1-d tensor is
    # whole rows); a column range never does.
    expected_direct = {torch.float32, torch.bfloat16, torch.int64} if whole_rows else {torch.int64}
    assert {t.dtype for t in direct} == expected_direct


def test_a_region_of_whole_rows_inside_one_chunk_and_the_whole_tensor(stored: Any) -> None:
    _, _, _, state = stored
    full = state["f32"]
    for offsets, lengths in (([5, 0], [2, 257]), ([0, 0], [300, 257]), ([299, 0], [1, 257]), ([63, 0], [2, 257])):
        out = torch.empty(lengths)
        _read(stored, "f32", offsets, lengths, out=out)
        assert torch.equal(out, full[_box(offsets, lengths)])


def test_targets_that_are_not_plain_contiguous_tensors_are_filled_by_a_copy(stored: Any) -> None:
    _, _, _, state = stored
    full = state["cube"]
    transposed = torch.zeros(70, 40, 4).permute(2, 1, 0)  # shape (4, 40, 70), not contiguous
    _read(stored, "cube", [3, 0, 0], [4, 40, 70], out=transposed)
    assert torch.equal(transposed, full[3:7])
    wider = torch.zeros(4, 40, 70, dtype=torch.float64)
    _read(stored, "cube", [3, 0, 0], [4, 40, 70], out=wider)
    assert torch.equal(wider, full[3:7].double())


def test_a_target_of_another_shape_is_refused_and_left_alone(stored: Any) -> None:
    out = torch.full((3, 257), 9.0)
    with pytest.raises(UsageError, match="does not fit"):
        _read(stored, "f32", [0, 0], [4, 257], out=out)
    assert bool((out == 9.0).all())
