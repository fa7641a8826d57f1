"""The current branch in the CLI (``.ckpt/HEAD``, like git) and ``commit --transfer-from``.

``checkout BRANCH`` switches, ``checkout -b NEW [REV]`` starts a branch and switches to it,
``checkout REV -o FILE`` exports without switching; ``commit`` without ``-b`` commits on the
current branch, ``log`` without REV shows it, ``branch`` marks it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner, Result

from ckptrepo import Repo, errors
from ckptrepo.cli import session
from ckptrepo.cli.app import app

Run = Callable[..., Result]


@pytest.fixture
def work(tmp_path: Path, db_url: str) -> Path:
    return tmp_path / "work"


@pytest.fixture
def run(work: Path, db_url: str) -> Run:
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        return runner.invoke(app, ["--repo", str(work), *args], catch_exceptions=False)

    result = invoke("init", "--chunk-size", "4KiB", "--db", db_url)
    assert result.exit_code == 0, result.stderr
    return invoke


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    paths = []
    for i in range(4):
        path = tmp_path / f"state{i}.safetensors"
        save_file({"w": torch.full((64,), float(i)), "b": torch.zeros(4)}, str(path))
        paths.append(path)
    return paths


def _json(result: Result) -> Any:
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _head(work: Path) -> str | None:
    path = work / ".ckpt" / "HEAD"
    return path.read_text().strip() if path.exists() else None


def test_checkout_b_switch_and_commit_on_current_branch(run: Run, work: Path, files: list[Path]) -> None:
    first = _json(run("commit", str(files[0]), "--json"))
    assert first["branch"] == "main" and _head(work) is None  # no HEAD file: main

    created = _json(run("checkout", "-b", "explore", "--json"))
    assert created == {"branch": "explore", "commit_id": first["id"], "short_id": first["id"][:10], "created": True}
    assert _head(work) == "explore"
    second = _json(run("commit", str(files[1]), "--json"))
    assert second["branch"] == "explore" and [p["id"] for p in second["parents"]] == [first["id"]]
    branches = {b["name"]: b for b in _json(run("branch", "--json"))}
    assert branches["main"]["commit_id"] == first["id"] and not branches["main"]["current"]
    assert branches["explore"]["commit_id"] == second["id"] and branches["explore"]["current"]
    listing = run("branch")
    assert "* explore" in listing.stdout and "  main" in listing.stdout

    switched = run("checkout", "main")
    assert switched.exit_code == 0 and "switched to branch main" in switched.stdout
    assert _head(work) == "main"
    third = _json(run("commit", str(files[2]), "--json"))
    assert third["branch"] == "main" and [p["id"] for p in third["parents"]] == [first["id"]]
    assert "already on main" in run("checkout", "main").stdout

    # -b with a start point; `branch NAME` defaults to the current branch's head and does not switch.
    assert _json(run("checkout", "-b", "old", first["id"][:8], "--json"))["commit_id"] == first["id"]
    assert _json(run("branch", "tip", "--json"))["commit_id"] == first["id"]
    assert _head(work) == "old"
    assert _json(run("commit", str(files[3]), "-b", "main", "--json"))["branch"] == "main"  # -b still wins
    assert _head(work) == "old"
    assert not list((work / ".ckpt").glob(".HEAD.*"))  # no temp file left by the atomic writes


def test_log_defaults_to_current_branch(run: Run, files: list[Path]) -> None:
    main = _json(run("commit", str(files[0]), "--json"))
    run("checkout", "-b", "side")
    side = _json(run("commit", str(files[1]), "--json"))
    run("checkout", "main")
    main2 = _json(run("commit", str(files[2]), "--json"))
    assert [c["id"] for c in _json(run("log", "--json"))] == [main2["id"], main["id"]]
    run("checkout", "side")
    assert [c["id"] for c in _json(run("log", "--json"))] == [side["id"], main["id"]]
    assert {c["id"] for c in _json(run("log", "--all", "--json"))} == {main["id"], side["id"], main2["id"]}


def test_log_start(tmp_path: Path) -> None:
    with Repo.init(tmp_path) as repo:
        assert session.log_start(repo, None) is None  # empty repository: nothing to show either way
        repo.commit({"w": torch.ones(2)}, blocking=True).wait()
        assert session.log_start(repo, None) == "main"
        assert session.log_start(repo, None, all_commits=True) is None
        assert session.log_start(repo, "main~0") == "main~0"
        repo.switch("nothing-yet")
        with pytest.raises(errors.UsageError, match="no commits yet"):
            session.log_start(repo, None)


def test_checkout_refusals(run: Run, work: Path, files: list[Path]) -> None:
    empty = run("checkout", "-b", "x")
    assert empty.exit_code == 2 and "no commits yet" in empty.stderr
    commit = _json(run("commit", str(files[0]), "--json"))
    run("tag", "v1")
    cases = [
        (("checkout", "nope"), 3, "Unknown revision"),
        (("checkout", "v1"), 2, "not a branch"),
        (("checkout", "main~0"), 2, "checkout -b NEW main~0"),
        (("checkout", "-b", "main"), 4, "already exists"),
        (("checkout", "-b", "bad..name"), 2, "Invalid branch name"),
        (("checkout",), 2, "needs a BRANCH"),
        (("checkout", "-b", "y", "main", "-o", str(work / "x.pt")), 2, "takes no -b"),
    ]
    for args, code, message in cases:
        result = run(*args)
        assert result.exit_code == code, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
    assert _head(work) is None

    out = work / "main.safetensors"
    exported = _json(run("checkout", "main", "-o", str(out), "--json"))
    assert exported["id"] == commit["id"] and out.is_file() and _head(work) is None


def test_damaged_head_is_reported_and_fixed_by_checkout(run: Run, work: Path, files: list[Path]) -> None:
    _json(run("commit", str(files[0]), "--json"))
    (work / ".ckpt" / "HEAD").write_text("../../etc\n")
    failed = run("commit", str(files[1]))
    assert failed.exit_code == 2 and "not a branch name" in failed.stderr and "ckpt checkout" in failed.stderr
    assert run("checkout", "main").exit_code == 0
    assert _head(work) == "main"
    assert _json(run("commit", str(files[1]), "--json"))["branch"] == "main"


def test_commit_transfer_from(run: Run, tmp_path: Path, files: list[Path]) -> None:
    base = _json(run("commit", str(files[0]), "--json"))
    run("checkout", "-b", "finetune")
    plain = _json(run("commit", str(files[1]), "--transfer-from", "main", "--json"))
    kinds = [(p["id"], p["kind"]) for p in plain["parents"]]
    assert kinds == [(base["id"], "parent")]  # the transfer source is the parent already: no second edge

    other = tmp_path / "other.safetensors"
    save_file({"head.w": torch.full((64,), 0.0), "extra": torch.ones(3)}, str(other))
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps({"head.w": "w"}))
    unrelated = _json(run("commit", str(other), "-b", "new-root", "--transfer-from", f"main:{mapping}", "--json"))
    transfer = [p for p in unrelated["parents"] if p["kind"] == "transfer"]
    assert transfer == [{"id": base["id"], "kind": "transfer", "mapping": {"head.w": "w"}}]
    root = _json(run("commit", str(files[2]), "-b", "root2", "--transfer-from", "main", "--json"))
    assert [(p["id"], p["kind"]) for p in root["parents"]] == [(base["id"], "transfer")]

    mapping.write_text(json.dumps({"head.w": "ww"}))
    bad = run("commit", str(other), "-b", "x", "--transfer-from", f"main:{mapping}")
    assert bad.exit_code == 2 and "'ww'" in bad.stderr and "Did you mean 'w'" in bad.stderr
    mapping.write_text(json.dumps({"head.x": "w"}))
    assert run("commit", str(other), "-b", "x", "--transfer-from", f"main:{mapping}").exit_code == 2
    mapping.write_text("[1, 2]")
    assert run("commit", str(other), "-b", "x", "--transfer-from", f"main:{mapping}").exit_code == 2
    missing = run("commit", str(other), "-b", "x", "--transfer-from", f"main:{tmp_path / 'none.json'}")
    assert missing.exit_code == 2 and "no mapping file" in missing.stderr
    assert run("commit", str(other), "-b", "x", "--transfer-from", "nope").exit_code == 3
