"""``ckpt remote``, ``push``, ``fetch``, ``pull`` and ``clone`` through the command line: what a
user types, the exit codes and hints of refusals, and ``--json`` documents."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner, Result

from ckptrepo.cli.app import app
from ckptrepo.cli.remote_commands import _default_dir
from ckptrepo.types import short_id

Run = Callable[..., Result]


@pytest.fixture
def run() -> Run:
    runner = CliRunner()

    def invoke(repo: Path | None, *args: str) -> Result:
        return runner.invoke(app, (["--repo", str(repo)] if repo is not None else []) + list(args),
                             catch_exceptions=False)

    return invoke


def _file(tmp_path: Path, seed: int) -> Path:
    g = torch.Generator().manual_seed(seed)
    path = tmp_path / f"ckpt{seed}.safetensors"
    save_file({"w": torch.randn(3000, generator=g), "b": torch.full((4,), float(seed))}, str(path))
    return path


def _same(out: Path, original: Path) -> None:
    got, expected = load_file(str(out)), load_file(str(original))
    assert got.keys() == expected.keys()
    for k in expected:
        assert got[k].dtype == expected[k].dtype and got[k].shape == expected[k].shape
        assert got[k].view(torch.uint8).equal(expected[k].view(torch.uint8)), k


def _ok(result: Result) -> Result:
    assert result.exit_code == 0, result.output + result.stderr
    return result


def _json(result: Result) -> Any:
    return json.loads(_ok(result).stdout)


def test_remote_add_list_remove_and_their_errors(tmp_path: Path, run: Run) -> None:
    a = tmp_path / "a"
    _ok(run(a, "init"))
    _ok(run(a, "remote", "add", "origin", str(tmp_path / "r")))
    listed = _json(run(a, "remote", "list", "--json"))
    assert listed == [{"name": "origin", "url": str(tmp_path / "r"), "replicate": False, "lazy": False,
                       "branches": {}}]
    dup = run(a, "remote", "add", "origin", str(tmp_path / "elsewhere"))
    assert dup.exit_code == 4 and "exists already" in dup.stderr
    bad = run(a, "remote", "add", "no/slash", str(tmp_path / "x"))
    assert bad.exit_code == 2 and "cannot name a remote" in bad.stderr
    unknown = run(a, "remote", "remove", "origni")
    assert unknown.exit_code == 3 and "origin" in unknown.stderr  # did you mean
    _ok(run(a, "remote", "remove", "origin"))
    assert _json(run(a, "remote", "list", "--json")) == []


def test_push_clone_checkout_pull_and_a_refused_push(tmp_path: Path, run: Run) -> None:
    a, b, remote = tmp_path / "a", tmp_path / "b", tmp_path / "remote"
    _ok(run(a, "init", "--chunk-size", "4KiB"))
    for seed in range(2):
        _ok(run(a, "commit", str(_file(tmp_path, seed)), "--step", str(seed)))
    _ok(run(a, "remote", "add", "origin", str(remote)))
    pushed = _json(run(a, "push", "--json"))
    assert pushed["commits"] == 2 and pushed["refs"][0]["name"] == "main"
    assert "Everything up to date" in _ok(run(a, "push")).stdout
    assert _json(run(a, "push", "--json"))["refs"] == []
    cloned = _json(run(None, "clone", str(remote), str(b), "--json"))
    assert cloned["fetch"]["commits"] == 2 and cloned["branch"] == "main"
    log = _ok(run(b, "log")).stdout
    assert "origin/main" in log and "origin only" in log
    heads = [c["id"] for c in _json(run(a, "log", "--json"))]
    assert [c["id"] for c in _json(run(b, "log", "--json"))] == heads
    assert all(short_id(h) in log for h in heads)
    out = tmp_path / "out.safetensors"
    _ok(run(b, "checkout", "main~1", "-o", str(out)))
    _same(out, _file(tmp_path, 0))
    _ok(run(b, "checkout", "main", "-o", str(tmp_path / "out1.safetensors")))
    _same(tmp_path / "out1.safetensors", _file(tmp_path, 1))
    # a commit in the clone, pushed; the first repository pulls it
    _ok(run(b, "commit", str(_file(tmp_path, 5)), "--step", "5"))
    _ok(run(b, "push"))
    pulled = _json(run(a, "pull", "--json"))
    assert pulled["new"] != pulled["old"] and pulled["branch"] == "main"
    # diverged: a commit on each side, the second push is refused
    _ok(run(a, "commit", str(_file(tmp_path, 6)), "--step", "6"))
    _ok(run(b, "commit", str(_file(tmp_path, 7)), "--step", "7"))
    _ok(run(b, "push"))
    refused = run(a, "push")
    assert refused.exit_code == 4 and "fetch" in refused.stderr and "fast-forward" in refused.stderr
    diverged = run(a, "pull")
    assert diverged.exit_code == 4 and "diverged" in diverged.stderr
    forced = _json(run(a, "push", "--force", "--json"))
    assert forced["refs"][0]["forced"] is True
    assert "origin/main" in _ok(run(b, "fetch")).stdout


def test_fetch_data_keeps_bytes_and_status_shows_the_replica(tmp_path: Path, run: Run) -> None:
    a, b, remote = tmp_path / "a", tmp_path / "b", tmp_path / "remote"
    _ok(run(a, "init", "--chunk-size", "4KiB"))
    _ok(run(a, "remote", "add", "origin", str(remote), "--replicate"))
    _ok(run(a, "commit", str(_file(tmp_path, 1)), "--step", "1"))
    status = _json(run(a, "status", "--json"))
    assert status["replication"]["remote"] == "origin"
    _ok(run(a, "push"))
    _ok(run(None, "clone", str(remote), str(b)))
    fetched = _json(run(b, "fetch", "--data", "main", "--json"))
    assert fetched["data_chunks"] > 0
    assert "origin only" not in _ok(run(b, "log")).stdout
    shown = _ok(run(b, "show", "main")).stdout
    assert "local+origin" in shown


def test_clone_of_an_s3_remote(tmp_path: Path, run: Run, s3_url: str) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _ok(run(a, "init", "--chunk-size", "4KiB"))
    _ok(run(a, "commit", str(_file(tmp_path, 3)), "--step", "3"))
    _ok(run(a, "remote", "add", "origin", s3_url))
    _ok(run(a, "push"))
    cloned = _json(run(None, "clone", s3_url, str(b), "--json"))
    assert cloned["fetch"]["commits"] == 1 and cloned["branch"] == "main"
    assert "origin/main" in _ok(run(b, "log")).stdout
    out = tmp_path / "out.safetensors"
    _ok(run(b, "checkout", "main", "-o", str(out)))
    _same(out, _file(tmp_path, 3))


def test_push_and_pull_say_what_moved(tmp_path: Path, run: Run) -> None:
    a, b, remote = tmp_path / "a", tmp_path / "b", tmp_path / "remote"
    _ok(run(a, "init", "--chunk-size", "4KiB"))
    _ok(run(a, "commit", str(_file(tmp_path, 0)), "--step", "0"))
    _ok(run(a, "tag", "v0"))
    _ok(run(a, "remote", "add", "origin", str(remote)))
    listed = _ok(run(a, "remote", "list")).stdout
    assert [line.split() for line in listed.splitlines()] == [["origin", str(remote)]]
    first = _ok(run(a, "push", "origin", "main", "v0")).stdout
    head0 = _json(run(a, "log", "--json"))[0]["id"]
    assert f" * [new branch] main -> {short_id(head0)}" in first
    assert f" * [new tag] v0 -> {short_id(head0)}" in first
    assert "1 commit(s)" in first and "uploaded to origin" in first
    listed = _ok(run(a, "remote", "list")).stdout
    assert ["origin/main", short_id(head0)] in [line.split() for line in listed.splitlines()]
    _ok(run(None, "clone", str(remote), str(b)))
    _ok(run(a, "commit", str(_file(tmp_path, 1)), "--step", "1"))
    head1 = _json(run(a, "log", "--json"))[0]["id"]
    second = _ok(run(a, "push")).stdout
    assert f"   {short_id(head0)}..{short_id(head1)} main" in second and "(forced)" not in second
    pulled = _ok(run(b, "pull")).stdout
    assert "1 new commit(s) from origin" in pulled
    assert f"main: {short_id(head0)}..{short_id(head1)} (fast-forward)" in pulled
    assert "main is up to date" in _ok(run(b, "pull")).stdout
    out = tmp_path / "out.safetensors"
    _ok(run(b, "checkout", "main", "-o", str(out)))
    _same(out, _file(tmp_path, 1))


def test_lazy_clone_fetches_all_data_before_its_remote_goes(tmp_path: Path, run: Run) -> None:
    a, b, remote = tmp_path / "a", tmp_path / "b", tmp_path / "remote"
    _ok(run(a, "init", "--chunk-size", "4KiB"))
    for seed in range(2):
        _ok(run(a, "commit", str(_file(tmp_path, seed)), "--step", str(seed)))
    _ok(run(a, "remote", "add", "origin", str(remote)))
    _ok(run(a, "push"))
    cloned = _ok(run(None, "clone", str(remote), str(b))).stdout
    assert f"Cloned into {b}" in cloned and "2 new commit(s) from origin" in cloned
    assert cloned.rstrip().endswith("on branch main")
    assert "(lazy)" in _ok(run(b, "remote", "list")).stdout
    refused = run(b, "remote", "remove", "origin")
    assert refused.exit_code == 2 and "--all-data" in refused.stderr
    fetched = _json(run(b, "fetch", "--all-data", "--json"))
    assert fetched["data_chunks"] > 0 and fetched["ok"] is True
    _ok(run(b, "remote", "remove", "origin"))
    out = tmp_path / "out.safetensors"
    _ok(run(b, "checkout", "main~1", "-o", str(out)))
    _same(out, _file(tmp_path, 0))


def test_clone_names_its_folder_after_the_url(tmp_path: Path, run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    a, remote, work = tmp_path / "a", tmp_path / "runs" / "r7.ckpt", tmp_path / "work"
    _ok(run(a, "init", "--chunk-size", "4KiB"))
    _ok(run(a, "commit", str(_file(tmp_path, 2)), "--step", "2"))
    _ok(run(a, "remote", "add", "origin", str(remote)))
    _ok(run(a, "push"))
    work.mkdir()
    monkeypatch.chdir(work)
    assert _json(run(None, "clone", str(remote), "--json"))["path"] == str(work / "r7")
    again = run(None, "clone", str(remote))  # r7 is taken now
    assert again.exit_code == 2 and "exists already" in again.stderr and "DIR" in again.stderr
    assert _json(run(None, "clone", str(a / ".ckpt"), "--json"))["path"] == str(work / "a")  # a working repository
    # beside the remote, its default folder is the remote itself: refused, the remote left as it was
    monkeypatch.chdir(remote.parent)
    plain = tmp_path / "runs" / "plain"
    _ok(run(a, "remote", "add", "plain", str(plain)))
    _ok(run(a, "push", "plain"))
    before = sorted(p.name for p in plain.iterdir())
    beside = run(None, "clone", str(plain))
    assert beside.exit_code == 2 and "exists already" in beside.stderr
    assert sorted(p.name for p in plain.iterdir()) == before
    bad = run(None, "clone", "/")
    assert bad.exit_code == 2 and "cannot name a folder" in bad.stderr


@pytest.mark.parametrize(("url", "name"), [
    ("/data/run.ckpt", "run"),
    ("/data/run7", "run7"),
    ("/work/proj/.ckpt", "proj"),
    ("/work/proj/.ckpt/store", "proj"),
    ("file:///data/my%20run.ckpt", "my run"),
    ("s3://bucket/team/run7", "run7"),
    ("s3://bucket/team/run7/", "run7"),
    ("s3://bucket/team/run7/store?endpoint_url=http://127.0.0.1:9000", "run7"),
    ("s3://bucket", "bucket"),
])
def test_default_clone_folder(url: str, name: str) -> None:
    assert _default_dir(url) == name


def test_clone_into_the_remotes_own_folder_is_refused(tmp_path: Path, run: Run) -> None:
    a, remote = tmp_path / "a", tmp_path / "remote"
    _ok(run(a, "init"))
    _ok(run(a, "commit", str(_file(tmp_path, 0)), "--step", "0"))
    _ok(run(a, "remote", "add", "origin", str(remote)))
    _ok(run(a, "push"))
    refused = run(None, "clone", str(remote), str(remote))
    assert refused.exit_code != 0 and not (remote / ".ckpt").exists()
    _ok(run(a, "commit", str(_file(tmp_path, 1)), "--step", "1"))
    _ok(run(a, "push"))


def test_a_forced_push_that_fast_forwards_is_not_marked_forced(tmp_path: Path, run: Run) -> None:
    a = tmp_path / "a"
    _ok(run(a, "init"))
    _ok(run(a, "commit", str(_file(tmp_path, 0)), "--step", "0"))
    _ok(run(a, "remote", "add", "origin", str(tmp_path / "remote")))
    _ok(run(a, "push"))
    _ok(run(a, "commit", str(_file(tmp_path, 1)), "--step", "1"))
    assert _json(run(a, "push", "--force", "--json"))["refs"][0]["forced"] is False


def test_fetch_after_a_forced_push_marks_the_update_forced(tmp_path: Path, run: Run) -> None:
    a, b, remote = tmp_path / "a", tmp_path / "b", tmp_path / "remote"
    _ok(run(a, "init"))
    _ok(run(a, "commit", str(_file(tmp_path, 0)), "--step", "0"))
    _ok(run(a, "remote", "add", "origin", str(remote)))
    _ok(run(a, "push"))
    _ok(run(None, "clone", str(remote), str(b)))
    _ok(run(b, "commit", str(_file(tmp_path, 1)), "--step", "1"))
    _ok(run(b, "push"))
    _ok(run(a, "commit", str(_file(tmp_path, 2)), "--step", "2"))
    _ok(run(a, "push", "--force"))
    fetched = _json(run(b, "fetch", "--json"))
    assert [(r["name"], r["forced"]) for r in fetched["refs"]] == [("origin/main", True)]
