"""Write-ahead layout: for any tensors, chunk size and pack target, every chunk of a tensor
written ahead reads back bit-exactly from the sealed packs, and no other chunk is taken."""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptrepo.chunks.chunker import chunk_spans
from ckptrepo.chunks.store import ChunkReader
from ckptrepo.ids import hash_bytes
from ckptrepo.ingest.staging import Slot
from ckptrepo.ingest.writeahead import WriteAhead
from ckptrepo.state import tensor_bytes
from ckptrepo.storage import LocalBackend

PROFILE = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DTYPES = [torch.uint8, torch.float16, torch.float32, torch.float64]

tensor_specs = st.lists(
    st.tuples(st.integers(0, 30_000), st.sampled_from(DTYPES), st.booleans()), min_size=1, max_size=6)


@PROFILE
@given(specs=tensor_specs, chunk_kib=st.sampled_from([4, 8, 12, 64]), target_chunks=st.integers(1, 5))
def test_every_written_chunk_reads_back(specs: list[tuple[int, torch.dtype, bool]], chunk_kib: int,
                                        target_chunks: int) -> None:
    chunk = chunk_kib * 1024
    g = torch.Generator().manual_seed(len(specs))
    state = {f"t{i}": torch.randint(0, 255, (n * dt.itemsize,), dtype=torch.uint8, generator=g).view(dt)
             for i, (n, dt, _) in enumerate(specs)}
    slot = Slot()
    views = slot.stage(state)
    assert slot.arena is not None
    with tempfile.TemporaryDirectory() as tmp:
        backend = LocalBackend(Path(tmp))
        ahead = WriteAhead(backend, slot.arena, list(views.values()), [w for _, _, w in specs],
                           target=target_chunks * chunk, chunk_size=chunk)
        expected: dict[str, bytes] = {}
        with ThreadPoolExecutor(1) as pool:
            ahead.start(pool)
            for i, ((_, _, written), t) in enumerate(zip(specs, views.values(), strict=True)):
                data = tensor_bytes(t)
                for off, ln in chunk_spans(len(data), t.element_size(), chunk):
                    cid = hash_bytes(data[off : off + ln])
                    if cid in expected:  # the same bytes again: indexed once, as ingest does
                        continue
                    took = ahead.add(i, off, cid, ln)
                    assert took == (written and ln > 0)
                    if took:
                        expected[cid] = bytes(data[off : off + ln])
            packs = ahead.seal()
        ahead.close()
        reader = ChunkReader(backend)
        got = {loc.chunk_id: reader.read(loc) for p in packs for loc in p.locations}
        assert got == expected
        assert not list(backend.staging_dir().iterdir())
