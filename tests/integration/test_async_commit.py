"""Two-phase commit: phase 1 copies and returns, phase 2 makes the commit durable in order."""

from __future__ import annotations

import contextlib
import itertools
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import select

import ckptrepo
import ckptrepo.ingest.staging
from ckptrepo import errors, faults
from ckptrepo.ingest import pipeline
from ckptrepo.ingest.writeahead import WriteAhead
from ckptrepo.testing import parts


@pytest.fixture
def repo(tmp_path: Path) -> Any:
    with ckptrepo.Repo.init(tmp_path, chunk_size=64 * 1024) as r:
        yield r


def _slow_ingest(monkeypatch: pytest.MonkeyPatch, seconds: float) -> threading.Event:
    """Make phase 2 take at least ``seconds``; the event is set when a phase 2 starts."""
    started = threading.Event()
    real = pipeline.ingest

    def slow(*args: Any, **kwargs: Any) -> Any:
        started.set()
        time.sleep(seconds)
        return real(*args, **kwargs)

    monkeypatch.setattr("ckptrepo.ingest.writer.ingest", slow)
    return started


def test_state_may_change_once_commit_returns(repo: ckptrepo.Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    _slow_ingest(monkeypatch, 0.3)
    w = torch.randn(200_000)
    original = w.clone()
    handle = repo.commit({"w": w}, step=1)
    assert handle.staged and not handle.done()
    w.add_(1.0)  # training goes on while phase 2 runs
    commit = handle.wait()
    assert handle.done()
    assert torch.equal(repo.load_tensor(commit.id, "w"), original)
    assert commit.stall_s > 0 and commit.persist_s >= 0.3 and commit.wait_s >= 0


def test_conjugate_and_negative_views_commit_as_their_values(repo: ckptrepo.Repo) -> None:
    z = torch.randn(40_000, dtype=torch.complex64, generator=torch.Generator().manual_seed(3))
    state = {"conj": z.conj(), "neg": z.conj().imag, "plain": z.real}
    for blocking in (False, True):
        commit = repo.commit(state, blocking=blocking).wait()
        back = repo.checkout(commit.id)
        assert all(torch.equal(back[k], v.resolve_conj().resolve_neg()) for k, v in state.items())


def test_commits_persist_in_call_order_with_parents(repo: ckptrepo.Repo) -> None:
    handles = [repo.commit({"x": torch.full((1000,), float(i))}, step=i) for i in range(5)]
    commits = [h.wait() for h in handles]
    for prev, cur in itertools.pairwise(commits):
        assert cur.parent_ids == [prev.id]
    assert repo.resolve("main") == commits[-1].id
    assert [c.step for c in repo.log("main")] == [4, 3, 2, 1, 0]


def test_next_commit_waits_for_a_slot_and_records_it(repo: ckptrepo.Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    _slow_ingest(monkeypatch, 0.4)
    first = repo.commit({"w": torch.randn(1000)})
    second = repo.commit({"w": torch.randn(1000)})  # max_inflight=1: waits for the first
    assert first.done()
    assert second.wait().wait_s >= 0.2
    assert second.wait().stall_s >= second.wait().wait_s


def test_two_inflight_slots_overlap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started = _slow_ingest(monkeypatch, 0.4)
    with ckptrepo.Repo.init(tmp_path, max_inflight=2) as repo:
        first = repo.commit({"w": torch.randn(1000)})
        started.wait(5)
        second = repo.commit({"w": torch.randn(1000)})
        assert not first.done()  # the second staged without waiting for the first
        assert second.wait().wait_s < 0.2
        assert second.wait().parent_ids == [first.wait().id]


def test_background_failure_surfaces_on_wait_and_next_commit(repo: ckptrepo.Repo) -> None:
    good = repo.commit({"w": torch.randn(1000)}).wait()
    before = (repo.stats().commits, repo.resolve("main"))
    with faults.inject("pack.before_put"):
        handle = repo.commit({"w": torch.randn(100_000)})
        with pytest.raises(faults.InjectedFault):
            handle.wait()
    seen = repo.commit({"w": torch.randn(1000)}).wait()  # wait() re-raised it: not reported again
    assert seen.parent_ids == [good.id]
    with faults.inject("pack.before_put"):
        unseen = repo.commit({"w": torch.randn(100_000)})  # nobody waits for this one
        while not unseen.done():
            time.sleep(0.01)
    with pytest.raises(errors.CommitFailed) as exc:
        repo.commit({"w": torch.randn(10)})
    assert "injected fault" in str(exc.value)
    assert (repo.stats().commits, repo.resolve("main")) == (before[0] + 1, seen.id)
    after = repo.commit({"w": torch.randn(1000)}).wait()  # reported once, then commits go on
    assert after.parent_ids == [seen.id]


def test_a_dtype_refused_in_phase_2_surfaces_and_changes_nothing(repo: ckptrepo.Repo,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``commit()`` refuses the dtypes it cannot store before it returns; should a stage of
    phase 2 still refuse one (here the statistics, made to refuse float16), the error is
    the caller's on ``wait()`` or on the next ``commit()``, and nothing of that commit stays."""
    good = repo.commit({"w": torch.randn(1000)}).wait()
    real = pipeline.moments_of_bytes

    def refuse_half(raw: Any, dtype: str) -> Any:
        if dtype == "float16":
            raise errors.UnsupportedState(path="h", reason="no statistics for float16")
        return real(raw, dtype)

    monkeypatch.setattr(pipeline, "moments_of_bytes", refuse_half)
    state = {"w": torch.randn(1000), "h": torch.randn(200_000).half()}
    with pytest.raises(errors.UnsupportedState, match="float16"):
        repo.commit(state).wait()
    unseen = repo.commit(state)  # nobody waits for this one
    while not unseen.done():
        time.sleep(0.01)
    with pytest.raises(errors.CommitFailed, match="float16"):
        repo.commit({"w": torch.randn(10)})
    assert repo.resolve("main") == good.id and repo.stats().commits == 1
    assert repo.verify(full=True).ok
    monkeypatch.setattr(pipeline, "moments_of_bytes", real)
    after = repo.commit(state).wait()
    assert after.parent_ids == [good.id]
    assert torch.equal(repo.checkout(after.id)["h"], state["h"])


def test_blocking_commit_and_budget(tmp_path: Path) -> None:
    with ckptrepo.Repo.init(tmp_path, staging_budget=1 << 20) as repo:
        handle = repo.commit({"w": torch.randn(1000)}, blocking=True)
        assert handle.done()
        with pytest.raises(errors.UsageError, match="budget"):
            repo.commit({"w": torch.randn(1 << 20)})
        assert repo.stats().commits == 1


def test_close_flushes_pending_commits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _slow_ingest(monkeypatch, 0.3)
    repo = ckptrepo.Repo.init(tmp_path)
    handle = repo.commit({"w": torch.ones(10)}, message="pending")
    repo.close()
    assert handle.done()
    with ckptrepo.Repo.open(tmp_path) as again:
        assert again.get_commit("main").message == "pending"


def test_interpreter_exit_flushes_pending_commits(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import torch, ckptrepo
        repo = ckptrepo.Repo.init({str(tmp_path)!r})
        for i in range(3):
            repo.commit({{"w": torch.full((300_000,), float(i))}}, step=i)
        # no wait(), no close(): exit must still make every staged commit durable
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    with ckptrepo.Repo.open(tmp_path) as repo:
        assert [c.step for c in repo.log("main")] == [2, 1, 0]
        assert torch.equal(repo.load_tensor("main", "w"), torch.full((300_000,), 2.0))


def test_a_forked_child_refuses_the_parents_repository_and_exits_without_waiting(tmp_path: Path) -> None:
    # Phase 2 is held until the child has exited: the child inherits a commit in flight whose
    # thread it does not have. Its normal exit (exit hooks included) must not wait for it, and
    # the repository, its handle and close() must tell it to open its own instead.
    script = textwrap.dedent(
        f"""
        import os, sys, threading, time, torch, ckptrepo
        from ckptrepo import errors
        from ckptrepo.ingest import pipeline
        gate = threading.Event()
        real = pipeline.hash_bytes
        def held(data):
            gate.wait()
            return real(data)
        pipeline.hash_bytes = held
        repo = ckptrepo.Repo.init({str(tmp_path)!r})
        handle = repo.commit({{"w": torch.arange(1000.0)}}, step=1)
        pid = os.fork()
        if pid == 0:
            for call in (lambda: repo.commit({{"w": torch.zeros(3)}}), repo.log, handle.wait):
                try:
                    call()
                except errors.ForkedProcess as exc:
                    assert "Repo.open" in exc.hint, exc.hint
                else:
                    os._exit(3)
            repo.close()
            sys.exit(0)  # a normal exit: the exit hooks run
        deadline = time.monotonic() + 60
        while not (ended := os.waitpid(pid, os.WNOHANG))[0]:
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                sys.exit("the child did not exit")
            time.sleep(0.05)
        assert os.waitstatus_to_exitcode(ended[1]) == 0, ended
        gate.set()
        assert handle.wait().step == 1
        with ckptrepo.Repo.open({str(tmp_path)!r}) as again:
            again.commit({{"w": torch.ones(3)}}, step=2).wait()
        repo.close()
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=180)
    with ckptrepo.Repo.open(tmp_path) as repo:
        assert [c.step for c in repo.log("main")] == [2, 1]
        assert torch.equal(repo.load_tensor("main~1", "w"), torch.arange(1000.0))
        assert repo.verify(full=True).ok


def test_phase2_and_the_write_ahead_start_once_the_copy_has_ended(
    repo: ckptrepo.Repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Started during the copy, they took the interpreter lock from the copying thread (the
    # copy took twice as long under training): each must see every tensor copied already
    # (into an arena used before; a fresh one is the next test's).
    in_place = [0]  # this commit's tensors whose copy had begun
    real_point = faults.point

    def point(name: str) -> None:
        if name == "stage.copy":
            in_place[0] += 1
            time.sleep(0.02)  # a slow copy: time enough for an early phase 2 to show itself
        real_point(name)

    seen: list[tuple[str, int]] = []
    real_hash, real_write = pipeline._Ingest._hash_group, WriteAhead._write

    def hash_group(self: Any, group: list[Any]) -> Any:
        seen.append(("hash", in_place[0]))
        return real_hash(self, group)

    def write(self: WriteAhead, f: Any) -> None:
        seen.append(("write", in_place[0]))
        real_write(self, f)

    monkeypatch.setattr(faults, "point", point)
    monkeypatch.setattr(pipeline._Ingest, "_hash_group", hash_group)
    monkeypatch.setattr(WriteAhead, "_write", write)
    state = {"a": torch.randn(100_000), "b": torch.randn(50_000), "c": torch.randn(70_000)}
    repo.commit(state, step=0).wait()  # the previous commit decides what is written ahead
    for v in state.values():
        v.add_(1)
    expected = {k: v.clone() for k, v in state.items()}
    seen.clear()
    in_place[0] = 0
    handle = repo.commit(state, step=1)
    for v in state.values():
        v.zero_()
    commit = handle.wait()
    assert {kind for kind, _ in seen} == {"hash", "write"}
    assert all(n == len(state) for _, n in seen), seen  # the last tensor's copy had begun ...
    assert commit.stall_s >= 0.02 * len(state)  # ... and ended: commit() returned after it
    for name, value in expected.items():
        assert torch.equal(repo.load_tensor(commit.id, name), value)


def test_into_a_fresh_arena_files_are_written_as_soon_as_their_bytes_are_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first copy into an arena runs at the speed of page faults: the write-ahead starts
    # during it, each file once every byte it holds is in place, never before.
    copying = [0]  # tensors whose copy has begun
    real_point = faults.point

    def point(name: str) -> None:
        if name == "stage.copy":
            copying[0] += 1
            time.sleep(0.05)  # a slow copy: time enough for the early writes to run
        real_point(name)

    names = [f"t{i}" for i in range(6)]
    state = {n: torch.randn(64 * 1024) for n in names}  # 256 KiB each
    expected = {n: v.clone() for n, v in state.items()}
    early: list[int] = []
    real_write = WriteAhead._write

    def write(self: WriteAhead, f: Any) -> None:
        arena = self._arena  # every byte of the file's extents already holds the snapshot's
        begun = copying[0]
        assert f.extents[-1][1] <= arena.numel()
        for n, view in staged.items():
            lo = view.data_ptr() - arena.data_ptr()
            if any(lo < b and a < lo + view.numel() * 4 for a, b in f.extents):
                assert torch.equal(view, expected[n]), (n, f.extents)
        early.append(begun)
        real_write(self, f)

    staged: dict[str, torch.Tensor] = {}
    real_copy = ckptrepo.ingest.staging.Slot.copy

    def copy(self: Any, tensors: Any, out: Any, progress: Any = None) -> None:
        staged.update(out)
        real_copy(self, tensors, out, progress)

    monkeypatch.setattr(faults, "point", point)
    monkeypatch.setattr(WriteAhead, "_write", write)
    monkeypatch.setattr(ckptrepo.ingest.staging.Slot, "copy", copy)
    with ckptrepo.Repo.init(tmp_path, chunk_size=64 * 1024, pack_target=256 * 1024) as repo:
        handle = repo.commit(state, step=0)
        for v in state.values():
            v.zero_()  # staged: the caller's tensors are its own again
        commit = handle.wait()
        assert len(early) >= 5 and min(early) < len(names)  # some files were written during the copy
        for n in names:
            assert torch.equal(repo.load_tensor(commit.id, n), expected[n])
        assert repo.verify(full=True).ok


def test_phase2_finds_the_write_ahead_started_however_late_the_caller_runs(
    repo: ckptrepo.Repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A caller thread descheduled right after the copy (two busy cores) must not let phase 2
    # seal the write-ahead before its writes were started: that failed the commit.
    real_start = WriteAhead.start

    def late_start(self: WriteAhead, executor: Any) -> None:
        time.sleep(0.3)  # longer than phase 2 of this small state takes
        real_start(self, executor)

    monkeypatch.setattr(WriteAhead, "start", late_start)
    state = {f"t{i}": torch.randn(20_000) for i in range(4)}
    repo.commit(state, step=0).wait()
    for v in state.values():
        v.add_(1)  # changed: written ahead
    commit = repo.commit(state, step=1).wait()
    assert commit.new_bytes == sum(v.numel() * 4 for v in state.values())
    for name, value in state.items():
        assert torch.equal(repo.load_tensor(commit.id, name), value)


def test_reserve_maps_the_staging_memory_before_the_first_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    early: list[int] = []
    real_copied = WriteAhead.copied

    def copied(self: WriteAhead, below: int, executor: Any) -> None:
        early.append(below)
        real_copied(self, below, executor)

    monkeypatch.setattr(WriteAhead, "copied", copied)
    state = {"model": {"w": torch.randn(300, 200), "b": torch.randn(200)}, "step": torch.tensor(3)}
    with ckptrepo.Repo.init(tmp_path, chunk_size=64 * 1024) as repo:
        nbytes = repo.reserve(state)
        assert nbytes >= (300 * 200 + 200) * 4
        slot = parts(repo).writer.snapshots().staging._free[0]
        arena = slot.arena
        assert arena is not None and not slot.fresh
        assert repo.stats().commits == 0  # nothing stored
        commit = repo.commit(state, step=1).wait()
        assert slot.arena is arena  # the first commit copied into the reserved memory ...
        assert early == []  # ... as into a mapped arena: the write-ahead after the copy
        assert torch.equal(repo.load_tensor(commit.id, "model/w"), state["model"]["w"])
        with pytest.raises(errors.UnsupportedState):
            repo.reserve({"f": lambda: 0})
    with ckptrepo.Repo.init(tmp_path / "small", staging_budget=4096) as repo, pytest.raises(
        errors.UsageError, match="budget"
    ):
        repo.reserve(state)


def _unchanged_then_commits(repo: ckptrepo.Repo, first: Any, before: dict[str, int],
                            state: dict[str, torch.Tensor]) -> None:
    """After a commit that failed in its copy: the branch, the stats and the store are as before,
    and (the failure reported once, by the raise) the next commit goes through and takes the slot."""
    assert repo.resolve("main") == first.id
    assert repo.stats() == before
    assert repo.verify().ok
    second = repo.commit(state, step=2).wait()
    assert second.parent_ids == [first.id]
    assert torch.equal(repo.load_tensor(second.id, "t4"), state["t4"])


def test_a_failed_snapshot_copy_stores_nothing(repo: ckptrepo.Repo) -> None:
    first = repo.commit({"w": torch.randn(100_000)}, step=0).wait()
    before = repo.stats()
    state = {f"t{i}": torch.randn(60_000) for i in range(5)}
    with faults.inject("stage.copy", nth=3), pytest.raises(faults.InjectedFault):
        repo.commit(state, step=1)
    _unchanged_then_commits(repo, first, before, state)


def test_a_copy_failing_after_early_writes_leaves_the_repository_and_store_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Into a fresh arena some files are written while the copy runs; a copy that then fails
    # must wait for those writes and delete their files before the slot goes to the next commit.
    written: list[int] = []
    real_write = WriteAhead._write

    def write(self: WriteAhead, f: Any) -> None:
        real_write(self, f)
        written.append(1)

    monkeypatch.setattr(WriteAhead, "_write", write)
    with ckptrepo.Repo.init(tmp_path, chunk_size=64 * 1024, pack_target=256 * 1024) as repo:
        first = repo.commit({"w": torch.randn(1000)}, step=0).wait()
        before = repo.stats()
        state = {f"t{i}": torch.randn(64 * 1024) for i in range(6)}  # a larger arena: fresh
        with faults.inject("stage.copy", nth=5), pytest.raises(faults.InjectedFault):
            repo.commit(state, step=1)
        assert written  # the files of the tensors copied before the failure were written
        assert not list(parts(repo).backend.staging_dir().glob("pack-*.tmp"))
        assert repo.resolve("main") == first.id
        assert repo.stats() == before
        report = repo.verify()
        assert report.ok and not report.temporary_files
        second = repo.commit(state, step=2).wait()
        assert torch.equal(repo.load_tensor(second.id, "t5"), state["t5"])


def test_a_write_ahead_failing_to_start_leaves_the_repository_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Starting the writes is the last step before phase 2 is queued: when it fails, the
    # commit must close the write-ahead and give its staging slot back (max_inflight=1: the
    # next commit would wait for that slot forever otherwise).
    real_start = WriteAhead.start

    def start(self: WriteAhead, executor: Any) -> None:
        real_start(self, executor)
        raise faults.InjectedFault("write-ahead start")

    with ckptrepo.Repo.init(tmp_path, chunk_size=64 * 1024, pack_target=256 * 1024, max_inflight=1) as repo:
        first = repo.commit({"w": torch.randn(1000)}, step=0).wait()
        before = repo.stats()
        state = {f"t{i}": torch.randn(64 * 1024) for i in range(6)}
        with monkeypatch.context() as patch:
            patch.setattr(WriteAhead, "start", start)
            with pytest.raises(faults.InjectedFault):
                repo.commit(state, step=1)
        assert not list(parts(repo).backend.staging_dir().glob("pack-*.tmp"))
        assert repo.resolve("main") == first.id
        assert repo.stats() == before
        assert repo.verify().ok
        second = repo.commit(state, step=2).wait(timeout=60)
        assert torch.equal(repo.load_tensor(second.id, "t5"), state["t5"])


def test_a_failed_ingest_leaves_no_job_reading_the_snapshot(
    repo: ckptrepo.Repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Once a commit has failed, its staging slot goes to the next commit: no hashing or
    # encoding job of the failed one may still be running (or start) by then.
    running = 0
    lock = threading.Lock()
    real_hash = pipeline._Ingest._hash_group

    def slow_hash(self: Any, *args: Any) -> Any:
        nonlocal running
        with lock:
            running += 1
        try:
            time.sleep(0.01)
            return real_hash(self, *args)
        finally:
            with lock:
                running -= 1

    monkeypatch.setattr(pipeline._Ingest, "_hash_group", slow_hash)
    state = {f"t{i}": torch.randn(64 * 1024) for i in range(40)}  # 4 chunks of 64 KiB each
    with faults.inject("ingest.chunk", nth=5):
        handle = repo.commit(state, step=1)
        with pytest.raises(faults.InjectedFault):
            handle.wait()
        assert running == 0
    assert repo.verify().ok


def _write_ahead_packs(repo: ckptrepo.Repo) -> int:
    """Packs whose payloads start after a header page: those the write-ahead made."""
    from ckptrepo.chunks.pack import read_index
    from ckptrepo.chunks.store import pack_key
    from ckptrepo.db.models import Pack

    with parts(repo).sessions() as s:
        ids = [str(p) for p in s.scalars(select(Pack.id))]
    return sum(min(e.offset for e in read_index(parts(repo).backend, pack_key(p))) >= 4096 for p in ids)


@pytest.mark.parametrize("write_ahead", ["1", "0"])
def test_raw_chunks_written_ahead_restore_whatever_the_prediction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_ahead: str
) -> None:
    # The write-ahead takes every tensor the previous commit did not find unchanged; a
    # tensor that changes after an unchanged commit goes through the ordinary packs, one
    # that stops changing leaves unindexed bytes behind. Every commit restores bit-exactly.
    monkeypatch.setenv("CKPT_WRITE_AHEAD", write_ahead)
    g = torch.Generator().manual_seed(3)
    state = {"moving": torch.randn(150_000, generator=g), "frozen": torch.randn(90_000, generator=g),
             "late": torch.randn(70_000, generator=g).half(), "tiny": torch.arange(5)}
    snapshots: list[tuple[str, dict[str, torch.Tensor]]] = []
    with ckptrepo.Repo.init(tmp_path, chunk_size=64 * 1024, pack_target=256 * 1024) as repo:
        for i in range(5):
            commit = repo.commit(state, step=i).wait()
            snapshots.append((commit.id, {k: v.clone() for k, v in state.items()}))
            state["moving"] += 1
            if i >= 2:
                state["late"] += 1  # unchanged in commits 1 and 2, then new
        assert (_write_ahead_packs(repo) > 0) == (write_ahead == "1")
        for cid, expected in snapshots:
            restored = repo.checkout(cid)
            assert all(torch.equal(restored[k], v) for k, v in expected.items()), cid
        assert repo.verify(full=True).ok
        repo.repack()
        for cid, expected in snapshots:
            restored = repo.checkout(cid)
            assert all(torch.equal(restored[k], v) for k, v in expected.items()), cid
        assert repo.verify(full=True).ok


def test_statistics_taken_by_the_copy_are_those_phase_2_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Into a mapped arena the snapshot copy takes the float tensors' chunk statistics in its pass
    over memory (``Slot.copy_summarized``) and phase 2 only hashes them; with ``CKPT_COPY_STATS=0``
    phase 2 takes them all. Both store the same tensors (same ids) with the same statistics, up
    to rounding; the other dtypes and views go through phase 2 either way."""
    g = torch.Generator().manual_seed(9)
    w = torch.randn(300_000, generator=g) * 2 - 1
    w[5], w[250_000] = float("nan"), float("inf")
    state = {"w": w, "f64": torch.randn(5000, generator=g, dtype=torch.float64),
             "bf16": torch.randn(70_000, generator=g).bfloat16(), "ids": torch.arange(4000),
             "strided": torch.randn(100, 30, generator=g).t(), "step": torch.tensor(7.0)}
    summaries: list[Any] = []
    real_ingest = pipeline.ingest

    def ingest(*args: Any, **kwargs: Any) -> Any:
        summaries.append(kwargs.get("summaries"))
        return real_ingest(*args, **kwargs)

    monkeypatch.setattr("ckptrepo.ingest.writer.ingest", ingest)
    found = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("CKPT_COPY_STATS", flag)
        with ckptrepo.Repo.init(tmp_path / flag, chunk_size=64 * 1024) as repo:
            repo.commit(state, step=0).wait()  # into a fresh arena: copied by torch's kernel
            summaries.clear()
            commit = repo.commit(state, step=1).wait()
            found[flag] = {i.name: i for i in repo.tensors(commit.id)}
            for name, value in state.items():
                got = repo.load_tensor(commit.id, name)
                assert got.shape == value.shape and got.reshape(-1).view(torch.uint8).tolist() == \
                    value.contiguous().reshape(-1).view(torch.uint8).tolist(), name
        taken = summaries[0]
        if flag == "1":
            # w: 19 chunks of 64 KiB, f64 1, bf16 3, step 1; ids and strided: none
            assert taken is not None and sum(m is not None for m in taken) == 24 and len(taken) == 26
        else:
            assert taken is None
    for name, a in found["1"].items():
        b = found["0"][name]
        assert a.tensor_id == b.tensor_id, name
        for key in ("numel", "nan_count", "inf_count", "min", "max"):
            assert getattr(a.stats, key) == getattr(b.stats, key), (name, key)
        for key in ("mean", "std", "l2_norm"):
            assert getattr(a.stats, key) == pytest.approx(getattr(b.stats, key), rel=1e-9, abs=1e-12), (name, key)


@pytest.mark.parametrize("where", ["a tensor's copy", "the helper's share"])
def test_a_failed_summarized_copy_stores_nothing(repo: ckptrepo.Repo, monkeypatch: pytest.MonkeyPatch,
                                                 where: str) -> None:
    """Into a mapped arena the copy takes the statistics (``Slot.copy_summarized``): a failure
    there, on this thread or the worker's share, is raised by ``commit()``, stores nothing,
    and the next commit goes through."""
    from ckptrepo.ingest import staging

    state = {f"t{i}": torch.randn(60_000) for i in range(5)}
    first = repo.commit(state, step=0).wait()  # maps the arena: the next copies are summarized
    before = repo.stats()
    if where == "a tensor's copy":
        failing = faults.inject("stage.copy", nth=3)
        expected: type[BaseException] = faults.InjectedFault
    else:
        real = staging.copy_moments_many
        caller, helping = threading.get_ident(), threading.Event()

        def broken(pairs: Any) -> Any:
            if threading.get_ident() != caller:
                helping.set()
                raise OSError("the helper's share failed")
            helping.wait(5)  # else the caller, done first, takes the helper's share itself
            return real(pairs)

        monkeypatch.setattr(staging, "copy_moments_many", broken)
        failing = contextlib.nullcontext()
        expected = OSError
    with failing, pytest.raises(expected):
        repo.commit({k: v + 1 for k, v in state.items()}, step=1)
    monkeypatch.undo()
    _unchanged_then_commits(repo, first, before, state)
