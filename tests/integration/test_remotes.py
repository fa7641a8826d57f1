"""Remotes: push, fetch, pull and clone through ``Repo`` (``ckptrepo.remote``), on SQLite and
PostgreSQL, with folder remotes and an S3 remote (moto).

What is checked: every commit a clone shows restores bit-exactly; a push uploads only what the
remote lacks and nothing when nothing changed; refs move by compare-and-swap (a stale or
diverged push is refused, two clones pushing at once never lose a commit); a lazy clone reads
only what it needs and keeps it; damage on the remote never comes back as wrong data.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptrepo
from ckptrepo.errors import CkptError, IntegrityError, NotFastForward, PushRejected, RemoteNotBare, StoreInUse
from ckptrepo.ledger import manifest
from ckptrepo.testing import assert_states_equal, parts

CHUNK = 16 * 1024


def _state(seed: int, n: int = 3 * CHUNK // 4) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(n, generator=g), "b": torch.arange(8, dtype=torch.int64) + seed}, "step": seed}


def _origin(path: Path, db_url: str | None = None, commits: int = 4) -> tuple[ckptrepo.Repo, dict[str, Any]]:
    repo = ckptrepo.Repo.init(path, chunk_size=CHUNK, db_url=db_url)
    states = {}
    for i in range(commits):
        s = _state(i)
        states[repo.commit(s, step=i, metrics={"loss": 1.0 / (i + 1)}).wait().id] = s
    return repo, states


def _check_all(repo: ckptrepo.Repo, states: dict[str, Any]) -> None:
    for cid, s in states.items():
        assert_states_equal(repo.checkout(cid), s)


def test_push_then_lazy_clone_restores_every_commit(tmp_path: Path, db_url: str) -> None:
    origin, states = _origin(tmp_path / "a", db_url)
    remote = tmp_path / "remote"
    origin.add_remote("origin", str(remote))
    pushed = origin.push()
    assert pushed.commits == 4 and pushed.packs >= 1 and pushed.refs[0].name == "main"
    assert [r.name for r in origin.remote_branches()] == ["origin/main"]
    again = origin.push()
    assert again.commits == 0 and again.packs == 0 and again.refs == ()
    with ckptrepo.Repo.clone(str(remote), tmp_path / "b") as clone:
        assert clone.fetched is not None and clone.fetched.commits == 4
        assert [c.id for c in clone.log("main")] == [c.id for c in origin.log("main")]
        assert clone.resolve("origin/main~1") == origin.resolve("main~1")
        before = sum(1 for _ in parts(clone).backend.list("packs/"))
        assert before == 0  # lazy: no tensor bytes yet
        _check_all(clone, states)
        assert sum(1 for _ in parts(clone).backend.list("packs/")) >= 1  # kept
        assert clone.verify(full=True).ok
        clone.gc(grace=0)
        _check_all(clone, states)
    origin.close()


def test_push_uploads_only_new_chunks(tmp_path: Path) -> None:
    origin, _ = _origin(tmp_path / "a", commits=2)
    origin.add_remote("origin", str(tmp_path / "remote"))
    first = origin.push()
    s = _state(1)
    s["model"]["b"] = s["model"]["b"] * 7  # one small tensor changes
    origin.commit(s, step=9).wait()
    second = origin.push()
    assert second.commits == 1 and second.chunks == 1
    assert second.bytes_uploaded < first.bytes_uploaded / 4
    origin.close()


def test_diverged_push_is_refused_and_force_replaces(tmp_path: Path) -> None:
    origin, _ = _origin(tmp_path / "a", commits=2)
    remote = tmp_path / "remote"
    origin.add_remote("origin", str(remote))
    origin.push()
    other = ckptrepo.Repo.clone(str(remote), tmp_path / "b")
    other.commit(_state(50), step=50).wait()
    other.push()
    mine = origin.commit(_state(60), step=60).wait()
    with pytest.raises(PushRejected) as caught:
        origin.push()
    assert "fast-forward" in caught.value.message and "fetch" in caught.value.hint
    with pytest.raises(NotFastForward):
        origin.pull()
    forced = origin.push(force=True)
    assert forced.refs[0].forced and forced.refs[0].new == mine.id
    other.fetch()
    assert other.resolve("origin/main") == mine.id
    other.close()
    origin.close()


def test_pull_fast_forwards(tmp_path: Path) -> None:
    origin, _ = _origin(tmp_path / "a", commits=1)
    remote = tmp_path / "remote"
    origin.add_remote("origin", str(remote))
    origin.push()
    clone = ckptrepo.Repo.clone(str(remote), tmp_path / "b")
    new = origin.commit(_state(7), step=7).wait()
    origin.push()
    pulled = clone.pull()
    assert pulled.new == new.id and clone.resolve("main") == new.id
    assert_states_equal(clone.checkout("main"), _state(7))
    clone.close()
    origin.close()


def test_two_clones_pushing_at_once_lose_nothing(tmp_path: Path) -> None:
    origin, _ = _origin(tmp_path / "a", commits=1)
    remote = tmp_path / "remote"
    origin.add_remote("origin", str(remote))
    origin.push()
    clones = [ckptrepo.Repo.clone(str(remote), tmp_path / f"c{i}") for i in range(2)]
    made = [c.commit(_state(100 + i), step=100 + i).wait().id for i, c in enumerate(clones)]
    results: list[object] = [None, None]
    barrier = threading.Barrier(2)

    def go(i: int) -> None:
        barrier.wait()
        try:
            results[i] = clones[i].push()
        except PushRejected as exc:
            results[i] = exc

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    landed = [i for i, r in enumerate(results) if isinstance(r, ckptrepo.PushResult)]
    assert len(landed) == 1, results
    loser = 1 - landed[0]
    clones[loser].fetch()
    assert clones[loser].resolve("origin/main") == made[landed[0]]
    with ckptrepo.Repo.clone(str(remote), tmp_path / "check") as check:
        assert check.resolve("main") == made[landed[0]]
        assert_states_equal(check.checkout("main"), _state(100 + landed[0]))
        assert check.verify(full=True).ok
    for c in clones:
        c.close()
    origin.close()


def test_clone_of_a_working_repository(tmp_path: Path) -> None:
    origin, states = _origin(tmp_path / "a", commits=3)
    origin.branch("exp", at="main~1")
    origin.tag("v1", at="main~2")
    with ckptrepo.Repo.clone(str(tmp_path / "a"), tmp_path / "b") as clone:
        assert clone.resolve("origin/exp") == origin.resolve("exp")
        assert clone.resolve("v1") == origin.resolve("v1")
        _check_all(clone, states)
        clone.add_remote("mirror", str(tmp_path / "m"))
        clone.push("mirror", ["main"])  # a clone pushes what it read lazily from its own remote
    with pytest.raises(RemoteNotBare):
        origin.add_remote("self", str(tmp_path / "a"))
        origin.push("self")
    with ckptrepo.Repo.clone(str(tmp_path / "m"), tmp_path / "c") as again:
        _check_all(again, states)
    origin.close()


def test_full_clone_needs_no_remote_afterwards(tmp_path: Path) -> None:
    origin, states = _origin(tmp_path / "a", commits=3)
    origin.add_remote("origin", str(tmp_path / "remote"))
    origin.push()
    origin.close()
    with ckptrepo.Repo.clone(str(tmp_path / "remote"), tmp_path / "b", data="full") as clone:
        assert clone.fetched is not None and clone.fetched.data_chunks > 0
    (tmp_path / "remote").rename(tmp_path / "gone")
    with ckptrepo.Repo.open(tmp_path / "b") as clone:
        _check_all(clone, states)
        clone.remove_remote("origin")


def test_a_store_of_another_repository_is_refused(tmp_path: Path) -> None:
    a, _ = _origin(tmp_path / "a", commits=1)
    b, _ = _origin(tmp_path / "b", commits=1)
    a.add_remote("origin", str(tmp_path / "remote"))
    a.push()
    b.add_remote("origin", str(tmp_path / "remote"))
    with pytest.raises(StoreInUse):
        b.push()
    with pytest.raises(StoreInUse):
        b.fetch()
    a.close()
    b.close()


def test_pruned_marks_travel(tmp_path: Path) -> None:
    origin, states = _origin(tmp_path / "a", commits=5)
    pruned = origin.prune(keep_last=2)
    assert pruned.pruned
    origin.add_remote("origin", str(tmp_path / "remote"))
    origin.push()
    with ckptrepo.Repo.clone(str(tmp_path / "remote"), tmp_path / "b") as clone:
        marks = {c.id: c.pruned for c in clone.log("main")}
        assert marks == {c.id: c.pruned for c in origin.log("main")}
        for cid, s in states.items():
            if not marks[cid]:
                assert_states_equal(clone.checkout(cid), s)
    origin.close()


def test_damage_on_the_remote_never_reads_back_as_data(tmp_path: Path) -> None:
    origin, states = _origin(tmp_path / "a", commits=3)
    remote = tmp_path / "remote"
    origin.add_remote("origin", str(remote))
    origin.push()
    # A flipped byte in a manifest: that commit is refused (a damaged node), the rest fetch.
    victim = origin.resolve("main~1")
    key = remote / manifest.key_of(victim)
    data = bytearray(key.read_bytes())
    data[len(data) // 2] ^= 1
    key.write_bytes(bytes(data))
    with ckptrepo.Repo.clone(str(remote), tmp_path / "b0") as clone:  # the push's bundle has a good copy
        assert clone.fetched is not None and clone.fetched.ok
        _check_all(clone, states)
    bundles = remote / "bundles"
    bundles.rename(tmp_path / "bundles-away")  # without it, the manifest itself is read
    with ckptrepo.Repo.clone(str(remote), tmp_path / "b") as clone:
        assert clone.fetched is not None and not clone.fetched.ok
        assert any(victim[:10] in why for why in clone.fetched.skipped)
        assert clone.get_commit(victim).damage is not None  # a damaged node keeps its child
        for cid, s in states.items():
            if cid == origin.resolve("main"):
                assert_states_equal(clone.checkout(cid), s)
            else:  # the damaged commit, and its ancestors no intact manifest names
                with pytest.raises(CkptError):
                    clone.checkout(cid)
    # A flipped byte in every pack payload: reads fail with IntegrityError, never wrong bytes.
    for pack in (remote / "packs").rglob("*.pack"):
        raw = bytearray(pack.read_bytes())
        raw[20] ^= 0xFF
        pack.write_bytes(bytes(raw))
    with ckptrepo.Repo.clone(str(tmp_path / "a"), tmp_path / "c") as ok:
        _check_all(ok, states)  # the working repository itself is untouched
    key.write_bytes(bytes(data))
    with ckptrepo.Repo.clone(str(remote), tmp_path / "d") as clone, pytest.raises(IntegrityError):
        clone.checkout(origin.resolve("main"))
    origin.close()


def test_s3_remote(tmp_path: Path, s3_url: str) -> None:
    origin, states = _origin(tmp_path / "a", commits=3)
    origin.add_remote("origin", s3_url)
    assert origin.push().commits == 3
    assert origin.push().packs == 0
    with ckptrepo.Repo.clone(s3_url, tmp_path / "b") as clone:
        _check_all(clone, states)
        clone.commit(_state(9), step=9).wait()
        clone.push()
    origin.pull()
    assert_states_equal(origin.checkout("main"), _state(9))
    origin.close()


def test_every_read_of_a_lazy_clone_fetches_and_keeps(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    origin, states = _origin(tmp_path / "a", commits=3)
    origin.add_remote("origin", str(tmp_path / "remote"))
    origin.push()
    head, first, middle = origin.resolve("main"), origin.resolve("main~2"), origin.resolve("main~1")
    with ckptrepo.Repo.clone(str(tmp_path / "remote"), tmp_path / "b") as clone:
        assert clone.get_commit(head).tiers == ("origin",)
        w = clone.load_tensor(head, "model/w")
        assert torch.equal(w, states[head]["model"]["w"])
        assert clone.get_commit(head).tiers == ("origin",)  # its other tensor is still on the remote only
        exact = clone.diff(first, head, exact=True)
        assert exact.tensors and clone.get_commit(first).tiers == ("local", "origin")
        into = {"model": {"w": torch.zeros_like(states[head]["model"]["w"]), "b": torch.zeros(8, dtype=torch.int64)}}
        dcp.load(into, storage_reader=clone.dcp_reader(middle))
        assert_states_equal(into["model"], states[middle]["model"])
        assert clone.get_commit(middle).tiers == ("local", "origin")
    (tmp_path / "remote").rename(tmp_path / "gone")  # kept: no remote needed for what was read
    with ckptrepo.Repo.open(tmp_path / "b") as clone:
        for cid in (head, first, middle):
            assert_states_equal(clone.checkout(cid), states[cid])


def test_a_lazy_clone_rebuilds_its_database_with_its_remotes_packs(tmp_path: Path) -> None:
    origin, states = _origin(tmp_path / "a", commits=3)
    origin.add_remote("origin", str(tmp_path / "remote"))
    origin.push()
    with ckptrepo.Repo.clone(str(tmp_path / "remote"), tmp_path / "b") as clone:
        head = clone.resolve("main")
        assert_states_equal(clone.checkout(head), states[head])  # this one's bytes are kept here
        before = [(c.id, c.tiers) for c in clone.log("main")]
    (tmp_path / "b" / ".ckpt" / "db.sqlite").unlink()
    report = ckptrepo.Repo.rebuild_database(tmp_path / "b")
    assert report.ok and report.damaged == 0, report
    with ckptrepo.Repo.open(tmp_path / "b") as clone:
        assert [c.id for c in clone.log("main")] == [cid for cid, _ in before]
        assert clone.get_commit(clone.resolve("main~1")).tiers[0] != "local"  # still read through origin
        _check_all(clone, states)
    origin.close()


def test_bundles_fold_as_pushes_pile_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptrepo.remote import bundles

    monkeypatch.setattr(bundles, "FOLD_AT", 3)
    remote = tmp_path / "remote"
    repo = ckptrepo.Repo.init(tmp_path / "a", chunk_size=CHUNK)
    repo.add_remote("origin", str(remote))
    states = {}
    follower = None
    for i in range(8):  # one push per commit, as replication makes them
        states[repo.commit(_state(i), step=i).wait().id] = _state(i)
        repo.push()
        if i == 2:
            follower = ckptrepo.Repo.clone(str(remote), tmp_path / "f")
    keys = sorted(p.name for p in (remote / "bundles").iterdir())
    newest = bundles.read((remote / "bundles" / keys[-1]).read_bytes(), f"bundles/{keys[-1]}")
    folded = [bundles.read((remote / "bundles" / k).read_bytes(), f"bundles/{k}").covers for k in keys]
    assert any(folded) and len(keys) == 8
    assert newest.manifests or newest.covers
    with ckptrepo.Repo.clone(str(remote), tmp_path / "b") as clone:
        _check_all(clone, states)
    assert follower is not None
    follower.pull()  # an earlier clone catches up through the folded bundles
    _check_all(follower, states)
    follower.close()
    repo.close()
