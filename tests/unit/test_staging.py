"""Staging slots: the arena layout, reused views, and what a changed layout does."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from ckptrepo import state as st
from ckptrepo.chunks.chunker import spans_of
from ckptrepo.errors import UsageError
from ckptrepo.ingest import stats
from ckptrepo.ingest.staging import PAGE, Slot, StagingPool


def state(rows: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {
        "w": torch.randn(rows, 5, generator=g),
        "b": torch.arange(7, dtype=torch.int16),
        "empty": torch.zeros(0, 2),
        "half": torch.randn(4, generator=g).bfloat16(),
    }


def test_stage_copies_every_tensor_into_the_arena() -> None:
    slot, src = Slot(), state()
    out = slot.stage(src)
    assert list(out) == list(src)
    arena = slot.arena
    assert arena is not None and arena.data_ptr() % PAGE == 0
    for name, t in src.items():
        assert out[name].dtype == t.dtype and out[name].shape == t.shape
        assert torch.equal(out[name], t)
        if t.numel():
            start = out[name].data_ptr() - arena.data_ptr()
            assert 0 <= start < arena.numel()


def test_the_same_layout_reuses_the_views_in_a_new_dict() -> None:
    slot = Slot()
    first = slot.stage(state())
    again = state()
    again["w"].add_(1.0)
    second = slot.stage(again)
    assert second is not first and list(second) == list(first)
    assert all(second[n] is first[n] for n in first)
    assert all(torch.equal(second[n], again[n]) for n in again)  # the copy filled them anew
    second.pop("w")  # the dict is the caller's: changing it leaves the slot's layout alone
    assert slot.prepare(state())["w"] is first["w"]


def test_a_changed_layout_makes_new_views() -> None:
    slot = Slot()
    first = slot.stage(state())
    for changed in (state(rows=4), {**state(), "b": torch.arange(7, dtype=torch.int32)},
                    dict(reversed(list(state().items())))):
        out = slot.stage(changed)
        assert all(torch.equal(out[n], changed[n]) for n in changed)
        assert out["w"] is not first["w"]
    bigger = {"big": torch.randn(1 << 16)}
    out = slot.stage(bigger)  # outgrows the arena: a new one, new views
    assert torch.equal(out["big"], bigger["big"])
    slot.drop()
    assert slot.arena is None
    out = slot.stage(state())
    assert out["w"] is not first["w"] and torch.equal(out["w"], state()["w"])


def test_conjugate_and_negative_views_are_staged_as_their_values() -> None:
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    src = {"conj": z.conj(), "neg": z.conj().imag, "strided_neg": z.repeat(3).conj().imag[::2]}
    assert src["neg"].is_neg() and src["conj"].is_conj()
    out = Slot().stage(src)
    for name, t in src.items():
        assert not out[name].is_neg() and not out[name].is_conj()
        assert torch.equal(out[name], t.resolve_conj().resolve_neg()), name


def _close(a: stats.Moments, b: stats.Moments) -> bool:
    """Equal counts and extremes, sums to rounding (``copy_moments`` adds them block by block)."""
    if (a.n, a.nan, a.inf, a.lo, a.hi, a.real) != (b.n, b.nan, b.inf, b.lo, b.hi, b.real):
        return False
    return all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9) for x, y in ((a.mean, b.mean), (a.m2, b.m2),
                                                                          (a.sumsq, b.sumsq)))


def test_copy_summarized_stages_as_copy_does_and_gives_each_chunks_moments() -> None:
    """The staged bytes are ``copy``'s; the moments are, chunk by chunk in ingest's order, those
    ingest would take of the staged bytes for float32, float64 and bfloat16 tensors, and None
    for the chunks of the others (other dtypes, non-contiguous or negative views, empty ones)."""
    g = torch.Generator().manual_seed(3)
    big = torch.randn(70_001, generator=g) * 5 + 1
    big[17], big[40_000] = math.nan, -math.inf
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    src = {
        "big": big,  # five chunks of 64 KiB, non-finite values in two of them
        "f64": torch.randn(9000, generator=g, dtype=torch.float64),
        "bf16": torch.randn(50_000, generator=g).bfloat16(),
        "scalar": torch.tensor(3.5),
        "ints": torch.arange(100_000, dtype=torch.int64),
        "strided": torch.randn(300, 40, generator=g).t(),
        "neg": z.conj().imag,
        "empty": torch.zeros(0, 3),
        "param": torch.nn.Parameter(torch.randn(33, generator=g)),
    }
    summarised = {"big", "f64", "bf16", "scalar", "param"} if stats.summarized(torch.float32) else set()
    chunk = 64 << 10
    slot = Slot()
    with ThreadPoolExecutor(1) as helper:
        for _ in range(2):  # the second time into the arena the first one mapped
            out = slot.prepare(src)
            summaries = slot.copy_summarized(src, out, chunk, helper)
            assert not slot.fresh
            for name, t in src.items():
                want = t.detach().resolve_neg()
                assert torch.equal(out[name].view(torch.uint8) if name == "big" else out[name],
                                   want.view(torch.uint8) if name == "big" else want), name
            expected = []
            for name, view in zip(out, st.tensors_bytes(out.values()), strict=True):
                dtype = out[name].dtype
                for off, length in spans_of(len(view), out[name].element_size(), chunk):
                    expected.append((name, stats.moments_of_bytes(view[off : off + length], dtype)))
            assert summaries is not None and len(summaries) == len(expected)
            assert sum(1 for name, _ in expected if name == "big") == 5
            for got, (name, want) in zip(summaries, expected, strict=True):
                assert (got is not None) == (name in summarised), name
                if got is not None:
                    assert _close(got, want), (name, got, want)


def test_progress_reports_each_tensors_offset_once_everything_below_is_in_place() -> None:
    slot, src = Slot(), state(rows=2000)
    out = slot.prepare(src)
    arena = slot.arena
    assert arena is not None and slot.fresh  # nothing copied into this arena yet
    seen: list[int] = []

    def progress(offset: int) -> None:
        # Every tensor laid out below ``offset`` already holds its source's values.
        for name, view in out.items():
            if view.numel() and view.data_ptr() - arena.data_ptr() < offset:
                assert torch.equal(view, src[name])
        seen.append(offset)

    slot.copy(src, out, progress=progress)
    expected = [v.data_ptr() - arena.data_ptr() for v in out.values() if v.numel()]
    assert seen == expected == sorted(expected)  # the empty tensor lies outside the arena
    assert not slot.fresh
    slot.stage(state(rows=2000))
    assert not slot.fresh  # the same arena, its pages mapped
    slot.stage(state(rows=100_000))
    assert slot.arena is not arena and not slot.fresh  # grown: fresh until its copy ended


def test_reserve_maps_every_idle_slot_for_the_layout() -> None:
    pool, src = StagingPool(max_inflight=2), state(rows=5000)
    nbytes = pool.reserve(src)
    assert nbytes == pool.staged_bytes(src)
    slots = list(pool._free)
    arenas = [s.arena for s in slots]
    assert all(a is not None and a.numel() >= nbytes for a in arenas)
    assert not any(s.fresh for s in slots)  # written once: the first copy needs no page faults
    slot, _ = pool.acquire(nbytes)
    out = slot.stage(src)  # the same arena, no new allocation
    assert slot.arena is arenas[slots.index(slot)] and all(torch.equal(out[n], src[n]) for n in src)
    pool.release(slot)


def test_reserve_leaves_slots_in_flight_alone_and_refuses_an_oversized_state() -> None:
    pool = StagingPool(max_inflight=2, budget=1 << 20)
    busy, _ = pool.acquire(100)
    pool.reserve(state())
    assert busy.arena is None and len(pool._free) == 1 and pool._free[0].arena is not None
    with pytest.raises(UsageError, match="budget"):
        pool.reserve({"big": torch.zeros(1 << 19)})  # 2 MiB
    pool.release(busy)


def test_copy_summarized_does_not_wait_for_a_busy_helper() -> None:
    """A helper whose threads are all busy (another commit's phase 2 on the same pool) does not
    hold up the copy: its share, still queued, is copied by the calling thread."""
    import threading

    src = {f"t{i}": torch.randn(40_000) for i in range(6)}
    slot = Slot()
    out = slot.prepare(src)
    release = threading.Event()
    with ThreadPoolExecutor(1) as helper:
        helper.submit(release.wait)  # the helper's only thread is busy
        try:
            summaries = slot.copy_summarized(src, out, 1 << 20, helper)  # a chunk per tensor
        finally:
            release.set()
    assert summaries is not None and len(summaries) == 6
    for (name, t), m in zip(src.items(), summaries, strict=True):
        assert torch.equal(out[name], t)
        if stats.summarized(torch.float32):
            assert m is not None and _close(m, stats.moments_of_bytes(st.tensor_bytes(out[name]), torch.float32))
