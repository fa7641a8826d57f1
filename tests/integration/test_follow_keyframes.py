"""Keyframes out of a follower's way (``CKPT_FOLLOW_DELTAS``, ``ingest.pipeline``): when a new
chunk's base is at ``max_delta_depth``, the base is stored again standalone in the commit's packs
(its catalog row moved there in the commit's transaction, ``db.catalog.relocate_chunks``) and the
chunk stored as a depth-1 delta, so a follower reads only deltas on every update, chains stay
bounded, and every commit reads back bit-exactly through verify, gc, repack, a database rebuilt
from the store and a commit that fails between its packs and its transaction."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ckptrepo
from ckptrepo import faults
from ckptrepo.db import catalog
from ckptrepo.faults import InjectedFault
from ckptrepo.locations import ChunkLocation
from ckptrepo.restore.layout import layout_of
from ckptrepo.testing import assert_states_equal, parts

CHUNK = 64 << 10
TRL_BYTES = 6  # int32 index + bf16 value per changed element


def model_state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"layer.w": (torch.randn(256, 1024, generator=g) * 0.02).to(torch.bfloat16),  # 8 chunks
            "head.w": (torch.randn(300, 500, generator=g) * 0.02).to(torch.bfloat16),  # 5 chunks
            "layer.b": torch.zeros(1024, dtype=torch.bfloat16)}


def one_percent(state: dict[str, torch.Tensor], step: int) -> int:
    """Change 1% of the weights' elements by one unit in the last place, in place; returns how many."""
    g = torch.Generator().manual_seed(1000 + step)
    changed = 0
    for name in ("layer.w", "head.w"):
        bits = state[name].view(torch.int16).view(-1)
        idx = torch.randperm(bits.numel(), generator=g)[: bits.numel() // 100]
        bits[idx] += 1
        changed += idx.numel()
    return changed


def chunks_of(repo: ckptrepo.Repo, rev: str) -> list[ChunkLocation]:
    _, _, items = layout_of(parts(repo).reading, rev)
    return [loc for _, locs in items.values() for loc in locs]


def locate(repo: ckptrepo.Repo, ids: list[str]) -> dict[str, ChunkLocation]:
    """The catalog's locations of chunks ``ids`` now."""
    with parts(repo).reading() as s:
        return catalog.chunks_by_id(s, sorted(ids))


def chain_length(repo: ckptrepo.Repo, loc: ChunkLocation) -> int:
    """Hops from ``loc`` down its delta chain as the catalog has it now (not the depth recorded)."""
    hops, at = 0, loc
    while at.base_id is not None:
        hops += 1
        at = locate(repo, [at.base_id])[at.base_id]
        assert hops <= 64
    return hops


def copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in state.items()}


@pytest.fixture(autouse=True)
def follow_deltas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPT_FOLLOW_DELTAS", "1")


def run(repo: ckptrepo.Repo, updates: int, depth: int) -> list[tuple[str, dict[str, torch.Tensor]]]:
    """Commit a model, then ``updates`` 1% updates with a follower after each: every update is
    read as deltas only, small, and leaves chains within ``depth``. Returns each commit and its state."""
    state = model_state()
    saved = [(repo.commit(state, branch="main").wait().id, copy(state))]
    into = {k: torch.empty_like(v) for k, v in state.items()}
    follower = repo.follow("main", into=into, poll=0.01, timeout=0)
    next(follower)
    assert follower.last is not None
    full = follower.last.bytes_read
    restored = 0
    for step in range(updates):
        changed = one_percent(state, step)
        parent = {loc.chunk_id: loc for loc in chunks_of(repo, "main")}
        commit = repo.commit(state, branch="main").wait()
        assert next(follower).id == commit.id
        update = follower.last
        assert update is not None and update.fallbacks == 0
        # No keyframe reads: every chunk read is a delta against what the follower holds, and
        # the update costs less than TRL's encoding of it (and far less than the state).
        assert update.chunks_read == 13 and update.delta_chunks == update.chunks_read, (step, update)
        assert update.bytes_read < 0.7 * TRL_BYTES * changed, (step, update.bytes_read, changed)
        assert update.bytes_read < full / 20
        assert_states_equal(into, state)
        locs = chunks_of(repo, commit.id)
        for loc in locs:
            assert loc.depth <= depth and chain_length(repo, loc) <= depth
        # Where the parent's chunk was at the bound, it is now stored standalone (relocated).
        full_bases = [cid for cid, loc in parent.items() if loc.depth == depth]
        if full_bases:
            now = locate(repo, full_bases)
            assert all(now[cid].depth == 0 and now[cid].base_id is None for cid in full_bases)
            assert all(loc.depth == 1 for loc in locs if loc.base_id in now)
            restored += 1
        saved.append((commit.id, copy(state)))
    assert restored == (updates - 1) // depth  # the bound was reached that many times, and never read whole
    return saved


def check_all(repo: ckptrepo.Repo, saved: list[tuple[str, dict[str, torch.Tensor]]]) -> None:
    for cid, state in saved:
        assert_states_equal(repo.checkout(cid), state)


def test_a_follower_never_reads_a_keyframe(tmp_path: Path, db_url: str) -> None:
    with ckptrepo.Repo.init(tmp_path / "r", db_url=db_url, chunk_size=CHUNK, max_delta_depth=3) as repo:
        saved = run(repo, 8, 3)
        check_all(repo, saved)
        report = repo.verify(full=True)
        assert report.ok, report


def test_follow_deltas_as_an_option_of_the_publishing_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Repo.open(..., follow_deltas=True)`` makes a process a publisher as the knob does, and
    ``follow_deltas=False`` overrides the knob."""
    monkeypatch.delenv("CKPT_FOLLOW_DELTAS")
    with ckptrepo.Repo.init(tmp_path / "r", chunk_size=CHUNK, max_delta_depth=3):
        pass
    with ckptrepo.Repo.open(tmp_path / "r", follow_deltas=True) as repo:
        check_all(repo, run(repo, 4, 3))
    monkeypatch.setenv("CKPT_FOLLOW_DELTAS", "1")
    with ckptrepo.Repo.init(tmp_path / "q", chunk_size=CHUNK, max_delta_depth=3, follow_deltas=False) as repo:
        state = model_state()
        repo.commit(state).wait()
        one_percent(state, 0)
        repo.commit(state).wait()  # asynchronous, not a publisher: stored raw for the repack
        assert {loc.encoding for loc in chunks_of(repo, "main") if loc.chunk_id not in
                {c.chunk_id for c in chunks_of(repo, "main~1")}} == {0}


@pytest.mark.slow
def test_twenty_updates_through_verify_gc_repack_and_rebuild(tmp_path: Path, db_url: str) -> None:
    path = tmp_path / "r"
    with ckptrepo.Repo.init(path, db_url=db_url, chunk_size=CHUNK) as repo:
        depth = 8  # the default max_delta_depth
        saved = run(repo, 2 * depth + 4, depth)
        check_all(repo, saved)
        assert repo.verify(full=True).ok
        repo.gc(grace=0)
        check_all(repo, saved)
        packed = repo.repack(compact_below=0.99)
        assert packed.chunks_copied > 0  # the old copies of relocated bases were garbage in their packs
        repo.gc(grace=0)
        check_all(repo, saved)
        report = repo.verify(full=True)
        assert report.ok and not report.warnings, report
    rebuilt = ckptrepo.Repo.rebuild_database(path, replace=True)
    assert rebuilt.ok, rebuilt
    with ckptrepo.Repo.open(path) as repo:
        check_all(repo, saved)
        for cid, _ in saved:
            for loc in chunks_of(repo, cid):
                assert chain_length(repo, loc) <= depth
        assert repo.verify(full=True).ok


def test_rebuild_takes_the_standalone_copy(tmp_path: Path, db_url: str) -> None:
    """Before any gc, a relocated base is in two packs: a rebuild indexes its standalone copy."""
    path = tmp_path / "r"
    with ckptrepo.Repo.init(path, db_url=db_url, chunk_size=CHUNK, max_delta_depth=2) as repo:
        saved = run(repo, 5, 2)
        before = {loc.chunk_id: loc for cid, _ in saved for loc in chunks_of(repo, cid)}
    assert ckptrepo.Repo.rebuild_database(path, replace=True).ok
    with ckptrepo.Repo.open(path) as repo:
        check_all(repo, saved)
        after = locate(repo, sorted(before))
        assert {cid: (loc.pack_id, loc.offset, loc.depth) for cid, loc in after.items()} == {
            cid: (loc.pack_id, loc.offset, loc.depth) for cid, loc in before.items()}
        assert repo.verify(full=True).ok


@pytest.mark.parametrize("point", ["commit.after_manifest", "db.before_commit"])
def test_a_failure_before_the_transaction_leaves_every_commit_exact(tmp_path: Path, db_url: str,
                                                                   point: str) -> None:
    """The commit that re-stores bases fails after its packs are durable (or inside its
    transaction): the bases keep their old rows, nothing of it is visible, and the next commits
    (which re-store them again) and a follower stay exact."""
    with ckptrepo.Repo.init(tmp_path / "r", db_url=db_url, chunk_size=CHUNK, max_delta_depth=2) as repo:
        saved = run(repo, 2, 2)  # the head's chunks are at depth 2: the next commit re-stores them
        head = {loc.chunk_id: loc for loc in chunks_of(repo, "main")}
        state = copy(saved[-1][1])
        one_percent(state, 100)
        with faults.inject(point, "raise"), pytest.raises(InjectedFault):
            repo.commit(state, branch="main").wait()
        assert repo.resolve("main") == saved[-1][0]
        assert locate(repo, sorted(head)) == head  # the old locations, unchanged
        check_all(repo, saved)
        report = repo.verify(full=True)
        assert report.ok, report
        into = copy(saved[0][1])
        follower = repo.follow("main", into=into, since=saved[0][0], poll=0.01, timeout=0)
        next(follower)
        commit = repo.commit(state, branch="main").wait()
        assert next(follower).id == commit.id and follower.last is not None
        assert follower.last.delta_chunks == follower.last.chunks_read
        assert_states_equal(into, state)
        assert all(locate(repo, [cid])[cid].depth == 0 for cid, loc in head.items() if loc.depth == 2)
        check_all(repo, [*saved, (commit.id, state)])
        repo.gc(grace=0)
        check_all(repo, [*saved, (commit.id, state)])
        assert repo.verify(full=True).ok


def test_a_lazy_clone_follower_reads_deltas_and_the_remote_keeps_chains_bounded(tmp_path: Path) -> None:
    """Pushed after every commit: a base stored again standalone is sent again (the remote's copy
    is deeper), so a follower on a lazy clone reads only deltas, that clone and a new clone of the
    remote find every chunk within the bound, and both read every commit exactly."""
    depth = 2
    remote = tmp_path / "remote"
    state = model_state()
    with ckptrepo.Repo.init(tmp_path / "a", chunk_size=CHUNK, max_delta_depth=depth) as origin:
        origin.add_remote("origin", str(remote))
        saved = [(origin.commit(state).wait().id, copy(state))]
        origin.push()
        with ckptrepo.Repo.clone(str(remote), tmp_path / "b") as clone:
            into = {k: torch.empty_like(v) for k, v in state.items()}
            follower = clone.follow("origin/main", into=into, poll=0.01, timeout=5)
            next(follower)
            for step in range(3 * depth + 1):
                changed = one_percent(state, step)
                commit = origin.commit(state).wait()
                origin.push()
                assert next(follower).id == commit.id and follower.last is not None
                assert follower.last.delta_chunks == follower.last.chunks_read == 13, (step, follower.last)
                assert follower.last.bytes_read < 0.7 * TRL_BYTES * changed
                assert_states_equal(into, state)
                saved.append((commit.id, copy(state)))
            # The clone that fetched at every poll moved its rows of re-stored bases to the remote's
            # standalone copies: its chains stay within the bound too, and it reads every commit.
            for cid, _ in saved:
                for loc in chunks_of(clone, cid):
                    assert chain_length(clone, loc) <= depth, cid
            check_all(clone, saved)
    with ckptrepo.Repo.clone(str(remote), tmp_path / "c") as fresh:
        check_all(fresh, saved)
        for cid, _ in saved:
            for loc in chunks_of(fresh, cid):
                assert chain_length(fresh, loc) <= depth


def test_a_full_clone_pulling_every_commit_keeps_chains_bounded_and_its_data_local(tmp_path: Path) -> None:
    """A clone with every byte here, pulling after each commit of a publisher: a base it holds
    whose row moves to the remote's standalone copy is copied here again, so its chains stay
    within the bound and every commit reads exactly with the remote gone."""
    depth = 2
    remote = tmp_path / "remote"
    state = model_state()
    with ckptrepo.Repo.init(tmp_path / "a", chunk_size=CHUNK, max_delta_depth=depth) as origin:
        origin.add_remote("origin", str(remote))
        saved = [(origin.commit(state).wait().id, copy(state))]
        origin.push()
        with ckptrepo.Repo.clone(str(remote), tmp_path / "b", data="full") as clone:
            updates = 3 * depth + 1
            for step in range(updates):
                one_percent(state, step)
                saved.append((origin.commit(state).wait().id, copy(state)))
                origin.push()
                # The last fetch brings no data: it moves rows of bases held here all the same.
                clone.fetch(data=step < updates - 1)
            for cid, _ in saved:
                for loc in chunks_of(clone, cid):
                    assert chain_length(clone, loc) <= depth, cid
    remote.rename(tmp_path / "gone")  # every byte of what was fetched with its data must be here
    with ckptrepo.Repo.open(tmp_path / "b") as clone:
        check_all(clone, saved[:-1])
