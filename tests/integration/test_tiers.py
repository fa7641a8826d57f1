"""Tiers: commits durable on the local store first, replicated to a remote in the background.

A remote marked ``replicate`` gets every commit pushed behind the commit engine; an outage never
fails a commit (up to ``CKPT_REPLICATION_BACKLOG``, then a clear refusal); ``wait_remote`` and
``Checkpointer.close`` return once the remote holds the commit; ``resume(tier=)`` picks by tier
and reads a damaged local chunk from the remote's copy; retention keeps what is not replicated.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptrepo
from ckptrepo import Checkpointer
from ckptrepo.errors import ReplicationBacklog
from ckptrepo.policy import Every
from ckptrepo.testing import assert_states_equal, parts

CHUNK = 16 * 1024


def _state(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(CHUNK // 2, generator=g), "step": seed}


def _until(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_commits_replicate_in_the_background(tmp_path: Path, db_url: str) -> None:
    remote = tmp_path / "remote"
    with ckptrepo.Repo.init(tmp_path / "a", chunk_size=CHUNK, db_url=db_url, replicate_to=str(remote)) as repo:
        assert repo.replica == "origin"
        ids = [repo.commit(_state(i), step=i).wait().id for i in range(3)]
        last = repo.commit(_state(3), step=3, wait_remote=True).wait().id
        assert repo.get_commit(last).tiers == ("local", "origin")
        status = repo.replication()
        assert status is not None and status.backlog_commits == 0 and status.last_error is None
        assert status.points[0].remote == last and status.points[0].commits_at_risk == 0
    with ckptrepo.Repo.clone(str(remote), tmp_path / "b") as clone:
        assert [c.id for c in clone.log("main")][::-1] == [*ids, last]


def test_an_outage_fails_no_commit_and_replication_catches_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the remote's folder would be")
    remote = blocker / "remote"
    repo = ckptrepo.Repo.init(tmp_path / "a", chunk_size=CHUNK, replicate_to=str(remote))
    states = {repo.commit(_state(i), step=i * 10).wait().id: _state(i) for i in range(3)}
    _until(lambda: (s := repo.replication()) is not None and s.last_error is not None)
    status = repo.replication()
    assert status is not None and status.backlog_commits == 3 and status.backlog_bytes > 0
    point = status.points[0]
    assert point.remote is None and point.commits_at_risk == 3
    # Retention keeps every commit the remote does not hold.
    report = repo.prune(keep_last=1)
    assert report.pruned == () and report.kept_by.get("unreplicated") == 2
    # Beyond the backlog limit a commit is refused, before anything is written.
    monkeypatch.setenv("CKPT_REPLICATION_BACKLOG", "1")
    with pytest.raises(ReplicationBacklog) as caught:
        repo.commit(_state(9), step=90)
    assert "ckpt status" in caught.value.hint
    monkeypatch.delenv("CKPT_REPLICATION_BACKLOG")
    blocker.unlink()  # the remote is back
    head = repo.wait_replicated(timeout=60)
    status = repo.replication()
    assert status is not None and status.backlog_commits == 0 and status.points[0].remote == head
    repo.close()
    with ckptrepo.Repo.clone(str(remote), tmp_path / "b") as clone:
        for cid, s in states.items():
            assert_states_equal(clone.checkout(cid), s)


def test_checkpointer_close_waits_for_the_remote_and_resume_reads_its_copy(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    repo = ckptrepo.Repo.init(tmp_path / "a", chunk_size=CHUNK, replicate_to=str(tmp_path / "remote"))
    with Checkpointer(repo, model=model, optimizer=opt, policy=Every(2)) as ck:
        for step in range(1, 7):
            model(torch.randn(4, 64)).sum().backward()
            opt.step()
            ck.after_step(step)
        expected = {k: v.clone() for k, v in model.state_dict().items()}
    assert repo.get_commit("main").tiers == ("local", "origin")  # close waited for the remote
    # Damage every local pack: the resume reads the remote's copies, bit-exact.
    store = parts(repo).backend
    for key in list(store.list("packs/")):
        path = tmp_path / "a" / ".ckpt" / "store" / key
        data = bytearray(path.read_bytes())
        for i in range(16, len(data) - 200, 97):
            data[i] ^= 0x5A
        path.write_bytes(bytes(data))
    fresh = torch.nn.Linear(64, 64)
    ck = Checkpointer(repo, model=fresh, optimizer=torch.optim.SGD(fresh.parameters(), lr=0.1),
                      policy=Every(2))
    assert ck.resume(tier="remote") == 6
    assert_states_equal(dict(fresh.state_dict()), expected)
    repo.close()


def test_resume_by_tier_falls_back_to_an_older_commit(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    up = tmp_path / "net"
    up.mkdir()
    repo = ckptrepo.Repo.init(tmp_path / "a", chunk_size=CHUNK, replicate_to=str(up / "r"))
    ck = Checkpointer(repo, model=model, policy=Every(1), rng=False)
    ck.after_step(1)
    repo.wait_replicated(ck.flush()[-1].id, timeout=60)  # step 1 is on the remote
    up.rename(tmp_path / "net-away")
    up.write_text("the remote is down")
    with torch.no_grad():
        model.weight.add_(1.0)
    ck.after_step(2)
    ck.remote_timeout = 0.5
    with pytest.raises(Exception):  # noqa: B017  (the replication error: the remote is down)
        ck.close()
    resumed = Checkpointer(repo, model=torch.nn.Linear(8, 8), policy=Every(1), rng=False)
    assert resumed.resume(tier="remote") == 1
    assert resumed.resume(tier="local") == 2
    assert resumed.resume() == 2
    repo.close()
