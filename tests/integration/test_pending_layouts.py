"""Pending layouts (``db.pending``): asynchronous commits on SQLite leave their tensor-level rows
pending; every reader sees them indexed, exactly as a commit that recorded them at once."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptrepo
from ckptrepo import faults
from ckptrepo.db import pending
from ckptrepo.errors import FormatError
from ckptrepo.locations import ChunkLocation
from ckptrepo.rows import TensorRow
from ckptrepo.testing import parts


def _pending(repo: ckptrepo.Repo) -> int:
    with parts(repo).sessions() as s:
        return pending.count(s)


def _states() -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
    """Six states of a small model: ``w`` (3 chunks of 64 KiB) changes in one chunk each time,
    ``b`` every time, ``frozen`` never; ``b`` is gone at step 3 and ``extra`` appears at step 4."""
    g = torch.Generator().manual_seed(5)
    w, b, frozen = torch.randn(3 * 16384, generator=g), torch.randn(10, generator=g), torch.randn(300, generator=g)
    for step in range(6):
        w[(step % 3) * 16384] += 1.0
        b += 1.0
        state = {"w": w.clone(), "frozen": frozen.clone()}
        if step != 3:
            state["b"] = b.clone()
        if step >= 4:
            state["extra"] = torch.full((7,), float(step))
        yield step, state


def _commit_all(repo: ckptrepo.Repo) -> tuple[list[str], dict[int, dict[str, torch.Tensor]]]:
    ids, states = [], {}
    for step, state in _states():
        states[step] = state
        ids.append(repo.commit(state, step=step, metrics={"loss": 1.0 / (step + 1)}).wait().id)
    return ids, states


def _history(repo: ckptrepo.Repo, name: str) -> list[Any]:
    return [(p.step, p.status, p.tensor, p.previous, p.chunks_changed, p.n_chunks) for p in repo.history(name)]


def test_async_commits_defer_their_layouts_and_reads_see_them_as_recorded_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repos = {}
    for kind in ("eager", "lazy"):
        monkeypatch.setenv("CKPT_DEFER_LAYOUTS", "0" if kind == "eager" else "1")
        repos[kind] = ckptrepo.Repo.init(tmp_path / kind, chunk_size=64 * 1024, idle_repack=False)
    try:
        out = {kind: _commit_all(repo) for kind, repo in repos.items()}
        assert _pending(repos["eager"]) == 0
        assert _pending(repos["lazy"]) == 6
        eager, lazy = repos["eager"], repos["lazy"]
        for (e_id, l_id) in zip(out["eager"][0], out["lazy"][0], strict=True):
            assert eager.tensors(e_id) == lazy.tensors(l_id)
        assert _pending(lazy) == 0  # the first read indexed them all
        for name in ("w", "b", "frozen", "extra"):
            assert _history(eager, name) == _history(lazy, name)
        e_ids, l_ids = out["eager"][0], out["lazy"][0]
        assert eager.diff(e_ids[0], e_ids[-1]).tensors == lazy.diff(l_ids[0], l_ids[-1]).tensors
        assert eager.stats().chunks == lazy.stats().chunks and eager.stats().tensors == lazy.stats().tensors
        for step, cid in enumerate(l_ids):
            restored = lazy.checkout(cid)
            assert restored.keys() == out["lazy"][1][step].keys()
            assert all(torch.equal(restored[k], v) for k, v in out["lazy"][1][step].items())
        assert lazy.verify(full=True).ok
    finally:
        for repo in repos.values():
            repo.close()


def test_every_database_records_what_it_reads(db_url: str, tmp_path: Path) -> None:
    """SQLite defers the layouts of asynchronous commits; PostgreSQL, whose writers run
    concurrently, records them with the commit."""
    with ckptrepo.Repo.init(tmp_path / "r", db_url=db_url, chunk_size=64 * 1024, idle_repack=False) as repo:
        ids, states = _commit_all(repo)
        assert _pending(repo) == (6 if db_url.startswith("sqlite") else 0)
        for step, cid in enumerate(ids):
            assert torch.equal(repo.load_tensor(cid, "w"), states[step]["w"])


def test_commit_sharing_chunks_beyond_its_parent_records_its_rows_at_once(tmp_path: Path) -> None:
    a, b = {"w": torch.arange(40_000, dtype=torch.float32)}, {"w": torch.zeros(40_000)}
    with ckptrepo.Repo.init(tmp_path, chunk_size=64 * 1024, idle_repack=False) as repo:
        first = repo.commit(a, step=0).wait()
        repo.commit(b, step=1).wait()
        assert _pending(repo) == 2
        third = repo.commit(a, step=2).wait()  # the store has its chunks, from the first commit
        assert _pending(repo) == 0
        assert repo.tensors(third.id) == repo.tensors(first.id)
        assert torch.equal(repo.load_tensor(third.id, "w"), a["w"])


def test_blocking_commit_and_branches_index_pending_layouts_first(tmp_path: Path) -> None:
    with ckptrepo.Repo.init(tmp_path, chunk_size=64 * 1024, idle_repack=False) as repo:
        ids, states = _commit_all(repo)
        assert _pending(repo) == 6
        blocking = repo.commit({"w": torch.ones(5)}, step=10, blocking=True).wait()
        assert _pending(repo) == 0
        repo.commit({"w": torch.full((5,), 2.0)}, step=11).wait()
        assert _pending(repo) == 1
        # A commit on another branch follows another parent than the commit recorded last.
        other = repo.commit({"w": torch.full((5,), 3.0)}, step=12, branch="other", parents=[ids[2]]).wait()
        assert _pending(repo) == 0
        assert torch.equal(repo.load_tensor(other.id, "w"), torch.full((5,), 3.0))
        assert torch.equal(repo.load_tensor(blocking.id, "w"), torch.ones(5))
        assert torch.equal(repo.load_tensor(ids[4], "extra"), states[4]["extra"])


def test_gc_indexes_pending_layouts_and_keeps_what_they_need(tmp_path: Path) -> None:
    with ckptrepo.Repo.init(tmp_path, chunk_size=64 * 1024, idle_repack=False) as repo:
        ids, states = _commit_all(repo)
        tmp = [repo.commit({"t": torch.full((20_000,), float(i))}, step=100 + i, branch="tmp").wait().id
               for i in range(2)]
        assert _pending(repo) == 8
        repo.delete_branch("tmp", force=True)
        report = repo.gc(grace=0)
        assert report.commits_removed == len(tmp) and _pending(repo) == 0
        for step, cid in enumerate(ids):
            restored = repo.checkout(cid)
            assert all(torch.equal(restored[k], v) for k, v in states[step].items())
        verified = repo.verify(full=True)
        assert verified.ok and not verified.unreferenced_packs


def test_a_read_retries_when_a_commit_defers_a_layout_before_its_snapshot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with ckptrepo.Repo.init(tmp_path, chunk_size=64 * 1024, idle_repack=False) as repo:
        repo.commit({"w": torch.zeros(10)}, step=0).wait()
        real, calls = pending.index_pending, []

        def index_then_commit(*args: Any, **kwargs: Any) -> int:
            n = real(*args, **kwargs)
            calls.append(n)
            if len(calls) == 1:  # another commit lands between indexing and the read's snapshot
                repo.commit({"w": torch.ones(10)}, step=1).wait()
            return n

        monkeypatch.setattr(pending, "index_pending", index_then_commit)
        infos = repo.tensors("main")
        assert calls == [1, 1] and len(infos) == 1
        assert torch.equal(repo.load_tensor("main", "w"), torch.ones(10))


def test_a_failed_indexing_leaves_the_layouts_pending(tmp_path: Path) -> None:
    with ckptrepo.Repo.init(tmp_path, chunk_size=64 * 1024, idle_repack=False) as repo:
        ids, states = _commit_all(repo)
        with faults.inject("db.index_pending", nth=3), pytest.raises(faults.InjectedFault):
            repo.tensors("main")
        assert _pending(repo) == 6  # one transaction for all six: rolled back whole
        assert torch.equal(repo.load_tensor(ids[5], "w"), states[5]["w"])
        assert _pending(repo) == 0


def test_payload_round_trip_and_damage() -> None:
    chunks = [ChunkLocation("a" * 64, "p" * 64, 0, 10, 12, 1, 1, "b" * 64, 11),
              ChunkLocation("c" * 64, "p" * 64, 10, 4, 4, 0)]
    stats = {"numel": 3, "mean": 0.1, "std": float("nan"), "min": -math.inf, "max": math.inf, "nan_count": 1}
    tensors = [TensorRow(tensor_id="t" * 64, dtype="float32", shape=[3], nbytes=12, chunk_size=65536,
                         chunk_ids=["a" * 64, "c" * 64], boxes=[[[0], [3]]], stats=stats)]
    back = pending.decode(pending.encode(chunks, tensors, {"x.w": "t" * 64}))
    assert back[0] == chunks and back[2] == {"x.w": "t" * 64}
    (t,) = back[1]
    assert (t.tensor_id, t.dtype, t.shape, t.nbytes, t.chunk_size, t.chunk_ids, t.boxes) == (
        "t" * 64, "float32", [3], 12, 65536, ["a" * 64, "c" * 64], [[[0], [3]]])
    assert math.isnan(t.stats["std"]) and t.stats["min"] == -math.inf and t.stats["mean"] == 0.1
    version_1 = {"v": 1, "chunks": [], "tensors": [["t" * 64, "float32", [3], 12, 65536, [], {}]], "entries": {}}
    (old,) = pending.decode(pending._compressor.compress(json.dumps(version_1).encode()))[1]
    assert old.boxes is None and old.chunk_size == 65536
    for junk in (b"junk", pending._compressor.compress(b'{"v": 99}'), pending._compressor.compress(b"[1]")):
        with pytest.raises(FormatError):
            pending.decode(junk)


def test_gc_indexes_more_pending_layouts_than_one_batch(tmp_path: Path) -> None:
    n = pending._BATCH + 6
    with ckptrepo.Repo.init(tmp_path, chunk_size=64 * 1024, idle_repack=False) as repo:
        ids = [repo.commit({"x": torch.full((16,), float(i))}, step=i).wait().id for i in range(n)]
        assert _pending(repo) == n
        assert repo.gc(grace=0).commits_removed == 0 and _pending(repo) == 0
        assert [repo.load_tensor(cid, "x")[0].item() for cid in ids] == [float(i) for i in range(n)]
        history = repo.history("x")
        assert [p.step for p in history] == list(reversed(range(n)))
        assert all(p.status == "changed" for p in history[:-1]) and history[-1].status == "added"
