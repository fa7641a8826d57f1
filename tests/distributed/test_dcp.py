"""Multi-rank commits and resharding loads, in spawned processes on gloo (CPU).

Saves through ``ckptrepo.dcp.Writer`` (``dcp.save`` and ``dcp.async_save``) and ``Repo.commit`` on
every rank; loads through ``ckptrepo.dcp.Reader`` and ``Repo.checkout(into=...)`` at other world
sizes and layouts; every comparison is bit-exact against the reference values.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import ckptrepo

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dist_workers import SHAPES, reference, run_ranks

CHUNK = 4096  # small chunks: shard edges fall inside them


@pytest.fixture
def repo_path(tmp_path: Path) -> Path:
    ckptrepo.Repo.init(tmp_path, chunk_size=CHUNK).close()
    return tmp_path


def _full(repo_path: Path, rev: str) -> dict[str, torch.Tensor]:
    with ckptrepo.Repo.open(repo_path) as repo:
        state = repo.checkout(rev)
        assert repo.verify(full=True).ok
    assert state["step"] == 5 and state["lr"] == [0.1, 0.01]
    return dict(state["t"])


@pytest.mark.parametrize("kind", ["shard0", pytest.param("shard1", marks=pytest.mark.slow),
                                  pytest.param("replicate", marks=pytest.mark.slow)])
def test_dtensors_saved_at_two_ranks_restore_whole_and_load_at_three(repo_path: Path, kind: str) -> None:
    run_ranks("save_dtensors", 2, repo_path, kind, "save", 11)
    cid = (repo_path / f"commit-{kind}-save-2.txt").read_text()
    full = _full(repo_path, cid)
    assert {k: torch.equal(v, reference(11)[k]) for k, v in full.items()} == dict.fromkeys(SHAPES, True)
    with ckptrepo.Repo.open(repo_path) as repo:  # an ordinary commit: log, show, diff, export
        commit = repo.get_commit(cid)
        assert commit.step == 11 and commit.message == f"{kind} on 2" and commit.logical_bytes > 0
        shapes = {t.name: t.shape for t in repo.tensors(cid)}
        assert shapes["t/big"] == SHAPES["big"] and shapes["t/b"] == SHAPES["b"]
        repo.export(cid, repo_path / "out.pt")
    run_ranks("load_dtensors", 3, repo_path, cid, "shard0" if kind == "shard1" else "shard1", 11)


def test_replicated_dtensors_at_three_ranks_are_written_once_in_parts(repo_path: Path) -> None:
    """Replicate() on 3 ranks: each tensor is written once, the large ones in parts over all
    three ranks (one of two chunks: by two ranks, not by the rank DCP gave it to)."""
    run_ranks("save_dtensors", 3, repo_path, "replicate", "save", 6)
    cid = (repo_path / "commit-replicate-save-3.txt").read_text()
    assert all(torch.equal(v, reference(6)[k]) for k, v in _full(repo_path, cid).items())
    with ckptrepo.Repo.open(repo_path) as repo:
        commit = repo.get_commit(cid)
        assert commit.new_bytes == sum(4 * torch.Size(s).numel() for s in SHAPES.values())


def test_uneven_shards_round_trip_between_world_sizes(repo_path: Path) -> None:
    """37 and 7 rows over 3 ranks (12+12+13, 3+3+1), loaded at 2 and then at 1 (no process group)."""
    run_ranks("save_dtensors", 3, repo_path, "shard0", "save", 3)
    cid = (repo_path / "commit-shard0-save-3.txt").read_text()
    assert all(torch.equal(v, reference(3)[k]) for k, v in _full(repo_path, cid).items())
    run_ranks("load_dtensors", 2, repo_path, cid, "shard0", 3)
    import torch.distributed.checkpoint as dcp

    from ckptrepo.dcp import Reader

    target = {"t": {k: torch.zeros(s) for k, s in SHAPES.items()}, "step": 0, "lr": []}
    with pytest.warns(UserWarning), Reader(repo_path, cid) as reader:
        dcp.load(target, storage_reader=reader, no_dist=True)
    assert all(torch.equal(v, reference(3)[k]) for k, v in target["t"].items())


def test_async_save_commits_once_every_rank_is_durable(repo_path: Path) -> None:
    run_ranks("save_dtensors", 2, repo_path, "shard0", "async", 4)
    cid = (repo_path / "commit-shard0-async-2.txt").read_text()
    assert all(torch.equal(v, reference(4)[k]) for k, v in _full(repo_path, cid).items())


def test_the_same_state_from_another_world_size_stores_only_edge_chunks(repo_path: Path) -> None:
    """Shard(0) at 2 ranks, then the same values at 3: only the chunks that straddle the new
    shard edges are new (layout-free chunk identity); at 1 rank (a plain commit) likewise."""
    run_ranks("save_dtensors", 2, repo_path, "shard0", "save", 8)
    run_ranks("save_dtensors", 3, repo_path, "shard0", "save", 8)
    with ckptrepo.Repo.open(repo_path) as repo:
        second = repo.get_commit((repo_path / "commit-shard0-save-3.txt").read_text())
        # At most two pieces per new shard edge per tensor (2 new edges, 4 tensors), each < a chunk.
        assert second.new_bytes <= 2 * 2 * len(SHAPES) * CHUNK, second
        assert second.new_bytes < 0.25 * second.logical_bytes
        plain = repo.commit({"t": reference(8), "step": 5, "lr": [0.1, 0.01]}, blocking=True).wait()
        assert plain.new_bytes <= 2 * len(SHAPES) * CHUNK
        assert repo.verify().ok
        # Other chunks at the edges, the same values: an exact diff reads such tensors whole.
        diff = repo.diff((repo_path / "commit-shard0-save-2.txt").read_text(), second.id, exact=True)
        for delta in diff.tensors:
            assert delta.status == "unchanged" or (delta.exact is not None and delta.exact.l2_diff == 0), delta
        assert {d.status for d in repo.diff(second.id, plain.id).tensors} <= {"changed", "unchanged"}


@pytest.mark.parametrize("saved, loaded", [(2, 4), *(pytest.param(*p, marks=pytest.mark.slow)
                                                    for p in [(2, 1), (2, 2), (2, 3), (3, 2)])])
def test_fsdp2_model_and_adamw_reshard(repo_path: Path, saved: int, loaded: int) -> None:
    if not (repo_path / f"fsdp-{saved}.pt").exists():
        run_ranks("save_fsdp", saved, repo_path, 1)
    if loaded == 1:
        _load_fsdp_in_this_process(repo_path, saved)
    else:
        run_ranks("load_fsdp", loaded, repo_path, saved, 1, timeout=300)


def _load_fsdp_in_this_process(repo_path: Path, saved_world: int) -> None:
    """The FSDP2 commit into a plain model and AdamW in one process (full tensors)."""
    import torch.distributed.checkpoint as dcp

    from ckptrepo.dcp import Reader

    saved = torch.load(repo_path / f"fsdp-{saved_world}.pt", weights_only=False)
    torch.manual_seed(9)
    model = torch.nn.Sequential(torch.nn.Linear(64, 257), torch.nn.ReLU(), torch.nn.Linear(257, 33))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(8, 64)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optim": _by_name(opt, model)}
    with pytest.warns(UserWarning), Reader(repo_path, saved["commit"]) as reader:
        dcp.load(state, storage_reader=reader, no_dist=True)
    for k, v in saved["model"].items():
        assert torch.equal(state["model"][k], v), k
    for k, v in saved["optim"]["state"].items():
        for name, x in v.items():
            assert torch.equal(state["optim"]["state"][k][name], x), (k, name)


def _by_name(opt: torch.optim.Optimizer, model: torch.nn.Module) -> dict[str, object]:
    """The optimizer state keyed by parameter name, as ``get_state_dict`` writes it."""
    names = {id(p): n for n, p in model.named_parameters()}
    params = [p for group in opt.param_groups for p in group["params"]]
    return {"state": {names[id(p)]: {k: v.clone() for k, v in opt.state[p].items()} for p in params},
            "param_groups": [{**{k: v for k, v in g.items() if k != "params"}, "params": [names[id(p)] for p in
                                                                                       g["params"]]}
                             for g in opt.param_groups]}


@pytest.mark.parametrize("kind", ["shard0", pytest.param("shard1", marks=pytest.mark.slow)])
def test_repo_commit_on_every_rank_is_one_commit_and_checks_out_at_another_size(repo_path: Path, kind: str) -> None:
    run_ranks("native_commit", 2, repo_path, kind, 21)
    cid = (repo_path / f"native-{kind}-2.txt").read_text()
    with ckptrepo.Repo.open(repo_path) as repo:
        state = repo.checkout(cid)
        assert all(torch.equal(v, reference(21)[k]) for k, v in state["t"].items())
        g = torch.Generator().manual_seed(21)
        assert torch.equal(state["replicated"], torch.randn(512, 512, generator=g)) and state["epoch"] == 3
        assert repo.log()[0].id == cid and repo.get_commit(cid).message == "native"
    run_ranks("native_checkout", 3, repo_path, cid, "shard0", 21)


def test_a_rank_that_fails_fails_the_commit_on_every_rank(repo_path: Path) -> None:
    run_ranks("native_failure", 2, repo_path)
    assert (repo_path / "failed-0.txt").exists() and (repo_path / "failed-1.txt").exists()
    with ckptrepo.Repo.open(repo_path) as repo:
        assert repo.log() == [] and repo.stats().packs == 0


def test_ddp_state_is_written_once_in_parts_and_restores(repo_path: Path) -> None:
    """DDP's replicated state: DCP gives each tensor to one rank; the large ones are split over
    both ranks by bytes, in whole chunk steps, so the commit equals a single-process commit of
    the same state (the same tensor ids) and every chunk is stored once."""
    run_ranks("save_ddp", 2, repo_path, 5)
    saved = torch.load(repo_path / "ddp.pt", weights_only=False)
    with ckptrepo.Repo.open(repo_path) as repo:
        state = repo.checkout(saved["commit"])
        for k, v in saved["state"]["model"].items():
            assert torch.equal(state["model"][k], v), k
        plain = repo.commit(saved["state"], branch="plain", blocking=True).wait()
        assert plain.new_bytes == 0  # every chunk identical to the distributed commit's
        ids = {t.name: t.tensor_id for t in repo.tensors(saved["commit"])}
        assert ids == {t.name: t.tensor_id for t in repo.tensors(plain.id)}


def test_checkpointer_on_every_rank_commits_together_and_resumes_at_any_size(repo_path: Path) -> None:
    """A Checkpointer on each of 2 ranks (FSDP2, AdamW, a scheduler, an Adaptive policy whose
    answer comes from rank 0): every rank's handles give the same commits; a fresh job resumes
    the head at 2 ranks exactly, at 3 resharded with a warning, and in one process (full tensors)."""
    run_ranks("checkpointer_fsdp", 2, repo_path, 24, timeout=300)
    ids = [(repo_path / f"ids-{r}.txt").read_text().split() for r in range(2)]
    assert ids[0] == ids[1] and len(ids[0]) >= 2  # the warm-up (or more) and the explicit commit
    with ckptrepo.Repo.open(repo_path) as repo:
        head = repo.get_commit("main")
        assert head.id == ids[0][-1] and head.config["checkpointer"] == {"rule": "explicit", "world_size": 2}
        log = repo.log("main")
        assert log[-1].config["checkpointer"]["rule"] == "warm-up" and log[-1].metrics == {"loss": 0.0}  # rank 0's
        assert set(repo.checkout(head.id, part="ranks")) == {"0", "1"}
    run_ranks("checkpointer_resume", 2, repo_path, 2, timeout=300)
    run_ranks("checkpointer_resume", 3, repo_path, 2, timeout=300)
    saved = torch.load(repo_path / "checkpointer-2.pt", weights_only=False)
    torch.manual_seed(9)
    model = torch.nn.Sequential(torch.nn.Linear(64, 257), torch.nn.ReLU(), torch.nn.Linear(257, 33))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    with pytest.warns(UserWarning, match="was made on 2"), ckptrepo.Checkpointer(repo_path, model=model,
                                                                                  optimizer=opt) as ckpt:
        assert ckpt.resume() == saved["step"]
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, opt)
    for k, v in saved["model"].items():
        assert torch.equal(model_sd[k], v), k
    for k, v in saved["optim"]["state"].items():
        for name, x in v.items():
            assert torch.equal(optim_sd["state"][k][name], x), (k, name)
