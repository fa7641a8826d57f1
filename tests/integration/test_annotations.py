"""Annotations: results attached to commits after the fact (``Repo.annotate``, ``ckpt annotate``),
on SQLite and PostgreSQL.

What is checked: a commit's id and logged metrics never change; a newer value supersedes an
older one, which stays in the history; annotated values are queried like metrics (``where``,
``best``, ``metrics_along``, ``prune --keep-best``) and shown marked; a pruned commit can be
annotated; the store's journal carries them through a rebuild (a damaged entry is reported, never
applied) and through push and fetch; bad input changes nothing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptrepo
from ckptrepo.errors import ReadOnlyRepository, UnknownRevision, UsageError
from ckptrepo.ledger import journal
from ckptrepo.testing import parts


def _repo(path: Path, db_url: str | None, n: int = 4) -> tuple[ckptrepo.Repo, list[str]]:
    repo = ckptrepo.Repo.init(path, db_url=db_url)
    ids = [repo.commit({"w": torch.full((8,), float(i))}, step=i, metrics={"loss": 1.0 / (i + 1)},
                       blocking=True).wait().id for i in range(n)]
    return repo, ids


def _entries(repo: ckptrepo.Repo) -> list[tuple[str, dict[str, Any]]]:
    return [(k, e) for k, e in journal.read(parts(repo).backend).entries if e["op"] == "annotate"]


def test_annotate_keeps_id_history_and_queries(tmp_path: Path, db_url: str) -> None:
    repo, ids = _repo(tmp_path / "r", db_url)
    with repo:
        before = repo.get_commit(ids[1])
        after = repo.annotate(ids[1], metrics={"eval/acc": 0.5}, note="held-out v2", source="me")
        assert after.id == before.id and after.metrics == before.metrics == {"loss": 0.5}
        assert after.annotations == {"eval/acc": 0.5}
        repo.annotate(ids[1], metrics={"eval/acc": 0.75}, source="rerun")
        repo.annotate(ids[3], metrics={"eval/acc": 0.6, "eval/f1": 0.1})
        history = repo.annotations(ids[1])
        assert [(a.name, a.value, a.note, a.source, a.current) for a in history] == [
            ("eval/acc", 0.5, None, "me", False), (None, None, "held-out v2", "me", True),
            ("eval/acc", 0.75, None, "rerun", True)]
        assert [a.value for a in repo.annotations(ids[1], name="eval/acc")] == [0.5, 0.75]
        assert repo.get_commit(ids[1]).annotations == {"eval/acc": 0.75}
        # Wherever metrics are.
        assert [c.id for c in repo.log(where="eval/acc > 0.7")] == [ids[1]]
        assert [c.id for c in repo.log(where="eval/acc >= 0.6 and loss < 0.3")] == [ids[3]]
        assert [c.id for c in repo.best("eval/acc", maximize=True, limit=2)] == [ids[1], ids[3]]
        assert repo.best("eval/acc", maximize=True)[0].value("eval/acc") == 0.75
        assert {"eval/acc", "eval/f1", "loss"} <= set(repo.metric_names())
        along = repo.metrics_along(["eval/acc"])
        assert along is not None
        assert repo.get_commit(ids[0]).annotations == {}


def test_bad_input_changes_nothing(tmp_path: Path, db_url: str) -> None:
    repo, ids = _repo(tmp_path / "r", db_url, n=2)
    with repo:
        bad: list[dict[str, Any]] = [
            {}, {"metrics": {"loss": 2.0}}, {"metrics": {"": 1.0}}, {"metrics": {"x" * 256: 1.0}},
            {"metrics": {"a": "high"}}, {"metrics": {"a": True}}, {"note": "x" * (journal.MAX_NOTE + 1)},
            {"metrics": [("a", 1.0)]}, {"metrics": {"a": math.nan}}, {"metrics": {"a": -math.inf}},
        ]
        for kwargs in bad:
            with pytest.raises(UsageError):
                repo.annotate(ids[0], **kwargs)
        with pytest.raises(UnknownRevision):
            repo.annotate("f" * 12, metrics={"a": 1.0})
        assert repo.annotations(ids[0]) == [] and _entries(repo) == []
        assert repo.get_commit(ids[0]).metrics == {"loss": 1.0}
        import numpy as np

        assert repo.annotate(ids[0], metrics={"eval/n": np.float32(2.5), "eval/k": 3}).annotations == {
            "eval/n": 2.5, "eval/k": 3.0}
    with ckptrepo.Repo.open(tmp_path / "r", read_only=True) as ro, pytest.raises(ReadOnlyRepository):
        ro.annotate(ids[0], metrics={"a": 1.0})


def test_pruned_commit_annotated_and_gc_drops_unreachable(tmp_path: Path, db_url: str) -> None:
    repo, ids = _repo(tmp_path / "r", db_url, n=4)
    with repo:
        repo.prune(keep_last=1)
        assert repo.get_commit(ids[1]).pruned
        assert repo.annotate(ids[1], metrics={"eval/acc": 0.3}).annotations == {"eval/acc": 0.3}
        side = repo.commit({"w": torch.zeros(8)}, branch="side", parents=[ids[0]], blocking=True).wait()
        repo.annotate(side.id, metrics={"eval/acc": 0.9})
        repo.delete_branch("side", force=True)
        repo.gc(grace=0)
        assert [c.id for c in repo.log(where="eval/acc > 0")] == [ids[1]]
        assert repo.verify().ok


def test_rebuild_replays_annotations_and_refuses_damaged_entries(tmp_path: Path) -> None:
    repo, ids = _repo(tmp_path / "r", None, n=3)
    with repo:
        repo.annotate(ids[0], metrics={"eval/acc": 0.4}, note="first", source="a")
        repo.annotate(ids[0], metrics={"eval/acc": 0.8}, source="b")
        repo.annotate(ids[2], metrics={"eval/acc": 0.2})
        expected = {cid: [a.to_json() for a in repo.annotations(cid)] for cid in ids}
        backend = parts(repo).backend
        key = _entries(repo)[-1][0]  # ids[2]'s: tampered below
    report = ckptrepo.Repo.rebuild_database(tmp_path / "r", replace=True)
    assert report.ok
    with ckptrepo.Repo.open(tmp_path / "r") as again:
        assert {cid: [a.to_json() for a in again.annotations(cid)] for cid in ids} == expected
        assert again.get_commit(ids[0]).annotations == {"eval/acc": 0.8}
        assert again.verify().ok
        # A value changed in the stored entry: its checksum fails; the rebuild reports it, applies nothing.
        data = json.loads(backend.get(key))
        data["metrics"]["eval/acc"] = 0.99
        backend.put_bytes(key, json.dumps(data, sort_keys=True, separators=(",", ":")).encode())
    report = ckptrepo.Repo.rebuild_database(tmp_path / "r", replace=True)
    assert not report.ok and any(key in item for item in report.skipped)
    with ckptrepo.Repo.open(tmp_path / "r") as again:
        assert again.get_commit(ids[2]).annotations == {}
        assert again.get_commit(ids[0]).annotations == {"eval/acc": 0.8}


def test_push_and_fetch_carry_annotations(tmp_path: Path, db_url: str) -> None:
    repo, ids = _repo(tmp_path / "r", db_url, n=2)
    remote = str(tmp_path / "remote")
    with repo:
        repo.annotate(ids[0], metrics={"eval/acc": 0.5}, source="origin")
        repo.add_remote("origin", remote)
        assert repo.push("origin", ["main"]).annotations == 1
        clone = ckptrepo.Repo.clone(remote, tmp_path / "clone")
        with clone:
            assert clone.get_commit(ids[0]).annotations == {"eval/acc": 0.5}
            # Annotated after the push: an up-to-date push still carries it, and a fetch brings it.
            repo.annotate(ids[1], metrics={"eval/acc": 0.7})
            result = repo.push("origin", ["main"])
            assert result.annotations == 1 and not result.refs
            assert repo.push("origin", ["main"]).annotations == 0
            assert clone.fetch().annotations == 1
            assert clone.get_commit(ids[1]).annotations == {"eval/acc": 0.7}
            assert clone.fetch().annotations == 0
            # The clone's own result travels back; the newer value is current on both sides.
            clone.annotate(ids[0], metrics={"eval/acc": 0.55}, source="clone")
            clone.push()
            assert repo.fetch("origin").annotations == 1
            assert repo.get_commit(ids[0]).annotations == {"eval/acc": 0.55}
            assert [a.source for a in repo.annotations(ids[0])] == ["origin", "clone"]
            assert clone.verify().ok and repo.verify().ok


def test_cli_annotate_show_log_best(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from ckptrepo.cli.app import app

    repo, ids = _repo(tmp_path / "r", None, n=2)
    repo.close()
    monkeypatch.chdir(tmp_path / "r")
    runner = CliRunner()

    def ckpt(*args: str) -> Any:
        return runner.invoke(app, list(args), catch_exceptions=False)

    done = ckpt("annotate", ids[0][:10], "--metric", "eval/acc=0.5", "--note", "v2 \x1b[31mred", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["annotations"] == {"eval/acc": 0.5}
    assert ckpt("annotate", ids[0][:10], "--metric", "eval/acc=0.6").exit_code == 0
    shown = ckpt("show", ids[0][:10])
    assert "annotated" in shown.stdout and "eval/acc=0.6" in shown.stdout and "superseded" in shown.stdout
    assert "\x1b[31m" not in shown.stdout  # a stored note reaches the terminal escaped
    assert "[eval/acc=0.6]" in ckpt("log").stdout
    assert ids[0][:10] in ckpt("log", "--where", "eval/acc > 0.55").stdout
    best = ckpt("best", "-m", "eval/acc", "--max", "--json")
    assert json.loads(best.stdout)[0]["value"] == 0.6
    refused = ckpt("annotate", ids[0][:10], "--metric", "loss=2")
    assert refused.exit_code != 0 and "logged" in refused.output
    listed = ckpt("annotate", ids[1][:10])
    assert listed.exit_code == 0 and "no annotations" in listed.output


@pytest.mark.parametrize("damage", ["flip", "truncate", "rename"])
def test_fetch_refuses_damaged_remote_annotations(tmp_path: Path, damage: str) -> None:
    repo, ids = _repo(tmp_path / "r", None, n=2)
    remote = tmp_path / "remote"
    with repo:
        repo.add_remote("origin", str(remote))
        repo.push("origin", ["main"])
        clone = ckptrepo.Repo.clone(str(remote), tmp_path / "clone")
        repo.annotate(ids[0], metrics={"eval/acc": 0.5})
        repo.annotate(ids[1], metrics={"eval/acc": 0.25})
        repo.push("origin", ["main"])
    keys = sorted(p for p in (remote / "journal").iterdir() if p.name.endswith(".json"))
    target = next(p for p in keys if json.loads(p.read_bytes()).get("op") == "annotate")
    data = target.read_bytes()
    if damage == "flip":
        at = data.index(b"0.5")
        target.write_bytes(data[:at] + b"0.9" + data[at + 3:])
    elif damage == "truncate":
        target.write_bytes(data[: len(data) // 2])
    else:  # another entry's bytes under this key
        other = next(p for p in keys if p != target and json.loads(p.read_bytes()).get("op") == "annotate")
        target.write_bytes(other.read_bytes())
    with clone:
        result = clone.fetch()
        assert result.annotations == 1 and not result.ok
        assert any(target.name in item for item in result.skipped)
        values = {cid: clone.get_commit(cid).annotations for cid in ids}
        assert values[ids[1]] == {"eval/acc": 0.25}
        assert values[ids[0]] == {}  # never a damaged value
        assert clone.verify().ok
