"""The write-ahead of raw chunks: file layout, sealed packs, failures and cleanup."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from ckptrepo import faults
from ckptrepo.chunks.chunker import chunk_spans
from ckptrepo.chunks.pack import HEADER, read_index
from ckptrepo.chunks.store import ChunkReader, SealedPack, pack_key
from ckptrepo.errors import UsageError
from ckptrepo.ids import hash_bytes
from ckptrepo.ingest.staging import PAGE, Slot
from ckptrepo.ingest.writeahead import WriteAhead
from ckptrepo.state import tensor_bytes
from ckptrepo.storage import LocalBackend

CHUNK = 16 * 1024


@pytest.fixture(params=["direct", "buffered"])
def backend(tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> LocalBackend:
    monkeypatch.setenv("CKPT_DIRECT_IO", "1" if request.param == "direct" else "0")
    return LocalBackend(tmp_path / "store")


def staged(tensors: dict[str, torch.Tensor]) -> tuple[Slot, dict[str, torch.Tensor]]:
    slot = Slot()
    return slot, slot.stage(tensors)


def state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "big": torch.randn(40_000, generator=g),  # 160,000 bytes: 10 chunks
        "small": torch.randn(7, generator=g).half(),
        "empty": torch.empty(0),
        "mid": torch.randint(0, 255, (50_001,), dtype=torch.uint8, generator=g),
    }


def index_all(ahead: WriteAhead, views: dict[str, torch.Tensor]) -> dict[str, bytes]:
    """``add`` every chunk of every tensor; the raw bytes of those it took, by chunk id."""
    taken = {}
    for i, t in enumerate(views.values()):
        data = tensor_bytes(t)
        for off, ln in chunk_spans(len(data), t.element_size(), CHUNK):
            cid = hash_bytes(data[off : off + ln])
            if ahead.add(i, off, cid, ln):
                taken[cid] = bytes(data[off : off + ln])
    return taken


def read_all(backend: LocalBackend, packs: list[SealedPack]) -> dict[str, bytes]:
    reader = ChunkReader(backend)
    return {loc.chunk_id: reader.read(loc) for p in packs for loc in p.locations}


def test_written_tensors_become_packs_that_read_back(backend: LocalBackend) -> None:
    slot, views = staged(state())
    written = [True, False, True, True]
    ahead = WriteAhead(backend, slot.arena, list(views.values()), written, target=64 * 1024, chunk_size=CHUNK)
    assert ahead.tensors == 2  # the empty tensor has nothing to write
    with ThreadPoolExecutor(1) as pool:
        ahead.start(pool)
        taken = index_all(ahead, views)
        packs = ahead.seal()
    ahead.close()
    assert len(packs) > 1  # cut at chunk boundaries once a file spans 64 KiB
    assert read_all(backend, packs) == taken
    small = tensor_bytes(views["small"])
    assert hash_bytes(small) not in taken  # not written ahead: the caller stores it
    for p in packs:
        entries = read_index(backend, pack_key(p.pack_id))
        assert all(e.offset >= PAGE for e in entries)  # payloads start after the header page
        assert backend.size(pack_key(p.pack_id)) == p.size
    assert not list(backend.staging_dir().glob("pack-*.tmp"))


def test_files_respect_the_target_except_for_a_single_chunk(backend: LocalBackend) -> None:
    slot, views = staged({"t": torch.randn(200_000)})  # 800,000 bytes, 49 chunks
    ahead = WriteAhead(backend, slot.arena, list(views.values()), [True], target=40_000, chunk_size=CHUNK)
    with ThreadPoolExecutor(1) as pool:
        ahead.start(pool)
        taken = index_all(ahead, views)
        packs = ahead.seal()
    assert read_all(backend, packs) == taken and len(taken) == 49
    for p in packs:
        payload = max(loc.offset + loc.length for loc in p.locations) - min(loc.offset for loc in p.locations)
        assert payload <= 40_000 + 2 * PAGE or len(p.locations) == 1


def test_a_file_with_no_new_chunk_is_deleted(backend: LocalBackend) -> None:
    slot, views = staged(state())
    ahead = WriteAhead(backend, slot.arena, list(views.values()), [True] * 4, target=1 << 30, chunk_size=CHUNK)
    with ThreadPoolExecutor(1) as pool:
        ahead.start(pool)
        assert ahead.seal() == []  # every chunk turned out known: nothing indexed
    ahead.close()
    assert not list(backend.staging_dir().iterdir()) and not list(Path(backend.root).rglob("*.pack"))


def test_closing_before_the_start_writes_nothing(backend: LocalBackend) -> None:
    slot, views = staged(state())
    ahead = WriteAhead(backend, slot.arena, list(views.values()), [True] * 4, target=1 << 20, chunk_size=CHUNK)
    ahead.close()
    with ThreadPoolExecutor(1) as pool:
        ahead.start(pool)  # phase 2 failed first: the writes never start
    assert not list(backend.staging_dir().iterdir())


@pytest.mark.parametrize(("point", "packs_left"), [("pack.write", 0), ("pack.after_put", 1)])
def test_a_failure_surfaces_on_seal_and_close_removes_every_temporary_file(
    backend: LocalBackend, point: str, packs_left: int
) -> None:
    slot, views = staged(state())
    ahead = WriteAhead(backend, slot.arena, list(views.values()), [True] * 4, target=64 * 1024, chunk_size=CHUNK)
    with faults.inject(point, "raise"), ThreadPoolExecutor(1) as pool:
        ahead.start(pool)
        index_all(ahead, views)
        with pytest.raises(faults.InjectedFault):
            ahead.seal()
    ahead.close()
    assert not list(backend.staging_dir().iterdir())
    # A pack put before the failure stays, unreferenced, for gc to reclaim.
    assert len(list(Path(backend.root).rglob("*.pack"))) == packs_left


def test_the_arena_must_be_page_aligned(backend: LocalBackend) -> None:
    arena = torch.empty(3 * PAGE, dtype=torch.uint8)
    skew = arena[(-arena.data_ptr() % PAGE) + 64 :][: PAGE]
    with pytest.raises(UsageError, match="page-aligned"):
        WriteAhead(backend, skew, [], [], target=1 << 20, chunk_size=CHUNK)


def test_staging_arena_is_page_aligned_whole_pages() -> None:
    slot, _ = staged({"a": torch.randn(1000), "b": torch.randn(3)})
    arena = slot.arena
    assert arena is not None and arena.data_ptr() % PAGE == 0 and arena.numel() % PAGE == 0
    assert HEADER.size < PAGE


def test_copied_queues_only_files_wholly_below_the_offset(backend: LocalBackend) -> None:
    slot = Slot()
    src = {"a": torch.randn(50_000), "b": torch.randn(50_000), "c": torch.randn(50_000)}
    views = slot.prepare(src)
    arena = slot.arena
    assert arena is not None
    ahead = WriteAhead(backend, arena, list(views.values()), [True] * 3, target=64 * 1024, chunk_size=CHUNK)
    files: list[object] = []

    class Recording(ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
            files.extend(args)
            return super().submit(fn, *args, **kwargs)

    offsets = {n: v.data_ptr() - arena.data_ptr() for n, v in views.items()}
    with Recording(1) as pool:
        ahead.copied(0, pool)
        assert files == []
        slot.copy({"a": src["a"]}, {"a": views["a"]})
        ahead.copied(offsets["b"], pool)  # "a" is in place: its files that end before "b"
        first = list(files)
        assert first and all(f.extents[-1][1] <= offsets["b"] for f in first)  # type: ignore[attr-defined]
        ahead.copied(offsets["b"], pool)
        assert files == first  # never queued twice
        slot.copy({n: src[n] for n in "bc"}, {n: views[n] for n in "bc"})
        ahead.start(pool)  # the rest
        ahead.copied(arena.numel(), pool)  # after the start: nothing more
        assert len(files) == len({id(f) for f in files}) > len(first)
        taken = index_all(ahead, views)
        packs = ahead.seal()
    ahead.close()
    assert read_all(backend, packs) == taken and len(taken) == 3 * 13


def test_closing_after_an_early_start_waits_and_removes_the_files(backend: LocalBackend) -> None:
    slot = Slot()
    views = slot.stage({"a": torch.randn(50_000), "b": torch.randn(50_000)})
    arena = slot.arena
    assert arena is not None
    ahead = WriteAhead(backend, arena, list(views.values()), [True] * 2, target=64 * 1024, chunk_size=CHUNK)
    with ThreadPoolExecutor(1) as pool:
        ahead.copied(arena.numel(), pool)  # a copy that then failed: start never comes
        ahead.close()
        ahead.start(pool)  # closed: nothing
    assert not list(backend.staging_dir().glob("pack-*.tmp"))
