"""Repository end to end through the Python API, on every database the suite runs against."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ckptrepo
from ckptrepo import errors
from ckptrepo.chunks.pack import parse_index
from ckptrepo.testing import assert_states_equal, parts


@pytest.fixture
def repo(tmp_path: Path, db_url: str) -> Any:
    with ckptrepo.Repo.init(tmp_path / "work", db_url=db_url, chunk_size=64 * 1024) as r:
        yield r


def _store_bytes(repo: ckptrepo.Repo) -> int:
    return sum(p.stat().st_size for p in (repo.repo_dir / "store").rglob("*.pack"))


def _training_state() -> dict[str, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 16)).pow(2).mean().backward()
        opt.step()
        sched.step()
    return {"model": model, "optim": opt, "sched": sched}


def test_commit_checkout_round_trip_into_live_objects(repo: ckptrepo.Repo) -> None:
    live = _training_state()
    commit = repo.commit(live, step=3, metrics={"loss": 1.5}, message="first").wait()
    assert len(commit.id) == 64 and commit.step == 3 and commit.metrics == {"loss": 1.5}
    assert 0 < commit.new_bytes <= commit.logical_bytes  # identical chunks (AdamW step counters) stored once
    restored = repo.checkout(commit.id)
    want = live["model"].state_dict()
    assert_states_equal(restored["model"], want)
    fresh = _training_state()
    with torch.no_grad():
        for p in fresh["model"].parameters():
            p.add_(1.0)
    repo.checkout("main", into=fresh)
    assert_states_equal(fresh["model"].state_dict(), want)
    assert fresh["optim"].state_dict()["state"][0]["step"] == live["optim"].state_dict()["state"][0]["step"]
    assert fresh["sched"].state_dict() == live["sched"].state_dict()


def _count_chunk_reads(repo: ckptrepo.Repo, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the chunks the repository reads from now on, in order."""
    calls: list[str] = []
    original = parts(repo).reader.read_into

    def counting(loc: Any, out: memoryview, bases: Any = None) -> None:
        calls.append(loc.chunk_id)
        original(loc, out, bases)

    monkeypatch.setattr(parts(repo).reader, "read_into", counting)
    return calls


def test_load_tensor_reads_only_its_chunks(repo: ckptrepo.Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    state = {"big": torch.randn(100_000), "small": torch.arange(10)}
    repo.commit(state).wait()
    calls = _count_chunk_reads(repo, monkeypatch)
    got = repo.load_tensor("main", "small")
    assert torch.equal(got, state["small"]) and len(calls) == 1
    info = {i.name: i for i in repo.tensors("main")}
    assert info["big"].n_chunks == 7 and info["big"].shape == (100_000,)
    assert abs(info["big"].stats.mean - float(state["big"].mean())) < 1e-5  # type: ignore[operator]
    with pytest.raises(errors.UnknownTensor):
        repo.load_tensor("main", "nope")


def test_checkout_of_a_part_reads_only_its_tensors(repo: ckptrepo.Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    state = {"model": {"w": torch.randn(100_000), "b": torch.arange(3)}, "ranks": {1: {"rng": torch.arange(5)},
             "a/b": {"n": 7, "t": (torch.ones(2), "x")}}, "step": 4}
    repo.commit(state).wait()
    calls = _count_chunk_reads(repo, monkeypatch)
    rng = repo.checkout("main", part="ranks/1")  # an int key, named as entry names write it
    assert rng.keys() == {"rng"} and torch.equal(rng["rng"], torch.arange(5)) and len(calls) == 1
    odd = repo.checkout("main", part="ranks/a%2Fb")  # a "/" in a key is escaped
    assert odd["n"] == 7 and torch.equal(odd["t"][0], torch.ones(2)) and odd["t"][1] == "x"
    assert repo.checkout("main", part="step") == 4
    into = {"b": torch.zeros(3, dtype=torch.int64)}
    repo.checkout("main", part="model", into=into)
    assert torch.equal(into["b"], torch.arange(3))
    with pytest.raises(errors.UsageError, match="at that level it has: 'w', 'b'"):
        repo.checkout("main", part="model/nope")
    with pytest.raises(errors.UsageError, match="is not a dict"):
        repo.checkout("main", part="step/x")


def test_same_state_again_adds_almost_nothing(repo: ckptrepo.Repo) -> None:
    state = {"w": torch.randn(1 << 20), "b": torch.randn(1000)}
    first = repo.commit(state).wait()
    before = _store_bytes(repo)
    again = repo.commit(state, message="again").wait()
    repo.branch("other", at=first.id)
    other = repo.commit(state, branch="other").wait()
    assert again.new_bytes == 0 and other.new_bytes == 0
    assert _store_bytes(repo) - before < 0.001 * first.logical_bytes


def test_one_changed_region_stores_that_region_only(tmp_path: Path) -> None:
    # Default 1 MiB chunks, a 256 MiB tensor: changing one aligned 1 MiB region adds one chunk.
    with ckptrepo.Repo.init(tmp_path, compression=False) as repo:
        big = torch.randn(64 << 20)  # 256 MiB of fp32
        repo.commit({"emb": big}).wait()
        big[(100 << 20) // 4 : (101 << 20) // 4] += 1.0
        aligned = repo.commit({"emb": big}).wait()
        assert aligned.new_bytes == 1 << 20
        big[(50 << 20) // 4 + 1000 : (51 << 20) // 4 + 1000] -= 1.0  # straddles two chunks
        straddling = repo.commit({"emb": big}).wait()
        assert straddling.new_bytes == 2 << 20
        assert_states_equal(repo.load_tensor("main", "emb"), big)
        assert_states_equal(repo.load_tensor("main~2", "emb")[: 1 << 20], repo.load_tensor("main", "emb")[: 1 << 20])


def test_revisions(repo: ckptrepo.Repo) -> None:
    ids = [repo.commit({"x": torch.tensor([i])}, step=i * 10).wait().id for i in range(4)]
    assert repo.resolve("main") == ids[3]
    assert repo.resolve("main~2") == ids[1]
    assert repo.resolve("main^") == ids[2] and repo.resolve("main^^") == ids[1]
    assert repo.resolve("main^0") == ids[3]
    assert repo.resolve("main@step=10") == ids[1]
    assert repo.resolve("main@step=30~1") == ids[2]
    assert repo.resolve(ids[0][:10]) == ids[0]
    assert repo.resolve(ids[0].upper()[:12]) == ids[0]
    repo.tag("v1", at="main~1")
    assert repo.resolve("v1") == ids[2]
    for bad in ["nope", "main~9", "main^2", "main@step=15", "zzzz", "main~x", ""]:
        with pytest.raises(errors.UnknownRevision):
            repo.resolve(bad)
    merge = repo.commit({"x": torch.tensor([9])}, parents=["main", "v1~1"]).wait()
    assert [p.kind for p in merge.parents] == ["parent", "merge"]
    assert repo.resolve("main^2") == ids[1]


def test_ambiguous_prefix_lists_candidates(repo: ckptrepo.Repo) -> None:
    ids = {repo.commit({"x": torch.tensor([i])}).wait().id for i in range(40)}
    by_prefix: dict[str, list[str]] = {}
    for cid in ids:
        by_prefix.setdefault(cid[0], []).append(cid)
    shared = next(p for p, group in by_prefix.items() if len(group) > 1)
    with pytest.raises(errors.UnknownRevision):
        repo.resolve(shared)  # shorter than the minimum prefix
    # Build a 4-char collision the honest way is too slow; assert the listing on a real shared prefix.
    group = by_prefix[shared]
    common = 1
    while group[0][: common + 1] == group[1][: common + 1]:
        common += 1
    if common >= 4:
        with pytest.raises(errors.AmbiguousRevision) as exc:
            repo.resolve(group[0][:common])
        assert group[0][:10] in str(exc.value)


def test_bad_input_changes_nothing(repo: ckptrepo.Repo, tmp_path: Path) -> None:
    repo.commit({"w": torch.randn(100)}).wait()
    before = (repo.stats(), [c.to_json() for c in repo.log()], _store_bytes(repo))
    with pytest.raises(errors.UnsupportedState) as exc:
        repo.commit({"w": torch.randn(100), "opt": {"fn": lambda x: x}})
    assert "opt/fn" in str(exc.value)
    with pytest.raises(errors.UsageError):
        repo.commit({"w": torch.randn(3)}, metrics={"loss": "low"})
    for not_finite in (float("nan"), float("inf")):
        with pytest.raises(errors.UsageError, match="not a finite number"):
            repo.commit({"w": torch.randn(3)}, metrics={"loss": not_finite})
    with pytest.raises(errors.InvalidRefName):
        repo.commit({"w": torch.randn(3)}, branch="bad name")
    with pytest.raises(errors.RepositoryExists):
        ckptrepo.Repo.init(repo.repo_dir.parent)
    with pytest.raises(errors.RefExists):
        repo.branch("main")
    after = (repo.stats(), [c.to_json() for c in repo.log()], _store_bytes(repo))
    assert before == after
    with pytest.raises(errors.NotARepository):
        ckptrepo.Repo.open(tmp_path / "elsewhere")


def test_corrupt_pack_is_detected(tmp_path: Path) -> None:
    with ckptrepo.Repo.init(tmp_path, compression=False) as repo:
        repo.commit({"w": torch.randn(4096)}).wait()
        pack = next((repo.repo_dir / "store").rglob("*.pack"))
        data = bytearray(pack.read_bytes())
        data[parse_index(bytes(data))[0].offset + 90] ^= 0xFF  # inside the chunk's payload
        pack.write_bytes(bytes(data))
        with pytest.raises(errors.IntegrityError) as exc:
            repo.checkout("main")
        assert "'w'" in str(exc.value)


def test_open_and_discover(tmp_path: Path) -> None:
    ckptrepo.Repo.init(tmp_path).close()
    (tmp_path / "a" / "b").mkdir(parents=True)
    for opener in (ckptrepo.Repo.open(tmp_path), ckptrepo.Repo.open(tmp_path / ".ckpt"),
                   ckptrepo.Repo.discover(tmp_path / "a" / "b")):
        with opener as r:
            assert r.repo_dir == tmp_path / ".ckpt"
    with pytest.raises(errors.NotARepository):
        ckptrepo.Repo.discover(tmp_path.parent)


def test_every_dtype_multi_chunk_round_trip(tmp_path: Path) -> None:
    from ckptrepo.state import SUPPORTED_DTYPES

    gen = torch.Generator().manual_seed(1)
    state: dict[str, Any] = {}
    for name, dtype in SUPPORTED_DTYPES.items():
        raw = torch.randint(0, 256, (3 * 4096 + 96,), dtype=torch.uint8, generator=gen)
        if dtype == torch.bool:
            raw %= 2
        t = raw[: (raw.numel() // dtype.itemsize) * dtype.itemsize].view(dtype)
        state[name] = t
        state[f"{name}.T"] = t[: (t.numel() // 4) * 4].reshape(4, -1).t()  # non-contiguous
    state["tied"] = state["float32"]
    with ckptrepo.Repo.init(tmp_path, chunk_size=4096) as repo:
        commit = repo.commit(state).wait()
        back = repo.checkout(commit.id)
        assert back["tied"] is back["float32"]
        assert_states_equal(back, state)
        assert any(info.n_chunks > 1 for info in repo.tensors(commit.id))


def test_transfer_edges_record_mapping_or_identical_tensors(repo: ckptrepo.Repo) -> None:
    base = {"enc.w": torch.randn(1000), "enc.b": torch.randn(10), "head.w": torch.randn(50)}
    src = repo.commit(base, branch="pretrained").wait()
    child_state = {"enc.w": base["enc.w"], "enc.b": base["enc.b"] + 1, "head.w": torch.randn(20)}
    child = repo.commit(child_state, branch="finetune", transfer_from="pretrained").wait()
    assert [(p.id, p.kind, p.mapping) for p in child.parents] == [(src.id, "transfer", {"enc.w": "enc.w"})]
    with pytest.raises(errors.UnknownRevision):
        repo.resolve("finetune~1")  # a transfer source is not a parent
    declared = repo.commit({"backbone.w": base["enc.w"]}, branch="other",
                           transfer_from=("pretrained", {"backbone.w": "enc.w"})).wait()
    assert declared.parents[0].mapping == {"backbone.w": "enc.w"} and declared.parents[0].kind == "transfer"
    with pytest.raises(errors.UnknownRevision):
        repo.commit({"x": torch.ones(1)}, transfer_from="nope")


@pytest.mark.parametrize("pinned", [False, True])
def test_a_branch_moved_meanwhile(repo: ckptrepo.Repo, pinned: bool) -> None:
    """Another writer moves main while this commit is in phase 2: without given parents it lands
    on top of the new head; with its parent given it is kept on a conflicts/ branch (RefConflict)."""
    first = repo.commit({"w": torch.randn(10)}).wait()
    other = ckptrepo.Repo.open(repo.repo_dir)
    try:
        import ckptrepo.ingest.writer as writer

        real = writer.ingest

        def racing(*args: Any, **kwargs: Any) -> Any:
            result = real(*args, **kwargs)
            if not getattr(racing, "done", False):
                racing.done = True  # type: ignore[attr-defined]
                other.commit({"w": torch.randn(10)}, message="other writer").wait()
            return result

        writer.ingest = racing  # type: ignore[assignment]
        try:
            state = {"w": torch.randn(10)}
            if not pinned:
                mine = repo.commit(state, message="mine").wait()
            else:
                with pytest.raises(errors.RefConflict) as exc:
                    repo.commit(state, message="mine", parents=[first.id]).wait()
        finally:
            writer.ingest = real
    finally:
        other.close()
    theirs = next(c for c in repo.log() if c.message == "other writer")
    if not pinned:
        assert repo.get_commit("main").id == mine.id and mine.parent_ids == [theirs.id]
        assert torch.equal(repo.checkout("main")["w"], state["w"])
        assert not [b for b in repo.branches() if b.name.startswith("conflicts/")]
        assert repo.verify(full=True).ok
        return
    kept = next(b for b in repo.branches() if b.name.startswith("conflicts/main/"))
    assert kept.name in str(exc.value.hint)
    assert repo.get_commit(kept.commit_id).message == "mine"
    assert repo.get_commit(kept.commit_id).parent_ids == [first.id]
    assert repo.get_commit("main").id == theirs.id


def test_returned_commit_equals_the_stored_one(repo: ckptrepo.Repo) -> None:
    """``wait()``'s commit is built from what was inserted; it must equal a read-back."""
    cases: list[tuple[Any, dict[str, Any]]] = [
        ({"w": torch.randn(10)}, {"metrics": {"loss": 2, "acc": 0.5}, "step": 3, "epoch": 1, "message": "m",
                                  "config": {"lr": 0.1, "dims": (4, 8), "by_id": {1: "a"}, "none": None},
                                  "code_version": "abc"}),
        ({"w": torch.randn(10)}, {"branch": "side", "blocking": True}),
        ({"w": torch.randn(10), "b": torch.randn(3)}, {"parents": ["main", "side"], "message": "merge"}),
        ({"w2": torch.randn(10)}, {"branch": "xfer", "transfer_from": ("side", {"w2": "w"})}),
        ({"w": torch.randn(4)}, {"branch": "xfer2", "transfer_from": "main", "config": None}),
    ]
    ids = []
    for state, kwargs in cases:
        returned = repo.commit(state, **kwargs).wait()
        ids.append(returned.id)
        stored = repo.get_commit(returned.id)
        assert returned == stored
        assert returned.created_at.tzinfo is not None and returned.config == stored.config
    first = repo.get_commit(ids[0])
    assert first.config == {"lr": 0.1, "dims": [4, 8], "by_id": {"1": "a"}, "none": None}
    assert first.metrics == {"loss": 2.0, "acc": 0.5}
