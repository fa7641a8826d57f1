"""Time from a commit durable to a follower updated / reading the new chunks' bytes: goal <= 1.5.

A writer process commits a bf16 model (``CKPT_FOLLOW_DELTAS=1``) with 1% of its elements changed
by one unit in the last place, every 0.5 s, and records the monotonic clock (system-wide) once
each commit is durable (``handle.wait()`` returned). This process follows the branch (``poll``
0.01 s) and records the clock when each update is applied. The floor is reading the same new
chunks the follower read (same locations, decoded against the same held bytes, verified, on the
same worker pool) with nothing else: no polling, catalog or copying into the model. The ratio is
the median over the updates; the pure I/O of those payloads (no decoding) is given beside.

    python benchmarks/bench_follow_latency.py [--quick]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

os.environ["CKPT_FOLLOW_DELTAS"] = "1"

import torch

import ckptrepo

POLL = 0.01


def _state(elements: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {f"layer{i}.w": (torch.randn(elements // 8 // 2048, 2048, generator=gen) * 0.02).to(torch.bfloat16)
            for i in range(8)}


def _writer(path: str, elements: int, updates: int, queue: mp.Queue, go: mp.Event) -> None:  # type: ignore[type-arg]
    torch.set_num_threads(1)
    state = _state(elements)
    gen = torch.Generator().manual_seed(1)
    with ckptrepo.Repo.open(path) as repo:
        go.wait()
        for _ in range(updates):
            time.sleep(0.5)
            for x in state.values():
                bits = x.view(torch.int16).view(-1)
                idx = torch.randperm(bits.numel(), generator=gen)[: bits.numel() // 100]
                bits[idx] += 1
            cid = repo.commit(state).wait().id
            queue.put((cid, time.monotonic()))
    queue.put(None)


def _floor(repo: ckptrepo.Repo, prev: str, new: str, held: dict[str, torch.Tensor]) -> tuple[float, float]:
    """Seconds to read and decode the chunks of ``new`` that ``prev`` lacks, against ``held``
    (prev's bytes), and seconds to read their payloads alone."""
    from ckptrepo.chunks.store import ChunkReader
    from ckptrepo.chunks.tensors import run_jobs
    from ckptrepo.db import catalog
    from ckptrepo.restore.layout import layout_of
    from ckptrepo.testing import parts

    p = parts(repo)
    _, _, old = layout_of(p.reading, prev)
    _, _, items = layout_of(p.reading, new)
    known, work = {}, []
    for name, (_, locs) in items.items():
        data = held[name].view(-1).view(torch.uint8).numpy().data
        offset = 0
        for i, loc in enumerate(locs):
            was = old[name][1][i]
            if was.chunk_id != loc.chunk_id:
                known[was.chunk_id] = data[offset : offset + was.raw_length]
                work.append(loc)
            offset += loc.raw_length
    reader = ChunkReader(p.backend, catalog.locator(p.sessions))
    outs = [memoryview(bytearray(loc.raw_length)) for loc in work]
    started = time.perf_counter()
    run_jobs(p.pool, len(work), lambda r: [reader.read_into(work[i], outs[i], {}, known=known) for i in r])
    decoded = time.perf_counter() - started
    from ckptrepo.chunks.pack import pack_key

    started = time.perf_counter()
    run_jobs(p.pool, len(work), lambda r: [p.backend.read_into(pack_key(work[i].pack_id), work[i].offset,
                                                               memoryview(bytearray(work[i].length))) for i in r])
    return decoded, time.perf_counter() - started


def run(quick: bool) -> list[tuple[str, float, str]]:
    elements = (8 if quick else 64) << 20
    updates = 4 if quick else 10
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="bench-follow-") as tmp:
        path = Path(tmp) / "r"
        with ckptrepo.Repo.init(path) as repo:
            repo.commit(_state(elements)).wait()
            into = {k: torch.empty_like(v) for k, v in _state(elements).items()}
            follower = repo.follow("main", into=into, poll=POLL, timeout=30)
            next(follower)
            queue, go = ctx.Queue(), ctx.Event()
            writer = ctx.Process(target=_writer, args=(str(path), elements, updates, queue, go))
            writer.start()
            latencies, floors, ios, moved = [], [], [], []
            go.set()
            for _ in range(updates):
                held = {k: v.clone() for k, v in into.items()}
                prev = follower.held
                commit = next(follower)
                applied = time.monotonic()
                cid, durable = queue.get(timeout=60)
                assert cid == commit.id and prev is not None and follower.last is not None
                latencies.append(applied - durable)
                moved.append(follower.last.bytes_read)
                decoded, io = _floor(repo, prev, cid, held)
                floors.append(decoded)
                ios.append(io)
            writer.join(timeout=60)
    lat, floor = statistics.median(latencies), statistics.median(floors)
    return [("follow.latency_vs_read", lat / floor,
             f"goal <= 1.5 (median of {updates}: commit durable -> applied {lat * 1e3:.1f} ms, reading and decoding "
             f"the same chunks {floor * 1e3:.1f} ms, their payloads' I/O alone {statistics.median(ios) * 1e3:.2f} ms; "
             f"{statistics.median(moved) / 2**20:.2f} MiB read per update; poll {POLL * 1e3:.0f} ms; "
             f"bf16 model of {elements / 2**20:.0f} Mi elements, 1% changed)"),
            ("follow.latency_ms", lat * 1e3, "info: median, commit durable -> follower updated")]


def main() -> None:
    from _common import report

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    report("bench_follow_latency", run(parser.parse_args().quick))


if __name__ == "__main__":
    main()
