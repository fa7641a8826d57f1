"""Retention that keeps the lineage: ``Repo.prune``, gc of pruned data, the stored setting and
``ckpt prune``, on SQLite and PostgreSQL.

Every test checks both sides: a pruned commit stays a lineage node (log, show, history, ancestors,
diff) and refuses to be read (CommitPruned naming the nearest commit with data), and every commit
that is not pruned restores bit-exactly after gc, with verify clean.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import select
from typer.testing import CliRunner

import ckptrepo
from ckptrepo.cli.app import app
from ckptrepo.db.models import Chunk, Entry, TensorChunk
from ckptrepo.errors import CommitPruned, UsageError
from ckptrepo.testing import assert_states_equal, parts
from ckptrepo.types import RetentionRules

CHUNK = 4096


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(3 * CHUNK // 4, generator=g), "b": torch.arange(16, dtype=torch.float32)}


def _pack_bytes(repo: ckptrepo.Repo) -> int:
    return sum(p.stat().st_size for p in (repo.repo_dir / "store" / "packs").rglob("*.pack"))


@pytest.fixture
def repo(tmp_path: Path, db_url: str) -> Iterator[ckptrepo.Repo]:
    with ckptrepo.Repo.init(tmp_path / "work", db_url=db_url, chunk_size=CHUNK) as r:
        yield r


class Lineage:
    """main m0..m7, then m8 merging exp; exp e0..e3 forked at m3; ft f0, f1 initialised (transfer)
    from m2; tag v1 at m1. ``states`` holds what each commit stored."""

    def __init__(self, repo: ckptrepo.Repo) -> None:
        self.ids: dict[str, str] = {}
        self.states: dict[str, dict[str, torch.Tensor]] = {}

        def commit(name: str, seed: int, **kw: Any) -> None:
            state = _state(seed)
            c = repo.commit(state, blocking=True, metrics={"val_loss": float(seed % 7)}, **kw).wait()
            self.ids[name], self.states[name] = c.id, state

        for i in range(8):
            commit(f"m{i}", i, step=10 * i)
            if i == 3:
                repo.branch("exp", at=self.ids["m3"])
        for i in range(4):
            commit(f"e{i}", 100 + i, branch="exp", step=40 + 10 * i)
        commit("m8", 8, step=80, parents=[self.ids["m7"], self.ids["e3"]])
        commit("f0", 200, branch="ft", step=0, transfer_from=self.ids["m2"])
        commit("f1", 201, branch="ft", step=1)
        repo.tag("v1", at=self.ids["m1"])

    def names(self, ids: Any) -> set[str]:
        back = {v: k for k, v in self.ids.items()}
        return {back[i] for i in ids}


def test_prune_keeps_the_lineage_and_gc_frees_the_data(repo: ckptrepo.Repo) -> None:
    lin = Lineage(repo)
    ids = lin.ids
    stats = repo.stats()
    dry = repo.prune(keep_last=2, dry_run=True)
    # Heads (m8, e3, f1), the tag (m1), the fork (m3), the transfer source (m2; e3 is the merge
    # source too) and each line's 2 newest are kept.
    expected = {"m0", "m4", "m5", "m6", "e0", "e1"}
    assert lin.names(dry.pruned) == expected and dry.dry_run
    assert dry.considered == 15 and dry.kept == 9 and dry.already_pruned == 0
    assert dry.kept_by["head"] == 3 and dry.kept_by["tag"] == 1 and dry.kept_by["transfer"] == 1
    assert dry.freeable_bytes > 0 and dry.freeable_chunks == 6 * 3  # each pruned commit's 3 own chunks
    assert not any(c.pruned for c in repo.log()) and repo.stats() == stats  # a dry run changes nothing

    report = repo.prune(keep_last=2)
    assert report.pruned == dry.pruned and not report.dry_run
    assert (report.freeable_bytes, report.freeable_packs) == (dry.freeable_bytes, dry.freeable_packs)

    def still_a_lineage_node() -> None:
        log = repo.log()  # every commit
        assert len(log) == 15 and lin.names(c.id for c in log if c.pruned) == expected
        shown = repo.get_commit(ids["m5"])
        assert shown.pruned and shown.metrics == {"val_loss": 5.0} and shown.step == 50
        assert shown.to_json()["pruned"] is True and not repo.get_commit(ids["m7"]).pruned
        assert ids["m5"] in repo.ancestors("main") and ids["e1"] in repo.ancestors("main")
        assert repo.path(ids["m0"], ids["f1"]) == [ids[n] for n in ("m0", "m1", "m2", "f0", "f1")]
        assert repo.merge_base("main", "exp") == [ids["e3"]]
        assert [p.commit_id for p in repo.history("w", along="main")][3] == ids["m5"]
        tensors = {t.name: t for t in repo.tensors(ids["m5"])}
        assert tensors["w"].stats.numel == 3 * CHUNK // 4
        d = repo.diff(ids["m4"], ids["m5"])
        assert d.counts["changed"] == 1 and d.counts["unchanged"] == 1
        assert repo.best("val_loss", limit=9)  # pruned commits compete: their metrics stay

    still_a_lineage_node()
    with pytest.raises(CommitPruned) as refused:
        repo.checkout(ids["m5"])
    # m4 and m6 are pruned; m3 and m7 are 2 hops away, m7 is the newer.
    assert refused.value.exit_code == 3 and refused.value.fields["nearest"] == ids["m7"]
    assert f"{ids['m7'][:10]} (2 hops away along the lineage)" in refused.value.hint
    with pytest.raises(CommitPruned):
        repo.load_tensor(ids["e0"], "w")
    with pytest.raises(CommitPruned):
        repo.export(ids["m0"], Path(repo.repo_dir.parent / "m0.safetensors"))
    with pytest.raises(CommitPruned):
        repo.dcp_reader(ids["m6"]).read_metadata()
    with pytest.raises(CommitPruned):
        repo.diff(ids["m5"], ids["m7"], exact=True)
    assert not (repo.repo_dir.parent / "m0.safetensors").exists()

    before = _pack_bytes(repo)
    gc = repo.gc(grace=0)
    assert gc.commits_removed == 0 and gc.pruned_tensors_dropped == 6  # each pruned commit's "w"
    assert gc.chunks_removed == dry.freeable_chunks
    assert gc.pack_bytes_freed == dry.freeable_pack_bytes > 0
    assert gc.bytes_freed > 0 and _pack_bytes(repo) == before - gc.bytes_freed
    assert repo.stats().stored_bytes == stats.stored_bytes - dry.freeable_bytes

    still_a_lineage_node()
    d = repo.diff(ids["m4"], ids["m5"])  # chunk lists gone: counted as all changed, with a note
    (w,) = [t for t in d.tensors if t.name == "w"]
    assert w.status == "changed" and w.chunks_changed == w.n_chunks == 3 and "pruned" in (w.note or "")
    for name in set(ids) - expected:
        assert_states_equal(repo.checkout(ids[name]), lin.states[name], path=name)
    report_v = repo.verify(full=True)
    assert report_v.ok and not report_v.warnings, report_v.to_json()
    assert report_v.last_good == {"exp": ids["e3"], "ft": ids["f1"], "main": ids["m8"]}

    again = repo.prune(keep_last=2)
    assert again.pruned == () and again.already_pruned == 6 and again.freeable_bytes == 0
    assert repo.gc(grace=0).chunks_removed == 0


def test_a_state_a_pruned_commit_had_commits_again_after_gc(repo: ckptrepo.Repo) -> None:
    """The tensors a gc took the chunk lists of are never reused: committing the same values
    again stores them anew, and both the new commit and the pruned one's statistics are right."""
    a = repo.commit(_state(1), blocking=True).wait()
    repo.commit(_state(2), blocking=True).wait()
    repo.commit(_state(3), blocking=True).wait()
    assert repo.prune(keep_last=1).pruned == tuple(sorted([a.id, repo.log()[1].id]))
    repo.gc(grace=0)
    again = repo.commit(_state(1), blocking=True).wait()  # the same tensors as a
    # ... and on top of the pruned commit itself (its layout offers no tensor for reuse).
    child = repo.commit(_state(1) | {"x": torch.ones(3)}, branch="side", parents=[a.id], blocking=True).wait()
    assert_states_equal(repo.checkout(again.id), _state(1))
    assert_states_equal(repo.checkout(child.id), _state(1) | {"x": torch.ones(3)})
    assert [t.tensor_id for t in repo.tensors(a.id)] == [t.tensor_id for t in repo.tensors(again.id)]
    assert repo.diff(a.id, again.id).counts["unchanged"] == 2
    report = repo.verify(full=True)
    assert report.ok, report.to_json()


@pytest.mark.parametrize("delta_base", ["root", "parent"])
def test_kept_deltas_against_pruned_chunks_still_restore(tmp_path: Path, db_url: str, delta_base: str) -> None:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4 * CHUNK // 4, generator=g)
    states = [{"w": base + 1e-3 * k} for k in range(6)]
    with ckptrepo.Repo.init(tmp_path / "d", db_url=db_url, chunk_size=CHUNK, delta_base=delta_base) as repo:
        ids = [repo.commit(s, step=k, blocking=True).wait().id for k, s in enumerate(states)]
        report = repo.prune(keep_last=2)
        assert set(report.pruned) == set(ids[:4])
        with parts(repo).sessions() as s:  # the oldest kept commit's chunks are deltas against pruned ones'
            kept_chunks = s.execute(select(Chunk.base_key).join(TensorChunk, TensorChunk.chunk_key == Chunk.key)
                                    .join(Entry, Entry.tensor_key == TensorChunk.tensor_key)
                                    .where(Entry.commit_id == ids[4], Chunk.base_key.is_not(None))).all()
            pruned_chunks = set(s.scalars(select(TensorChunk.chunk_key)
                                          .join(Entry, Entry.tensor_key == TensorChunk.tensor_key)
                                          .where(Entry.commit_id.in_(ids[:4]))))
        assert len(kept_chunks) == 4 and {k for (k,) in kept_chunks} <= pruned_chunks
        gc = repo.gc(grace=0)
        assert gc.pruned_tensors_dropped == 4
        if delta_base == "parent":  # a chain through every pruned commit: all of it is still needed
            assert report.freeable_bytes == 0 and gc.chunks_removed == 0
        else:  # deltas against the keyframe (the first commit's): the commits in between go
            assert report.freeable_chunks == gc.chunks_removed == 3 * 4
        for k in (4, 5):
            assert torch.equal(repo.checkout(ids[k])["w"], states[k]["w"])
        verdict = repo.verify(full=True)
        assert verdict.ok and not verdict.warnings, verdict.to_json()


def test_prune_by_branch_and_rules(repo: ckptrepo.Repo) -> None:
    lin = Lineage(repo)
    with pytest.raises(UsageError, match="no keep rule"):
        repo.prune()
    with pytest.raises(UsageError, match="no branch named 'exq'"):
        repo.prune(keep_last=1, branches=["exq"])
    with pytest.raises(UsageError, match="given whole and as separate"):
        repo.prune(rules=RetentionRules(keep_last=1), keep_last=2)
    assert not any(c.pruned for c in repo.log())
    only_exp = repo.prune(keep_last=1, branches=["exp"], dry_run=True)
    # exp's line is e3..e0, m3..m0: m0 is main's too (other_branch), m1..m3 protected.
    assert lin.names(only_exp.pruned) == {"e0", "e1", "e2"} and only_exp.kept_by["other_branch"] == 4
    by_metric = repo.prune(keep_best="val_loss:1", keep_every=40, branches=["main"], dry_run=True)
    # val_loss = seed % 7: m0 and m7 have 0 (the older wins); steps 0 and 40 start their buckets.
    # Only main's line is considered; m3..m0 are exp's too. m8 (head) and m4 start step buckets.
    assert lin.names(by_metric.pruned) == {"m5", "m6", "m7"}
    assert by_metric.kept_by["best"] == 1 and by_metric.kept_by["every"] == 3
    young = repo.prune(keep_younger_than="1h", dry_run=True)
    assert young.pruned == ()


def test_the_saved_setting_applies_after_commits(tmp_path: Path, db_url: str) -> None:
    path = tmp_path / "auto"
    with ckptrepo.Repo.init(path, db_url=db_url, chunk_size=CHUNK) as repo:
        assert repo.retention() is None
        repo.set_retention({"keep_last": 3})
        assert repo.retention() == RetentionRules(keep_last=3)
        ids = []
        for i in range(10):
            ids.append(repo.commit(_state(i), step=i, blocking=True).wait().id)
            parts(repo).retention.wait()  # the run this commit queued, deterministically
            log = repo.log()
            assert not log[0].pruned and log[0].id == ids[-1]  # never the newest
            assert sum(c.pruned for c in log) == max(0, i + 1 - 3)
        # Asynchronous commits too: the last one's run comes after it, whatever ran meanwhile.
        handles = [repo.commit(_state(100 + i), step=100 + i) for i in range(5)]
        ids += [h.wait().id for h in handles]
    with ckptrepo.Repo.open(path) as repo:
        log = repo.log()
        assert [c.id for c in log] == ids[::-1]
        assert [c.pruned for c in log] == [False] * 3 + [True] * 12
        for i, cid in enumerate(ids[-3:]):
            assert_states_equal(repo.checkout(cid), _state(102 + i))
        assert repo.verify(full=True).ok
        repo.set_retention(None)
        assert repo.retention() is None


def test_a_failing_automatic_run_does_not_fail_commits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    from ckptrepo.maintenance import prune

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(prune, "prune", broken)
    with caplog.at_level(logging.WARNING, logger="ckptrepo"), \
            ckptrepo.Repo.init(tmp_path / "f", chunk_size=CHUNK) as repo:
        repo.set_retention(RetentionRules(keep_last=1))
        commits = [repo.commit(_state(i)).wait() for i in range(3)]
        parts(repo).retention.wait()
        assert [c.id for c in repo.log()] == [c.id for c in reversed(commits)]
        assert not any(c.pruned for c in repo.log())
    assert "automatic retention failed" in caplog.text and "disk on fire" in caplog.text


def test_cli_prune(repo: ckptrepo.Repo, tmp_path: Path) -> None:
    lin = Lineage(repo)
    repo.close()
    runner = CliRunner()

    def ckpt(*args: str) -> Any:
        return runner.invoke(app, ["--repo", str(tmp_path / "work"), *args])

    none = ckpt("prune")
    assert none.exit_code == UsageError.exit_code and "no keep rule" in none.output and "--keep-last" in none.output
    dry = ckpt("prune", "--keep-last", "2", "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    doc = json.loads(dry.stdout)
    assert doc["dry_run"] and lin.names(doc["pruned"]) == {"m0", "m4", "m5", "m6", "e0", "e1"}
    assert doc["freeable_bytes"] > 0 and doc["rules"]["keep_last"] == 2
    assert not any(c["pruned"] for c in json.loads(ckpt("log", "--all", "--json").stdout))
    table = ckpt("prune", "--keep-last", "2", "--keep-best", "val_loss:1", "--save")
    assert table.exit_code == 0, table.output
    assert lin.ids["m4"][:10] in table.output and "gc frees" in table.output and "saved" in table.output
    log = json.loads(ckpt("log", "main", "--json").stdout)
    # main's ancestors, exp's through the merge; m0 is the best by val_loss.
    assert lin.names(c["id"] for c in log if c["pruned"]) == {"m4", "m5", "m6", "e0", "e1"}
    assert "(pruned)" in ckpt("log", "main").output
    show = ckpt("show", lin.ids["m5"])
    assert show.exit_code == 0 and "pruned" in show.output and "w" in show.output
    assert json.loads(ckpt("show", lin.ids["m5"], "--json").stdout)["pruned"] is True
    out = tmp_path / "m5.safetensors"
    refused = ckpt("checkout", lin.ids["m5"], "-o", str(out))
    assert refused.exit_code == 3 and "was pruned" in refused.output and lin.ids["m7"][:10] in refused.output
    assert not out.exists()
    again = json.loads(ckpt("prune", "--saved", "--json").stdout)
    assert again["pruned"] == [] and again["already_pruned"] == 5 and again["rules"]["keep_best"] == ["val_loss", 1]
    assert ckpt("prune", "--saved", "--keep-last", "1").exit_code == UsageError.exit_code
    assert ckpt("prune", "--save", "--dry-run", "--keep-last", "1").exit_code == UsageError.exit_code
    assert ckpt("prune", "--forget").exit_code == 0
    assert ckpt("prune", "--saved").exit_code == UsageError.exit_code
    assert ckpt("gc", "--grace", "0").exit_code == 0
    assert ckpt("verify", "--full").exit_code == 0
