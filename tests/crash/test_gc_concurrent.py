"""``gc --grace 0`` in a loop beside processes that commit: no acknowledged commit loses a byte.

Three writer processes commit (asynchronous commits with write-ahead and a background repack,
alternating with blocking ones) to two branches while a fourth runs ``gc(grace=0)`` in a loop,
on SQLite and PostgreSQL. Before leases (``ledger.leases``) such a gc deleted the packs and
manifests of commits between their write and their transaction, and acknowledged commits
pointed at missing packs. Afterwards every commit a writer saw acknowledged restores
bit-exactly, verify is clean, and no lease is left.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import torch

import ckptrepo

WRITERS = 3
COMMITS = 8
CHUNK = 64 * 1024


def state_of(writer: int, i: int) -> dict[str, torch.Tensor]:
    """Eight new chunks per commit, and a tensor every commit of a writer shares."""
    fresh = torch.randn(8 * CHUNK // 4, generator=torch.Generator().manual_seed(1000 * writer + i))
    shared = torch.randn(2 * CHUNK // 4, generator=torch.Generator().manual_seed(writer))
    return {"fresh": fresh, "shared": shared, "step": torch.tensor(i)}


def writer_main(path: str, writer: int, out: str) -> None:
    torch.set_num_threads(1)
    os.environ["CKPT_IDLE_REPACK"] = "1"  # the background repack runs between the commits too
    acked = []
    with ckptrepo.Repo.open(path) as repo:
        for i in range(COMMITS):
            commit = repo.commit(state_of(writer, i), branch=f"b{writer % 2}", step=i, blocking=i % 3 == 2).wait()
            acked.append(f"{i} {commit.id}")
    Path(out).write_text("\n".join(acked))


def gc_main(path: str, stop: str, out: str) -> None:
    runs = kept = 0
    with ckptrepo.Repo.open(path) as repo:
        while not Path(stop).exists():
            kept += repo.gc(grace=0).leased_objects_kept
            runs += 1
    Path(out).write_text(f"{runs} {kept}")


def test_gc_with_grace_0_beside_writers_loses_no_acknowledged_commit(tmp_path: Path, db_url: str) -> None:
    path = tmp_path / "repo"
    with ckptrepo.Repo.init(path, db_url=db_url, chunk_size=CHUNK, pack_target=4 * CHUNK) as repo:
        root = repo.commit({"step": torch.tensor(-1)}, blocking=True).wait()
        repo.branch("b0", root.id)
        repo.branch("b1", root.id)
    ctx = mp.get_context("spawn")
    stop = tmp_path / "stop"
    collector = ctx.Process(target=gc_main, args=(str(path), str(stop), str(tmp_path / "gc.txt")))
    collector.start()
    writers = [ctx.Process(target=writer_main, args=(str(path), w, str(tmp_path / f"acked-{w}.txt")))
               for w in range(WRITERS)]
    for p in writers:
        p.start()
    for p in writers:
        p.join(timeout=600)
    stop.touch()
    collector.join(timeout=300)
    assert [p.exitcode for p in writers] == [0] * WRITERS and collector.exitcode == 0
    runs, kept = (int(x) for x in (tmp_path / "gc.txt").read_text().split())
    print(f"gc runs beside the writers: {runs}; objects they kept for a lease: {kept}")
    assert runs >= 3
    with ckptrepo.Repo.open(path) as repo:
        for w in range(WRITERS):
            lines = (tmp_path / f"acked-{w}.txt").read_text().splitlines()
            assert len(lines) == COMMITS
            for line in lines:
                i, cid = line.split()
                got, want = repo.checkout(cid), state_of(w, int(i))
                assert all(torch.equal(got[k], v) for k, v in want.items()), (w, i)
        report = repo.verify(full=True)
        assert report.ok, report.to_json()
        repo.gc(grace=0)
        report = repo.verify(full=True)
        assert report.ok and not report.warnings, report.to_json()
    assert not list((path / ".ckpt" / "store" / "leases").glob("*"))
