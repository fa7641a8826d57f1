"""Phase 1 of a commit: copy the state's tensors into reused staging buffers.

A ``StagingPool`` owns ``max_inflight`` slots. Each slot keeps one byte arena that is
reused from commit to commit (grown when a state outgrows it), so a training loop's
copies land in memory that is already mapped: the copy costs about a ``memcpy``, not
page faults. The arena is pinned when CUDA tensors are staged, and CUDA copies are
issued non-blocking and synchronised once at the end. Into a mapped arena, an asynchronous
commit's copy also takes the statistics of its float chunks in the same pass over memory
(``Slot.copy_summarized``): they cost the stall nothing measurable and phase 2 one pass less.

Thread contract: ``acquire`` and ``Slot.stage`` run on the caller's thread; ``release``
is called by whoever finishes the commit (the background committer), exactly once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ckptrepo import faults
from ckptrepo.chunks.chunker import spans_of
from ckptrepo.errors import UsageError
from ckptrepo.ingest.stats import Moments, copy_moments_many, summarized
from ckptrepo.state import bit_view

_ALIGN = 64
# The arena starts on a page and spans whole pages, so its bytes can be written to a file
# with direct I/O straight from it (``ingest.writeahead``).
PAGE = 4096


def _bytes_of(t: torch.Tensor) -> np.ndarray[Any, Any]:
    """A contiguous CPU tensor's bytes as a flat uint8 array (no copy)."""
    return t.reshape(-1).view(torch.uint8).numpy()


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _page_aligned(n: int) -> int:
    return (n + PAGE - 1) // PAGE * PAGE


@dataclass
class _Arena:
    data: torch.Tensor
    pinned: bool


class Slot:
    """One in-flight commit's staging memory. Views returned by ``stage`` stay valid
    until the slot is released; after that the next commit overwrites them."""

    def __init__(self) -> None:
        self._arena: _Arena | None = None
        self._fresh = True
        self.nbytes = 0
        # The last layout and its views: a training loop stages the same names, dtypes and
        # shapes every time, and making ~200 views again cost ~4 ms of each commit's stall.
        self._layout: tuple[list[tuple[str, torch.dtype, torch.Size, bool]], _Arena, int,
                            dict[str, torch.Tensor]] | None = None

    @property
    def capacity(self) -> int:
        return 0 if self._arena is None else self._arena.data.numel()

    @property
    def arena(self) -> torch.Tensor | None:
        """The arena the views of ``prepare`` live in (page-aligned, whole pages), if any."""
        return None if self._arena is None else self._arena.data

    def stage(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Copy every tensor into this slot; returns contiguous CPU copies by name."""
        out = self.prepare(tensors)
        self.copy(tensors, out)
        return out

    def prepare(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Lay ``tensors`` out in the arena (growing it if needed); returns the views that
        ``copy`` will fill, by name, in the same order. Reads no tensor data. The views are
        those of the previous call (in a new dict) when the names, dtypes, shapes and devices
        are the same and the arena has not changed."""
        key = [(name, t.dtype, t.shape, t.is_cuda) for name, t in tensors.items()]
        last = self._layout
        if last is not None and last[1] is self._arena and last[0] == key:
            self.nbytes = last[2]
            return dict(last[3])
        layout: list[tuple[str, int, int]] = []
        offset = 0
        any_cuda = False
        for name, t in tensors.items():
            nbytes = t.numel() * t.element_size()
            layout.append((name, offset, nbytes))
            offset = _aligned(offset + nbytes)
            any_cuda = any_cuda or t.is_cuda
        arena = self._ensure(offset, pin=any_cuda)
        out: dict[str, torch.Tensor] = {}
        for name, start, nbytes in layout:
            src = tensors[name]
            if nbytes == 0:
                out[name] = torch.empty(src.shape, dtype=src.dtype)
            else:
                out[name] = arena[start : start + nbytes].view(src.dtype).view(src.shape)
        self.nbytes = offset
        assert self._arena is not None
        self._layout = (key, self._arena, offset, dict(out))
        return out

    @property
    def fresh(self) -> bool:
        """True until a ``copy`` into the current arena has ended: its pages are not mapped
        yet, so that copy runs at the speed of the kernel's page faults, not of memory."""
        return self._fresh

    def copy(self, tensors: dict[str, torch.Tensor], out: dict[str, torch.Tensor],
             progress: Callable[[int], object] | None = None) -> None:
        """Fill the views of ``prepare`` from ``tensors``; when this returns every staged byte
        is in place (CUDA copies included: they are synchronised at the end).

        ``progress(offset)``, if given and no tensor is on CUDA, is called before each tensor's
        copy into the arena with that tensor's arena offset: every arena byte below it is in
        place by then (the views lie in the arena in ``out``'s order)."""
        any_cuda = any(t.is_cuda for t in tensors.values())
        base = self._arena.data.data_ptr() if self._arena is not None else 0
        if any_cuda:
            progress = None
        for name, dst in out.items():
            faults.point("stage.copy")
            src = tensors[name].detach()
            if not dst.numel():
                continue
            if progress is not None:
                progress(dst.data_ptr() - base)
            if src.is_neg():
                # A negative view (``z.conj().imag``) cannot be viewed as integers; ``copy_``
                # applies its sign (its dtypes all have the strided copy kernel).
                dst.copy_(src, non_blocking=src.is_cuda)
            else:
                # Copy as same-size integers: every dtype gets the plain (strided) memcpy kernel.
                bit_view(dst).copy_(bit_view(src), non_blocking=src.is_cuda)
        if any_cuda:
            # Non-blocking device-to-host copies: the staged bytes are only valid (and the
            # caller only free to mutate its tensors) once the streams have drained.
            torch.cuda.synchronize()
        self._fresh = False

    def copy_summarized(self, tensors: dict[str, torch.Tensor], out: dict[str, torch.Tensor], chunk_size: int,
                        helper: Executor) -> list[Moments | None] | None:
        """``copy`` that also takes each chunk's statistics, in the same pass over memory
        (``stats.copy_moments_many``). The chunks are cut as ingest cuts them
        (``chunker.spans_of`` with ``chunk_size``) and shared out by bytes between this thread
        and one of ``helper``'s, each copying its share in one call. Returns their moments in
        ingest's order (tensor by tensor in ``out``'s order, chunk by chunk), None for the
        chunks of the tensors it does not summarise (dtypes other than float32, float64 and
        bfloat16; non-contiguous, negative or conjugate views; empty ones), which ``copy``'s
        kernel copies on this thread (all of them without the C extension). With a tensor on
        CUDA it is ``copy`` and returns None."""
        if any(t.is_cuda for t in tensors.values()):
            self.copy(tensors, out)
            return None
        summaries: list[Moments | None] = []
        jobs: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], torch.dtype]] = []
        places: list[int] = []
        for name, dst in out.items():
            faults.point("stage.copy")
            src = tensors[name].detach()
            size = dst.element_size()
            spans = spans_of(dst.numel() * size, size, chunk_size)
            if not dst.numel() or not (src.is_contiguous() and summarized(src.dtype)) or src.is_neg() or src.is_conj():
                if dst.numel():
                    if src.is_neg():
                        dst.copy_(src)  # see ``copy``
                    else:
                        bit_view(dst).copy_(bit_view(src))
                summaries.extend([None] * len(spans))
                continue
            s, d = _bytes_of(src), _bytes_of(dst)
            for off, length in spans:
                jobs.append((s[off : off + length], d[off : off + length], src.dtype))
                places.append(len(summaries))
                summaries.append(None)
        # Two shares of about equal bytes: every other chunk of the list sorted by size.
        order = sorted(range(len(jobs)), key=lambda i: -len(jobs[i][0]))
        mine, theirs = order[0::2], order[1::2]
        other = helper.submit(copy_moments_many, [jobs[i] for i in theirs]) if theirs else None
        try:
            for i, m in zip(mine, copy_moments_many([jobs[i] for i in mine]), strict=True):
                summaries[places[i]] = m
        finally:
            # A helper still queued (behind another commit's phase 2, with max_inflight > 1)
            # is not waited for: this thread copies that share too.
            queued = other is not None and other.cancel()
            done = copy_moments_many([jobs[i] for i in theirs]) if queued else other.result() if other else []
        for i, m in zip(theirs, done, strict=True):
            summaries[places[i]] = m
        self._fresh = False
        return summaries

    def fault_in(self) -> None:
        """Write every page of the arena once (zeros): its pages are mapped from then on, and
        the slot is no longer ``fresh``."""
        if self._arena is not None:
            self._arena.data.zero_()
            self._fresh = False

    def _ensure(self, nbytes: int, *, pin: bool) -> torch.Tensor:
        arena = self._arena
        if arena is None or arena.data.numel() < nbytes or (pin and not arena.pinned):
            self._arena = None  # free the old arena before allocating the new one
            size = _page_aligned(max(nbytes, _ALIGN))
            raw = torch.empty(size + PAGE, dtype=torch.uint8, pin_memory=pin and torch.cuda.is_available())
            skip = -raw.data_ptr() % PAGE
            arena = self._arena = _Arena(raw[skip : skip + size], pin)
            self._fresh = True
        return arena.data

    def drop(self) -> None:
        """Free the arena (memory goes back to the allocator)."""
        self._arena = None
        self._layout = None
        self.nbytes = 0


class StagingPool:
    """``max_inflight`` slots and an optional budget of staged bytes across them.

    ``acquire`` blocks while every slot is in flight (or the budget is used up) and
    returns how long it waited; a state larger than the whole budget is refused at once.
    """

    def __init__(self, max_inflight: int = 1, budget: int | None = None) -> None:
        if max_inflight < 1:
            raise UsageError(f"max_inflight must be at least 1, not {max_inflight}")
        self.max_inflight = max_inflight
        self.budget = budget
        self._free = [Slot() for _ in range(max_inflight)]
        self._in_use_bytes = 0
        self._cond = threading.Condition()

    def acquire(self, nbytes: int) -> tuple[Slot, float]:
        """A free slot for a state of ``nbytes`` and the seconds spent waiting for it."""
        self._check_budget(nbytes)
        start = time.perf_counter()
        with self._cond:
            while not self._free or (
                self.budget is not None and self._in_use_bytes + nbytes > self.budget
            ):
                self._cond.wait()
            slot = self._free.pop()
            slot.nbytes = nbytes
            self._in_use_bytes += nbytes
        return slot, time.perf_counter() - start

    def _check_budget(self, nbytes: int) -> None:
        if self.budget is not None and nbytes > self.budget:
            raise UsageError(
                f"the state needs {nbytes} bytes of staging, more than the budget of {self.budget}",
                hint="Raise staging_budget (CKPT_STAGING_BUDGET) or commit smaller states.",
            )

    def release(self, slot: Slot) -> None:
        """Return ``slot`` (its views become invalid) and wake one waiting committer."""
        with self._cond:
            self._in_use_bytes -= slot.nbytes
            self._free.append(slot)
            self._cond.notify_all()

    def staged_bytes(self, tensors: dict[str, torch.Tensor]) -> int:
        """Bytes ``Slot.stage`` will use for ``tensors`` (with alignment)."""
        total = 0
        for t in tensors.values():
            total = _aligned(total + t.numel() * t.element_size())
        return total

    def reserve(self, tensors: dict[str, torch.Tensor]) -> int:
        """Lay ``tensors`` out in every idle slot's arena (allocating or growing it) and write
        each arena's pages once, so that a later commit of a state of this layout copies into
        mapped memory instead of waiting for the kernel to fault its pages in. Slots in
        flight are left as they are. Returns the bytes of each slot's layout."""
        nbytes = self.staged_bytes(tensors)
        self._check_budget(nbytes)
        with self._cond:
            idle = list(self._free)
            self._free.clear()  # taken while they are filled: a commit waits for them
        try:
            for slot in idle:
                slot.prepare(tensors)
                slot.fault_in()
        finally:
            with self._cond:
                self._free.extend(idle)
                self._cond.notify_all()
        return nbytes

    def clear(self) -> None:
        """Free the arenas of idle slots."""
        with self._cond:
            for slot in self._free:
                slot.drop()
