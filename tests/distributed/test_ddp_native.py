"""The native API on every rank of a DDP or FSDP2 job (issue 45, item 1).

The README's multi-rank block (``repo.commit(state, step=step)`` and ``repo.checkout("main",
into=state)`` on every rank, no ``group=``) run by ``torchrun`` on 2 gloo ranks: one commit per
step, the same id on every rank; a fresh model and optimizer restored bit-exactly on every rank
(``get_state_dict`` works afterwards); the commit loads in a single process into a plain model and
optimizer. Plus the rules of ``dist.scope`` and the optimizer keys of ``dist.keys`` in one process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptrepo
from ckptrepo.errors import UsageError
from ckptrepo.testing import assert_states_equal

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from ddp_workers import STEPS, make_model  # noqa: E402 (beside this file)

CHUNK = 4096  # small chunks: DDP's replicated tensors are split over the ranks, FSDP2's shard edges fall inside


def _torchrun(kind: str, path: Path, timeout: float = 120.0) -> None:
    code = str(Path(ckptrepo.__file__).resolve().parent.parent)  # the ranks import this very ckptrepo
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [code, os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1", "CKPT_IDLE_REPACK": "0"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(HERE / "ddp_workers.py"), kind, str(path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]


def _by_position(model: torch.nn.Module, saved_optim: dict[str, Any]) -> dict[int, dict[str, torch.Tensor]]:
    """``get_state_dict``'s optimizer state (by parameter name) keyed by position, as a plain
    optimizer's ``state_dict()`` keys it."""
    return {i: saved_optim["state"][name] for i, (name, _) in enumerate(model.named_parameters())}


@pytest.fixture
def repo_path(tmp_path: Path) -> Path:
    ckptrepo.Repo.init(tmp_path, chunk_size=CHUNK).close()
    return tmp_path


@pytest.mark.parametrize("kind", ["ddp", "fsdp2"])
def test_readme_block_on_two_ranks_commits_once_per_step_and_restores(repo_path: Path, kind: str) -> None:
    """DDP and FSDP2 runs of the README's multi-rank block under torchrun produce exactly one
    commit per step (the worker checks every rank got the same ids and restored exactly); the
    commit then loads in one process into a plain model and AdamW, bit-exactly."""
    _torchrun(kind, repo_path)
    ids = (repo_path / f"ids-{kind}.txt").read_text().split()
    saved_model, saved_optim = torch.load(repo_path / f"{kind}.pt", weights_only=False)
    with ckptrepo.Repo.open(repo_path) as repo:
        log = repo.log("main")
        assert [c.id for c in log] == ids[::-1] and [c.step for c in log] == list(range(STEPS, 0, -1))
        assert [[p.id for p in c.parents] for c in log] == [[ids[i - 1]] for i in range(STEPS - 1, 0, -1)] + [[]]
        names = {t.name for t in repo.tensors("main")}
        assert "model/0.weight" in names and not any("module." in n for n in names), sorted(names)
        assert "optim/state/0/exp_avg" in names
        alone = repo.get_commit((repo_path / f"alone-{kind}.txt").read_text())  # rank 0 alone, local=True
        assert not alone.parents and [c.id for c in repo.log("alone")] == [alone.id]

        model, optim = make_model("plain", 5)
        repo.checkout(ids[-1], into={"model": model, "optim": optim})  # no process group here
    assert sorted(optim.state_dict()["state"]) == list(range(4))
    for k, v in saved_model.items():
        assert torch.equal(model.state_dict()[k], v), k
    for i, moments in _by_position(model, saved_optim).items():
        for name, x in moments.items():
            assert torch.equal(optim.state_dict()["state"][i][name], x), (i, name)
    from torch.distributed.checkpoint.state_dict import get_state_dict

    assert_states_equal(get_state_dict(model, optim), (saved_model, saved_optim))


def test_a_commit_with_string_optimizer_keys_checks_out_into_an_optimizer(tmp_path: Path) -> None:
    """A commit whose optimizer state has ``"0"`` for ``0`` (what distributed commits recorded,
    DCP's key paths being strings) loads into an optimizer as its ints, and checks out so."""
    model, optim = make_model("plain", 4)
    model(torch.randn(8, 64)).sum().backward()
    optim.step()
    sd = optim.state_dict()
    stringly = {"state": {str(k): v for k, v in sd["state"].items()}, "param_groups": sd["param_groups"]}
    with ckptrepo.Repo.init(tmp_path) as repo:
        cid = repo.commit({"model": model.state_dict(), "optim": stringly}, blocking=True).wait().id
        assert sorted(repo.checkout(cid, part="optim")["state"]) == [0, 1, 2, 3]
        fresh, fresh_optim = make_model("plain", 6)
        repo.checkout(cid, into={"model": fresh, "optim": fresh_optim})
    from torch.distributed.checkpoint.state_dict import get_state_dict

    assert_states_equal(get_state_dict(fresh, fresh_optim), get_state_dict(model, optim))


def test_local_and_group_together_are_refused_and_without_a_group_nothing_is_collective(tmp_path: Path) -> None:
    from ckptrepo.distributed import scope

    state = {"w": torch.zeros(3)}
    assert scope.collective_group(state, None, local=False, what="commit()") is None  # no process group
    assert scope.collective_group(state, None, local=True, what="commit()") is None
    with pytest.raises(UsageError, match="both group= and local=True") as caught:
        scope.collective_group(state, object(), local=True, what="commit()")  # type: ignore[arg-type]
    assert caught.value.hint and "not both" in caught.value.hint
    with ckptrepo.Repo.init(tmp_path) as repo, pytest.raises(UsageError, match="local=True"):
        repo.commit(state, group=object(), local=True)  # type: ignore[arg-type]
    model, _ = make_model("plain", 7)
    with ckptrepo.Repo.open(tmp_path) as repo:  # one process, local=True or not: the same commit
        a = repo.commit({"model": model}, local=True, blocking=True).wait()
        fresh, _ = make_model("plain", 8)
        repo.checkout(a.id, into={"model": fresh}, local=True)
    assert all(torch.equal(x, y) for x, y in zip(fresh.state_dict().values(), model.state_dict().values(),
                                                  strict=True))


def test_optimizer_keys_are_mended_only_where_the_params_are_positions() -> None:
    from ckptrepo.distributed.keys import int_keys

    t = torch.zeros(1)
    by_position = {"state": {"0": {"m": t}, "1": {"m": t}}, "param_groups": [{"params": [0, 1], "lr": 0.1}]}
    assert list(int_keys({"o": by_position})["o"]["state"]) == [0, 1]
    merged = int_keys({"state": {0: {"m": t, "step": 1}, "0": {"step": 2}}, "param_groups": [{"params": [0]}]})
    assert merged["state"] == {0: {"m": t, "step": 2}}
    by_name = {"state": {"0": {"m": t}}, "param_groups": [{"params": ["0"]}]}  # get_state_dict's: names
    assert int_keys(by_name) is by_name
    other = {"state": {"0": 1}, "param_groups": []}
    assert int_keys(other) is other and int_keys([by_name, 3]) is not None


def test_a_job_of_two_ranks_replicates_its_commits(tmp_path: Path) -> None:
    """Commits made on every rank of a job are pushed to the replica by the coordinator, in the
    background; a clone of the remote restores the last one bit-exactly."""
    remote = tmp_path / "remote"
    ckptrepo.Repo.init(tmp_path / "job", chunk_size=CHUNK, replicate_to=str(remote)).close()
    _torchrun("replicate", tmp_path / "job")
    last = (tmp_path / "job" / "replicated.txt").read_text()
    with ckptrepo.Repo.open(tmp_path / "job") as repo, ckptrepo.Repo.clone(str(remote), tmp_path / "clone") as clone:
        assert clone.resolve("main") == last == repo.resolve("main")
        assert len(clone.log("main")) == len(repo.log("main"))
        assert_states_equal(clone.checkout(last), repo.checkout(last))


def test_node_local_stores_each_upload_their_own_packs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks as two nodes, each writing to a store of its own (``CKPT_NODE_STORE``): each uploads
    its own packs, the coordinator publishes once both are on the remote; with one node's store
    lost, the commit restores from the remote, through a clone and through the job's repository."""
    remote, job = tmp_path / "remote", tmp_path / "job"
    ckptrepo.Repo.init(job, chunk_size=CHUNK, replicate_to=str(remote)).close()
    _torchrun("nodes", job)
    last = (job / "replicated.txt").read_text()
    for node in ("node0", "node1"):
        assert list((job / node / "packs").rglob("*.pack")), node  # each node wrote its share there
    assert not list((job / ".ckpt" / "store").rglob("*.pack"))  # nothing went to the shared store
    trained = torch.load(job / "replicated-model.pt", weights_only=True)
    import shutil

    shutil.rmtree(job / "node1")  # one node's disk is lost
    with ckptrepo.Repo.clone(str(remote), tmp_path / "clone") as clone:
        assert clone.resolve("main") == last
        assert_states_equal(clone.checkout(last, part="model"), dict(trained))
    monkeypatch.setenv("CKPT_NODE_STORE", str(job / "node0"))
    with ckptrepo.Repo.open(job) as repo:
        assert_states_equal(repo.checkout(last, part="model"), dict(trained))
