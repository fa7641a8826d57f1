"""Following a branch (``Repo.follow``, ``restore/follow.py``): each new commit applied in place,
reading only the changed chunks; late and lagging followers in other processes end bit-exact;
damaged bytes never reach the follower's state; a lazy clone reads only the changed payloads."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from pathlib import Path

import pytest
import torch

import ckptrepo
from ckptrepo.chunks.pack import pack_key
from ckptrepo.errors import IntegrityError, StateMismatch
from ckptrepo.locations import ChunkLocation
from ckptrepo.restore.layout import layout_of
from ckptrepo.testing import assert_states_equal, parts

CHUNK = 64 << 10
STEPS = 6


def model_state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"layer.w": (torch.randn(256, 1024, generator=g) * 0.02).to(torch.bfloat16),  # 8 chunks
            "layer.b": torch.zeros(1024, dtype=torch.bfloat16),
            "head.w": (torch.randn(300, 500, generator=g) * 0.02).to(torch.bfloat16),
            "steps": torch.zeros(4, dtype=torch.int64)}


def small_update(state: dict[str, torch.Tensor], step: int, fraction: float = 0.01) -> None:
    """Change ``fraction`` of the elements of each weight by a small step, in place."""
    g = torch.Generator().manual_seed(1000 + step)
    for name in ("layer.w", "head.w"):
        flat = state[name].view(-1)
        idx = torch.randperm(flat.numel(), generator=g)[: max(1, int(flat.numel() * fraction))]
        flat[idx] = (flat[idx].float() * 1.01 + 1e-4).to(torch.bfloat16)
    state["steps"] += 1


def chunks_of(repo: ckptrepo.Repo, rev: str) -> dict[str, ChunkLocation]:
    """Every chunk of commit ``rev`` with its location, by id."""
    _, _, items = layout_of(parts(repo).reading, rev)
    return {loc.chunk_id: loc for _, locs in items.values() for loc in locs}


def blank_like(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: torch.empty_like(v) for k, v in state.items()}


@pytest.fixture
def follow_deltas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPT_FOLLOW_DELTAS", "1")


def test_follow_applies_each_commit_in_place_reading_only_deltas(tmp_path: Path, db_url: str,
                                                                 follow_deltas: None) -> None:
    state = model_state()
    with ckptrepo.Repo.init(tmp_path / "r", db_url=db_url, chunk_size=CHUNK) as repo:
        repo.commit(state, branch="main").wait()
        into = blank_like(state)
        objects = {k: (v, v.data_ptr()) for k, v in into.items()}
        follower = repo.follow("main", into=into, poll=0.01, timeout=0)
        first = next(follower)
        assert first.id == repo.resolve("main") and follower.last is not None
        assert follower.last.previous is None and follower.last.delta_chunks == 0
        full = follower.last.bytes_read
        assert_states_equal(into, repo.checkout("main"))
        for step in range(STEPS):
            small_update(state, step)
            commit = repo.commit(state, branch="main").wait()
            assert next(follower).id == commit.id
            update = follower.last
            assert update is not None and update.previous is not None and update.fallbacks == 0
            assert update.tensors_changed == 3  # layer.b unchanged: not read
            assert update.delta_chunks >= update.chunks_read - 1  # all but perhaps the int64 counter's chunk
            assert update.bytes_read < full / 4
            assert_states_equal(into, repo.checkout(commit.id))
        assert {k: (v, v.data_ptr()) for k, v in into.items()} == objects  # the same tensors, same memory
        assert list(follower) == []  # timeout 0: nothing new


def test_follow_since_a_commit_it_holds_and_into_a_module(tmp_path: Path, follow_deltas: None) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 8)).to(torch.bfloat16)
    with ckptrepo.Repo.init(tmp_path / "r", chunk_size=CHUNK) as repo:
        base = repo.commit(model).wait()
        twin = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 8)).to(torch.bfloat16)
        twin.load_state_dict(model.state_dict())
        weight = twin[0].weight
        follower = repo.follow("main", into=twin, since=base.id, timeout=0)
        assert list(follower) == []  # it holds the head already
        with torch.no_grad():
            model[0].weight[:3] += 1
        head = repo.commit(model).wait()
        assert next(follower).id == head.id and twin[0].weight is weight
        assert follower.last is not None and follower.last.tensors_changed == 1
        assert_states_equal(twin.state_dict(), repo.checkout("main"))
        with pytest.raises(StateMismatch):
            repo.follow("main", into={"other": torch.zeros(3)}, since=base.id)


def test_a_follower_whose_bytes_were_altered_falls_back_and_stays_exact(tmp_path: Path,
                                                                        follow_deltas: None) -> None:
    state = model_state()
    with ckptrepo.Repo.init(tmp_path / "r", chunk_size=CHUNK) as repo:
        repo.commit(state).wait()
        into = blank_like(state)
        follower = repo.follow("main", into=into, timeout=0)
        next(follower)
        into["layer.w"].view(-1)[5] += 1  # its bytes are no longer those of the chunk it claims
        small_update(state, 0)
        head = repo.commit(state).wait()
        next(follower)
        assert follower.last is not None and follower.last.fallbacks >= 1
        assert_states_equal(into, repo.checkout(head.id))


def test_a_damaged_delta_payload_never_reaches_the_follower(tmp_path: Path, follow_deltas: None) -> None:
    state = model_state()
    with ckptrepo.Repo.init(tmp_path / "r", chunk_size=CHUNK) as repo:
        first = repo.commit(state).wait()
        into = blank_like(state)
        follower = repo.follow("main", into=into, timeout=0)
        next(follower)
        small_update(state, 0)
        head = repo.commit(state).wait()
        _, _, items = layout_of(parts(repo).reading, head.id)
        loc = items["layer.w"][1][0]
        assert loc.base_id is not None  # stored as a delta against the parent's chunk
        path = Path(repo.repo_dir) / "store" / pack_key(loc.pack_id)
        data = bytearray(path.read_bytes())
        data[loc.offset + loc.length - 1] ^= 0xFF
        path.write_bytes(bytes(data))
        with pytest.raises(IntegrityError):
            next(follower)
        held = repo.checkout(first.id)
        assert_states_equal(into["layer.w"][:32], held["layer.w"][:32])  # chunk 0 kept its verified bytes
        assert follower.held == first.id


def test_stop_close_and_timeout_end_the_iteration(tmp_path: Path) -> None:
    with ckptrepo.Repo.init(tmp_path / "r") as repo:
        into = {"x": torch.zeros(8)}
        started = time.monotonic()
        assert list(repo.follow("nothing-yet", into=into, poll=0.01, timeout=0.2)) == []
        assert 0.2 <= time.monotonic() - started < 2
        stop = threading.Event()
        follower = repo.follow("main", into=into, poll=0.01, stop=stop)
        threading.Timer(0.2, stop.set).start()
        assert list(follower) == []
        follower = repo.follow("main", into=into, poll=0.01)
        repo.commit({"x": torch.ones(8)}).wait()
        assert next(follower).id == repo.resolve("main") and torch.equal(into["x"], torch.ones(8))
        threading.Timer(0.2, follower.close).start()
        assert list(follower) == []


def _follower_main(path: str, out: str, target_file: str, lag: float) -> None:
    torch.set_num_threads(1)
    state = blank_like(model_state())
    updates = []
    with ckptrepo.Repo.open(path) as repo:
        follower = repo.follow("main", into=state, poll=0.01, timeout=60)
        for commit in follower:
            assert follower.last is not None
            updates.append((follower.last.previous or "", commit.id))
            if len(updates) == 1:
                Path(out + ".ready").write_text(commit.id)
                time.sleep(lag)  # several commits land meanwhile
            target = Path(target_file)
            if target.exists() and target.read_text() == commit.id:
                break
    from safetensors.torch import save_file

    save_file(state, out)
    Path(out + ".updates").write_text("\n".join(f"{a} {b}".strip() for a, b in updates))


def _wait_for(path: Path, proc: mp.process.BaseProcess) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        assert proc.is_alive() and time.monotonic() < deadline, f"no {path.name}"
        time.sleep(0.05)


@pytest.mark.slow
def test_late_and_lagging_followers_in_other_processes_end_bit_exact(tmp_path: Path, db_url: str,
                                                                     follow_deltas: None) -> None:
    from safetensors.torch import load_file

    path, target = tmp_path / "r", tmp_path / "target"
    state = model_state()
    ctx = mp.get_context("spawn")
    with ckptrepo.Repo.init(path, db_url=db_url, chunk_size=CHUNK) as repo:
        ids = [repo.commit(state).wait().id]
        lagging = ctx.Process(target=_follower_main, args=(str(path), str(tmp_path / "lag"), str(target), 4.0))
        lagging.start()
        _wait_for(tmp_path / "lag.ready", lagging)  # it holds the first commit, then sleeps
        for step in range(3):
            small_update(state, step)
            ids.append(repo.commit(state).wait().id)
        late = ctx.Process(target=_follower_main, args=(str(path), str(tmp_path / "late"), str(target), 0.0))
        late.start()
        _wait_for(tmp_path / "late.ready", late)
        for step in range(3, 8):
            time.sleep(0.2)
            small_update(state, step)
            ids.append(repo.commit(state).wait().id)
        target.write_text(ids[-1])
        for proc in (lagging, late):
            proc.join(timeout=120)
            assert proc.exitcode == 0
        head = repo.checkout(ids[-1])
        for name in ("lag", "late"):
            assert_states_equal(load_file(tmp_path / name), head)
        lag = [line.split() for line in (tmp_path / "lag.updates").read_text().splitlines()]
        assert lag[0] == [ids[0]] and lag[-1][1] == ids[-1]
        assert ids.index(lag[1][1]) - ids.index(lag[1][0]) > 1  # from one commit straight to a later one
        late_updates = [line.split() for line in (tmp_path / "late.updates").read_text().splitlines()]
        assert len(late_updates[0]) == 1 and ids.index(late_updates[0][0]) >= 3  # joined late: the head, in full


@pytest.mark.slow
def test_follow_on_a_lazy_clone_reads_only_the_changed_payloads(tmp_path: Path, follow_deltas: None) -> None:
    state = model_state()
    remote = tmp_path / "remote"
    with ckptrepo.Repo.init(tmp_path / "a", chunk_size=CHUNK) as origin:
        origin.add_remote("origin", str(remote))
        origin.commit(state).wait()
        origin.push()
        with ckptrepo.Repo.clone(str(remote), tmp_path / "b") as clone:
            into = blank_like(state)
            follower = clone.follow("origin/main", into=into, poll=0.01, timeout=5)
            next(follower)
            for step in range(3):
                small_update(state, step)
                commit = origin.commit(state).wait()
                origin.push()
                assert next(follower).id == commit.id
                update = follower.last
                assert update is not None
                before = chunks_of(origin, update.previous or "")
                new = [loc for cid, loc in chunks_of(origin, commit.id).items() if cid not in before]
                assert update.bytes_read == sum(loc.length for loc in new)  # the payloads, nothing more
                assert update.chunks_read == len(new) and update.delta_chunks >= len(new) - 1
                assert_states_equal(into, origin.checkout(commit.id))
            assert not any(True for _ in parts(clone).backend.list("packs/"))  # nothing kept: read in place
