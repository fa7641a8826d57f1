"""The ``ckpt`` command line, end to end: output contracts, exit codes, and no change on failure."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner, Result

from ckptrepo import Repo, errors
from ckptrepo.cli import options
from ckptrepo.cli.app import app
from ckptrepo.testing import assert_states_equal

Run = Callable[..., Result]


def _tensors(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(64, 32, generator=g),
        "layers.0.attn.q.weight": torch.randn(32, 32, generator=g).to(torch.bfloat16),
        "layers.0.norm.bias": torch.randn(32, generator=g).to(torch.float16),
        "head.weight": torch.randn(8, 32, generator=g).to(torch.float64),
        "position_ids": torch.arange(128, dtype=torch.int64).reshape(1, 128),
        "mask": torch.rand(16, generator=g) > 0.5,
    }


@pytest.fixture
def run(tmp_path: Path) -> Run:
    """``run(*args)`` invokes ``ckpt --repo <tmp>/work *args`` in-process; ``repo=None`` drops --repo."""
    runner = CliRunner()

    def invoke(*args: str, repo: Path | None = tmp_path / "work") -> Result:
        argv = (["--repo", str(repo)] if repo is not None else []) + list(args)
        return runner.invoke(app, argv, catch_exceptions=False)

    return invoke


@pytest.fixture
def work(run: Run, tmp_path: Path) -> Path:
    """An initialised repository folder (small chunks, so tensors span several)."""
    result = run("init", "--chunk-size", "4KiB")
    assert result.exit_code == 0, result.stderr
    return tmp_path / "work"


@pytest.fixture
def checkpoints(tmp_path: Path) -> list[Path]:
    """Two related safetensors files: the second changes one tensor of the first."""
    first = _tensors(0)
    second = dict(first, **{"head.weight": first["head.weight"] + 1})
    paths = [tmp_path / "step100.safetensors", tmp_path / "step200.safetensors"]
    save_file(first, str(paths[0]))
    save_file(second, str(paths[1]))
    return paths


def _json(result: Result) -> Any:
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _snapshot(run: Run) -> dict[str, Any]:
    """Everything a failed command must leave as it was: stats and every commit's `show --json`."""
    log = _json(run("log", "--json"))
    return {
        "stats": _json(run("stats", "--json")),
        "log": log,
        "show": {c["id"]: _json(run("show", c["id"], "--json")) for c in log},
    }


def _assert_one_line_error(result: Result, code: int) -> None:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and len(lines[0]) > len("error: ")
    assert len(lines) == 2 and lines[1].startswith("hint: "), lines
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def _committed(run: Run, checkpoints: list[Path]) -> list[dict[str, Any]]:
    a = _json(run("commit", str(checkpoints[0]), "-m", "first", "--step", "100", "--metric", "loss=2.5", "--json"))
    b = _json(
        run(
            "commit", str(checkpoints[1]), "-m", "second", "--step", "200", "--epoch", "1",
            "--metric", "loss=1.25", "--metric", "acc=0.5", "--json",
        )
    )  # fmt: skip
    return [a, b]


# -- happy paths ---------------------------------------------------------------------------------


def test_init_json(run: Run, tmp_path: Path) -> None:
    doc = _json(run("init", str(tmp_path / "fresh"), "--chunk-size", "512KiB", "--json"))
    assert doc["path"] == str((tmp_path / "fresh").resolve())
    assert doc["repo_dir"] == str((tmp_path / "fresh" / ".ckpt").resolve())
    assert len(doc["repo_id"]) == 32
    assert doc["chunk_size"] == 512 * 1024
    assert doc["compression"] is True
    with Repo.open(tmp_path / "fresh") as repo:
        assert repo.config.repo_id == doc["repo_id"]


def test_commit_json_has_figures(run: Run, work: Path, checkpoints: list[Path]) -> None:
    first, second = _committed(run, checkpoints)
    for doc in (first, second):
        for key in ("id", "short_id", "logical_bytes", "new_bytes", "stored_bytes", "branch"):
            assert key in doc, key
        assert doc["branch"] == "main"
        assert doc["id"].startswith(doc["short_id"])
    logical = sum(t.numel() * t.element_size() for t in _tensors(0).values())
    assert first["logical_bytes"] == second["logical_bytes"] == logical
    assert first["new_bytes"] == logical
    # Only head.weight changed: the second commit adds just its chunks.
    assert 0 < second["new_bytes"] <= _tensors(0)["head.weight"].numel() * 8
    assert second["parents"] == [{"id": first["id"], "kind": "parent", "mapping": None}]
    assert second["metrics"] == {"loss": 1.25, "acc": 0.5}
    assert (second["step"], second["epoch"], second["message"]) == (200, 1, "second")


def test_commit_human_output(run: Run, work: Path, checkpoints: list[Path]) -> None:
    result = run("commit", str(checkpoints[0]), "--step", "7")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("committed ")
    assert "on main at step 7" in result.stdout
    assert "KiB" in result.stdout


def test_commit_of_several_files_imports_them_in_order(run: Run, work: Path, checkpoints: list[Path],
                                                        tmp_path: Path) -> None:
    """One commit per input, in the order given, each on the one before, named after its file;
    every state restores bit-exactly."""
    third = tmp_path / "step300.pt"
    torch.save(dict(_tensors(0), **{"embed.weight": _tensors(1)["embed.weight"]}), third)
    inputs = [checkpoints[1], checkpoints[0], third]
    docs = _json(run("commit", *map(str, inputs), "-b", "imported", "-m", "run 7", "--json"))
    assert [d["message"] for d in docs] == [f"run 7: {p.name}" for p in inputs]
    assert docs[0]["parents"] == []
    assert [d["parents"][0]["id"] for d in docs[1:]] == [d["id"] for d in docs[:-1]]
    assert all(d["branch"] == "imported" for d in docs)
    assert [c["id"] for c in _json(run("log", "imported", "--json"))] == [d["id"] for d in reversed(docs)]
    with Repo.open(work) as repo:
        expected = [load_file(str(checkpoints[1])), load_file(str(checkpoints[0])), torch.load(third)]
        for doc, want in zip(docs, expected, strict=True):
            assert_states_equal(repo.checkout(doc["id"]), want)
    human = run("commit", *map(str, checkpoints))
    assert human.exit_code == 0 and human.stdout.count("committed ") == 2


def test_commit_of_several_files_stops_at_a_bad_one_and_keeps_the_ones_before(
    run: Run, work: Path, checkpoints: list[Path], tmp_path: Path
) -> None:
    bad = tmp_path / "broken.safetensors"
    bad.write_bytes(checkpoints[0].read_bytes()[:-50])
    result = run("commit", str(checkpoints[0]), str(bad), str(checkpoints[1]))
    assert result.exit_code == errors.InvalidInput.exit_code
    assert "broken.safetensors" in result.stderr
    assert "1 of 3 inputs were committed before it" in " ".join(result.stderr.split())
    log = _json(run("log", "--json"))
    assert [c["message"] for c in log] == [checkpoints[0].name]


@pytest.mark.parametrize("option", [["--step", "3"], ["--epoch", "1"], ["--metric", "loss=1"], ["--parent", "main"]])
def test_per_state_options_with_several_files_are_a_usage_error(
    run: Run, work: Path, checkpoints: list[Path], option: list[str]
) -> None:
    _committed(run, checkpoints)
    before = _snapshot(run)
    result = run("commit", *map(str, checkpoints), *option)
    _assert_one_line_error(result, errors.UsageError.exit_code)
    assert option[0] in result.stderr
    assert _snapshot(run) == before


def test_log_show_branch_tag_stats(run: Run, work: Path, checkpoints: list[Path]) -> None:
    first, second = _committed(run, checkpoints)

    log = _json(run("log", "--json"))
    assert [c["id"] for c in log] == [second["id"], first["id"]]
    assert _json(run("log", "-n", "1", "--json"))[0]["id"] == second["id"]
    assert [c["id"] for c in _json(run("log", "main~1", "--json"))] == [first["id"]]
    human = run("log")
    assert human.exit_code == 0
    assert first["short_id"] in human.stdout and second["short_id"] in human.stdout
    assert "loss=1.25" in human.stdout and "second" in human.stdout

    shown = _json(run("show", second["short_id"], "--json"))
    assert shown["id"] == second["id"]
    assert shown["parents"][0]["kind"] == "parent"
    assert {t["name"] for t in shown["tensors"]} == set(_tensors(0))
    head = next(t for t in shown["tensors"] if t["name"] == "head.weight")
    assert (head["dtype"], head["shape"], head["nbytes"]) == ("float64", [8, 32], 8 * 32 * 8)
    for key in ("logical_bytes", "new_bytes", "stored_bytes", "stall_s", "wait_s", "persist_s"):
        assert key in shown
    human = run("show", "main")
    assert human.exit_code == 0
    for text in (second["id"], first["id"], "layers.0.attn.q.weight", "bfloat16", "[32, 32]", "2 KiB"):
        assert text in human.stdout, text

    created = _json(run("branch", "exp", "main~1", "--json"))
    assert created == {"name": "exp", "kind": "branch", "commit_id": first["id"]}
    branches = _json(run("branch", "--json"))
    assert {b["name"]: b["commit_id"] for b in branches} == {"main": second["id"], "exp": first["id"]}
    assert "exp" in run("branch").stdout
    on_exp = _json(run("commit", str(checkpoints[1]), "-b", "exp", "--step", "150", "--json"))
    assert on_exp["branch"] == "exp" and on_exp["parents"][0]["id"] == first["id"]
    assert on_exp["new_bytes"] == 0  # the same bytes as the second commit: nothing new to store
    assert _json(run("show", "exp@step=150", "--json"))["id"] == on_exp["id"]

    tagged = _json(run("tag", "v1", first["short_id"], "--json"))
    assert tagged == {"name": "v1", "kind": "tag", "commit_id": first["id"]}
    assert [t["name"] for t in _json(run("tag", "--json"))] == ["v1"]
    assert run("tag", "v2").exit_code == 0
    assert {t["name"] for t in _json(run("tag", "--json"))} == {"v1", "v2"}
    assert "tag:v1" in _json(run("show", "v1", "--json"))["refs"]

    stats = _json(run("stats", "--json"))
    for key in ("commits", "logical_bytes", "unique_bytes", "stored_bytes", "dedup_ratio", "compression_ratio"):
        assert key in stats, key
    assert stats["commits"] == 3 and stats["branches"] == 2 and stats["tags"] == 2
    assert stats["logical_bytes"] == 3 * first["logical_bytes"]
    assert stats["unique_bytes"] == first["new_bytes"] + second["new_bytes"]
    human = run("stats")
    assert human.exit_code == 0 and "dedup" in human.stdout and "KiB" in human.stdout


def test_merge_with_two_parents(run: Run, work: Path, checkpoints: list[Path]) -> None:
    first, second = _committed(run, checkpoints)
    assert run("branch", "side", first["id"]).exit_code == 0
    side = _json(run("commit", str(checkpoints[0]), "-b", "side", "--json"))
    merged = _json(run("commit", str(checkpoints[1]), "--parent", "main", "--parent", "side", "--json"))
    assert [p["id"] for p in merged["parents"]] == [second["id"], side["id"]]
    assert merged["parents"][1]["kind"] == "merge"


def test_checkout_safetensors_and_pt_are_bit_identical(
    run: Run, work: Path, checkpoints: list[Path], tmp_path: Path
) -> None:
    first, _ = _committed(run, checkpoints)

    out = tmp_path / "out" / "x.safetensors"
    out.parent.mkdir()
    doc = _json(run("checkout", "main~1", "-o", str(out), "--json"))
    assert doc["id"] == first["id"] and doc["path"] == str(out) and doc["bytes"] == out.stat().st_size
    assert_states_equal(load_file(str(out)), _tensors(0))

    pt = tmp_path / "out" / "x.pt"
    result = run("checkout", "main", "-o", str(pt))
    assert result.exit_code == 0, result.stderr
    assert "wrote " in result.stdout
    loaded = torch.load(pt, weights_only=True)
    assert_states_equal(loaded, load_file(str(checkpoints[1])))


def test_commit_pt_file_roundtrip(run: Run, work: Path, tmp_path: Path) -> None:
    src = tmp_path / "state.pt"
    torch.save(_tensors(3), src)
    doc = _json(run("commit", str(src), "--json"))
    out = tmp_path / "back.safetensors"
    assert run("checkout", doc["short_id"], "-o", str(out)).exit_code == 0
    assert_states_equal(load_file(str(out)), _tensors(3))


def test_commit_hugging_face_folder(run: Run, work: Path, tmp_path: Path) -> None:
    tensors = _tensors(4)
    folder = tmp_path / "hf-model"
    folder.mkdir()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:3], "model-00002-of-00002.safetensors": names[3:]}
    for shard, shard_names in shards.items():
        save_file({n: tensors[n] for n in shard_names}, str(folder / shard))
    index = {"metadata": {}, "weight_map": {n: shard for shard, ns in shards.items() for n in ns}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    doc = _json(run("commit", str(folder), "-m", "hf", "--json"))
    assert doc["n_tensors"] == len(tensors)
    out = tmp_path / "merged.safetensors"
    assert run("checkout", "main", "-o", str(out)).exit_code == 0
    assert_states_equal(load_file(str(out)), tensors)


def test_checkout_of_a_training_state(run: Run, work: Path, tmp_path: Path) -> None:
    """A commit made by a training loop (module, optimizer, scheduler) is written out as plain tensors."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    torch.autograd.backward(model(torch.randn(4, 8)).sum())
    opt.step()
    sched.step()
    with Repo.open(work) as repo:
        repo.commit({"model": model, "optim": opt, "sched": sched}, step=1, metrics={"loss": 0.5}).wait()
    names = {t["name"] for t in _json(run("show", "main", "--json"))["tensors"]}
    assert {"model/0.weight", "model/2.bias"} <= names

    pt = tmp_path / "train.pt"
    assert run("checkout", "main", "-o", str(pt)).exit_code == 0
    loaded = torch.load(pt, weights_only=True)
    assert_states_equal(dict(loaded["model"]), dict(model.state_dict()))
    st = tmp_path / "train.safetensors"
    assert run("checkout", "main", "-o", str(st)).exit_code == 0
    flat = load_file(str(st))
    assert_states_equal(flat["model/0.weight"], model.state_dict()["0.weight"])


def test_repository_is_discovered_from_a_subfolder(
    run: Run, work: Path, checkpoints: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _committed(run, checkpoints)
    nested = work / "runs" / "a"
    nested.mkdir(parents=True)
    monkeypatch.chdir(nested)
    monkeypatch.delenv("CKPT_REPO", raising=False)
    assert len(_json(run("log", "--json", repo=None))) == 2


def test_version_and_help(run: Run) -> None:
    result = run("--version", repo=None)
    assert result.exit_code == 0 and result.stdout.startswith("ckpt ")
    for command in ([], ["commit"], ["checkout"], ["log"], ["show"], ["branch"], ["tag"], ["db", "upgrade"]):
        result = run(*command, "--help", repo=None)
        assert result.exit_code == 0, command
        assert "Usage" in result.stdout


def test_init_with_database_url(run: Run, tmp_path: Path, db_url: str, checkpoints: list[Path]) -> None:
    doc = _json(run("init", str(tmp_path / "shared"), "--db", db_url, "--json"))
    assert doc["db_url"] is not None
    committed = _json(run("commit", str(checkpoints[0]), "--json", repo=tmp_path / "shared"))
    assert [c["id"] for c in _json(run("log", "--json", repo=tmp_path / "shared"))] == [committed["id"]]


def test_outdated_schema_is_reported_and_db_upgrade_still_runs(
    run: Run, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckptrepo.db import migrate

    def outdated(*args: Any, **kwargs: Any) -> None:
        raise errors.SchemaOutdated(current="0000", head="0001")

    monkeypatch.setattr(migrate, "check_schema", outdated)
    result = run("log")
    _assert_one_line_error(result, errors.SchemaOutdated.exit_code)
    assert "ckpt db upgrade" in result.stderr
    assert _json(run("db", "upgrade", "--json"))["to_revision"]


def test_db_upgrade_on_current_schema_is_a_no_op(run: Run, work: Path) -> None:
    doc = _json(run("db", "upgrade", "--json"))
    assert doc["from_revision"] == doc["to_revision"] and doc["upgraded"] is False
    assert "already" in run("db", "upgrade").stdout


# -- failures: one line, the right exit code, nothing changed -------------------------------------


def test_truncated_safetensors_is_refused(run: Run, work: Path, checkpoints: list[Path], tmp_path: Path) -> None:
    _committed(run, checkpoints)
    before = _snapshot(run)
    data = checkpoints[0].read_bytes()
    bad = tmp_path / "truncated.safetensors"
    bad.write_bytes(data[: len(data) // 2])
    result = run("commit", str(bad), "-m", "broken")
    _assert_one_line_error(result, errors.InvalidInput.exit_code)
    assert "truncated.safetensors" in result.stderr
    assert _snapshot(run) == before


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["show", "nope"], errors.UnknownRevision.exit_code),
        (["log", "main~9"], errors.UnknownRevision.exit_code),
        (["checkout", "deadbeef", "-o", "x.safetensors"], errors.UnknownRevision.exit_code),
        (["branch", "b2", "nope"], errors.UnknownRevision.exit_code),
        (["tag", "t1", "nope"], errors.UnknownRevision.exit_code),
        (["branch", "main"], errors.RefExists.exit_code),
        (["checkout", "main~1"], 2),  # -o is required for now
        (["checkout", "main", "-o", "x.txt"], 2),
    ],
)
def test_bad_revisions_and_refs(
    run: Run, work: Path, checkpoints: list[Path], argv: list[str], code: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    _committed(run, checkpoints)
    monkeypatch.chdir(work.parent)
    before = _snapshot(run)
    _assert_one_line_error(run(*argv), code)
    assert _snapshot(run) == before
    assert not Path("x.safetensors").exists() and not Path("x.txt").exists()


def test_commit_with_unknown_parent_changes_nothing(run: Run, work: Path, checkpoints: list[Path]) -> None:
    _committed(run, checkpoints)
    before = _snapshot(run)
    _assert_one_line_error(run("commit", str(checkpoints[0]), "--parent", "nope"), errors.UnknownRevision.exit_code)
    assert _snapshot(run) == before


@pytest.mark.parametrize("metric", ["loss", "loss=", "=1.0", "loss=abc", "loss=nan"])
def test_bad_metric_is_a_usage_error(run: Run, work: Path, checkpoints: list[Path], metric: str) -> None:
    _committed(run, checkpoints)
    before = _snapshot(run)
    result = run("commit", str(checkpoints[0]), "--metric", metric)
    assert result.exit_code == 2
    assert "Invalid value for '--metric'" in " ".join(result.stderr.split())
    assert _snapshot(run) == before


def test_no_repository(run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for argv in (["log"], ["db", "upgrade"]):
        _assert_one_line_error(run(*argv, repo=empty), errors.NotARepository.exit_code)
    result = run("stats", "--json", repo=empty)  # under --json the error is one JSON line (issue 45)
    assert result.exit_code == errors.NotARepository.exit_code and result.stdout == ""
    failure = json.loads(result.stderr)
    assert failure == {"error": failure["error"], "hint": errors.NotARepository.hint,
                       "exit_code": errors.NotARepository.exit_code}
    monkeypatch.chdir(empty)
    monkeypatch.delenv("CKPT_REPO", raising=False)
    result = run("show", "main", repo=None)
    _assert_one_line_error(result, errors.NotARepository.exit_code)
    assert "ckpt init" in result.stderr
    assert not (empty / ".ckpt").exists()


def test_second_init_changes_nothing(run: Run, work: Path, checkpoints: list[Path]) -> None:
    _committed(run, checkpoints)
    before = _snapshot(run)
    config = (work / ".ckpt" / "config.json").read_bytes()
    _assert_one_line_error(run("init"), errors.RepositoryExists.exit_code)
    _assert_one_line_error(run("init", "--chunk-size", "64KiB", str(work)), errors.RepositoryExists.exit_code)
    assert (work / ".ckpt" / "config.json").read_bytes() == config
    assert _snapshot(run) == before


@pytest.mark.parametrize(("size", "code"), [("1KB", 2), ("12KiB-", 2), ("100", 2), ("1000004", 2), ("1.5MiB", 2)])
def test_bad_chunk_size(run: Run, tmp_path: Path, size: str, code: int) -> None:
    result = run("init", str(tmp_path / "r"), "--chunk-size", size)
    assert result.exit_code == code
    assert not (tmp_path / "r" / ".ckpt").exists()


def test_missing_input_file_is_a_usage_error(run: Run, work: Path, tmp_path: Path) -> None:
    result = run("commit", str(tmp_path / "missing.safetensors"))
    assert result.exit_code == 2
    assert "does not exist" in result.stderr


def test_unexpected_error_has_no_traceback_unless_debug(run: Run, work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(self: Repo) -> None:
        raise RuntimeError("disk on fire\nsecond line")

    monkeypatch.setattr(Repo, "stats", boom)
    result = run("stats")
    _assert_one_line_error(result, 1)
    assert "error: RuntimeError: disk on fire second line" in result.stderr
    debug = run("--debug", "stats")
    assert debug.exit_code == 1
    assert "Traceback" in debug.stderr and "disk on fire" in debug.stderr


def test_parse_size() -> None:
    assert options.parse_size("4096") == 4096
    assert options.parse_size("512KiB") == 512 << 10
    assert options.parse_size("1MiB") == options.parse_size("1m") == 1 << 20
    assert options.parse_size(" 2 GiB ") == 2 << 30
    assert options.parse_size("1MB") == 10**6


# -- the installed console script ----------------------------------------------------------------


def _ckpt(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckptrepo.cli.app", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_subprocess_end_to_end(tmp_path: Path, checkpoints: list[Path]) -> None:
    assert _ckpt("init", cwd=tmp_path).returncode == 0
    done = _ckpt("commit", str(checkpoints[0]), "--step", "1", "--metric", "loss=3", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    commit = json.loads(done.stdout)
    out = tmp_path / "restored.safetensors"
    assert _ckpt("checkout", commit["short_id"], "-o", str(out), cwd=tmp_path).returncode == 0
    assert_states_equal(load_file(str(out)), _tensors(0))

    failed = _ckpt("show", "nope", cwd=tmp_path)
    assert failed.returncode == errors.UnknownRevision.exit_code
    assert failed.stdout == ""
    assert failed.stderr.splitlines()[0] == "error: Unknown revision 'nope'."

    usage = _ckpt("commit", str(checkpoints[0]), "--metric", "oops", cwd=tmp_path)
    assert usage.returncode == 2 and "NAME=NUMBER" in usage.stderr
