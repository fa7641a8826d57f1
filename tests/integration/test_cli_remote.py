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
    cloned = _json(run(None, "clone", str(remote), str(b), "--json"))
    assert cloned["fetch"]["commits"] == 2 and cloned["branch"] == "main"
    log = _ok(run(b, "log")).stdout
    assert "origin/main" in log and "origin only" in log
    out = tmp_path / "out.safetensors"
    _ok(run(b, "checkout", "main~1", "-o", str(out)))
    expected = load_file(str(_file(tmp_path, 0)))
    got = load_file(str(out))
    assert all(torch.equal(got[k], expected[k]) for k in expected)
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
    status = _ok(run(b, "fetch")).stdout
    assert "(forced)" not in status and "origin/main" in status


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
    _ok(run(None, "clone", s3_url, str(b)))
    out = tmp_path / "out.safetensors"
    _ok(run(b, "checkout", "main", "-o", str(out)))
    assert torch.equal(load_file(str(out))["w"], load_file(str(_file(tmp_path, 3)))["w"])
