"""Evaluation runs (``ckpt eval``, ``Repo.evaluate_command``, ``Repo.evaluate``): each commit's state
handed to a real command (a Python script reading the exported safetensors file) or a function,
its metrics recorded as annotations of the commit with their source.

What is checked: the metrics a command prints are what its commit's state gives, recorded with
source ``eval: CMD`` and seen by ``log --where``; a second run skips what is done, ``--force``
runs again; ``-j 2`` gives the same results; a failing command (exit status, no JSON last line,
a timeout) is reported for its commit with the end of its stderr while the others are recorded,
and the exit status is 1; pruned commits are skipped with the reason; exports go into a private
folder removed afterwards, in the format asked for; bad input runs nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner, Result

import ckptrepo
from ckptrepo.cli.app import app
from ckptrepo.errors import ReadOnlyRepository, UnknownRevision, UsageError

N = 5
# Reads a safetensors file with the standard library alone (so each run starts fast): the sum of
# tensor "w" (float32), the step it was given, and what the environment says.
SCRIPT = r'''
import json, os, struct, sys
path = sys.argv[1]
with open(path, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    body = f.read()
begin, end = header["w"]["data_offsets"]
values = struct.unpack(f"<{(end - begin) // 4}f", body[begin:end])
step = int(os.environ["CKPT_EVAL_STEP"])
log = os.environ.get("EVAL_LOG")
if log:
    with open(log, "a") as out:
        out.write(path + "\n")
fail = os.environ.get("EVAL_FAIL", "")
if str(step) in fail.split(","):
    print("evaluating step", step)
    print(f"Traceback: step {step} is broken", file=sys.stderr)
    sys.exit(3)
if str(step) in os.environ.get("EVAL_CHATTY", "").split(","):
    print("all done, but no JSON")
    sys.exit(0)
if str(step) in os.environ.get("EVAL_SLOW", "").split(","):
    import time
    time.sleep(60)
print("some progress output")
print(json.dumps({"wsum": sum(values), "arg_step": step, "rev_len": len(os.environ["CKPT_EVAL_REV"])}))
'''


def _states(i: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((16,), float(i)), "b": torch.zeros(4)}


def _repo(path: Path, db_url: str | None = None) -> tuple[ckptrepo.Repo, list[str]]:
    repo = ckptrepo.Repo.init(path, db_url=db_url)
    ids = [repo.commit(_states(i), step=10 * i, metrics={"loss": 1.0 / (i + 1)}, blocking=True).wait().id
           for i in range(N)]
    return repo, ids


@pytest.fixture
def script(tmp_path: Path) -> str:
    """The command that runs ``SCRIPT`` on ``{path}``."""
    file = tmp_path / "eval_w.py"
    file.write_text(SCRIPT)
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(file))} {{path}}"


def _cli(repo_path: Path, *args: str) -> Result:
    return CliRunner().invoke(app, ["--repo", str(repo_path), *args], catch_exceptions=False)


def _doc(result: Result) -> Any:
    return json.loads(result.stdout)


def test_cli_eval_records_skips_and_forces(tmp_path: Path, script: str) -> None:
    repo, ids = _repo(tmp_path / "r")
    repo.close()
    run = _cli(tmp_path / "r", "eval", "--along", "main", "--run", script, "--json")
    assert run.exit_code == 0, run.stderr
    doc = _doc(run)
    assert doc["source"] == f"eval: {script}" and doc["counts"] == {"ok": N, "skipped": 0, "failed": 0}
    assert [r["commit_id"] for r in doc["results"]] == ids  # oldest first
    with ckptrepo.Repo.open(tmp_path / "r") as repo:
        for i, cid in enumerate(ids):
            commit = repo.get_commit(cid)
            assert commit.annotations == {"wsum": 16.0 * i, "arg_step": 10.0 * i, "rev_len": 64.0}
            assert commit.metrics == {"loss": 1.0 / (i + 1)}  # what it logged is untouched
            assert {a.source for a in repo.annotations(cid)} == {f"eval: {script}"}
        assert [c.id for c in repo.log("main", where="wsum >= 32")] == ids[:1:-1]
    again = _doc(_cli(tmp_path / "r", "eval", *ids[:2], "--run", script, "--json"))
    assert again["counts"] == {"ok": 0, "skipped": 2, "failed": 0}
    assert "already has results from this source" in again["results"][0]["reason"]
    human = _cli(tmp_path / "r", "eval", ids[1], "--run", script, "--force")
    assert human.exit_code == 0, human.stderr
    assert human.stdout.startswith(f"ok      {ids[1][:10]}  step 10  arg_step=10  rev_len=64  wsum=16")
    with ckptrepo.Repo.open(tmp_path / "r") as repo:
        assert [a.current for a in repo.annotations(ids[1], name="wsum")] == [False, True]  # rerun: a new value
        assert len(repo.annotations(ids[0], name="wsum")) == 1


def test_cli_eval_every_and_parallel_runs_give_the_same_results(tmp_path: Path, script: str) -> None:
    repo, ids = _repo(tmp_path / "r")
    repo.close()
    doc = _doc(_cli(tmp_path / "r", "eval", "--along", "main", "--every", "2", "-j", "2", "--run", script, "--json"))
    assert [r["commit_id"] for r in doc["results"]] == [ids[0], ids[2], ids[4]]  # counted from the head
    assert [r["metrics"]["wsum"] for r in doc["results"]] == [0.0, 32.0, 64.0]
    doc = _doc(_cli(tmp_path / "r", "eval", "--along", "main", "-j", "2", "--run", script, "--json"))
    assert [r["status"] for r in doc["results"]] == ["skipped", "ok", "skipped", "ok", "skipped"]
    assert [r["metrics"].get("wsum") for r in doc["results"]] == [None, 16.0, None, 48.0, None]


def test_a_failing_command_is_reported_and_the_others_go_on(tmp_path: Path, script: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    repo, ids = _repo(tmp_path / "r")
    repo.close()
    monkeypatch.setenv("EVAL_FAIL", "10")
    monkeypatch.setenv("EVAL_CHATTY", "20")
    monkeypatch.setenv("EVAL_SLOW", "30")
    result = _cli(tmp_path / "r", "eval", "--along", "main", "-j", "2", "--timeout", "2", "--run", script, "--json")
    assert result.exit_code == 1
    doc = _doc(result)
    by_step = {r["step"]: r for r in doc["results"]}
    assert [by_step[s]["status"] for s in (0, 10, 20, 30, 40)] == ["ok", "failed", "failed", "failed", "ok"]
    assert by_step[10]["reason"] == "exit status 3" and by_step[10]["returncode"] == 3
    assert by_step[10]["stderr"] == "Traceback: step 10 is broken"
    assert "not a JSON object: 'all done, but no JSON'" in by_step[20]["reason"]
    assert by_step[30]["reason"] == "timed out after 2 s" and by_step[30]["returncode"] is None
    assert json.loads(result.stderr.strip().splitlines()[-1])["error"] == "3 of 5 evaluation(s) failed."
    with ckptrepo.Repo.open(tmp_path / "r") as repo:
        assert [repo.get_commit(c).annotations.get("wsum") for c in ids] == [0.0, None, None, None, 64.0]
    monkeypatch.setenv("EVAL_FAIL", "")
    human = _cli(tmp_path / "r", "eval", ids[1], ids[2], "--run", script)  # fixed: the failed ones run again
    assert human.exit_code == 1  # step 20 still prints no JSON
    assert f"FAILED  {ids[2][:10]}  step 20  the last line of its stdout is not a JSON object" in human.stdout
    assert f"ok      {ids[1][:10]}  step 10" in human.stdout
    assert "error: 1 of 2 evaluation(s) failed." in human.stderr


def test_exports_are_private_temporary_and_in_the_format_asked(tmp_path: Path, script: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    repo, ids = _repo(tmp_path / "r")
    log = tmp_path / "paths.txt"
    monkeypatch.setenv("EVAL_LOG", str(log))
    with repo:
        results = repo.evaluate_command(script, ids[:3], jobs=2)
        assert [r.metrics["wsum"] for r in results] == [0.0, 16.0, 32.0]
        paths = [Path(p) for p in log.read_text().split()]
        assert len(paths) == 3 and all(p.name == "state.safetensors" for p in paths)
        assert not any(p.exists() or p.parent.exists() or p.parent.parent.exists() for p in paths)
        probe = ("import json, os, sys; p = sys.argv[1]; top = os.path.dirname(os.path.dirname(p)); "
                 "print(json.dumps({'folder': float(os.path.isdir(p)), 'meta': float(os.path.exists(p + '/.metadata')),"
                 " 'suffix_pt': float(p.endswith('.pt')), 'mode': os.stat(top).st_mode & 0o777}))")
        for fmt, expected in (("torch", {"folder": 0.0, "meta": 0.0, "suffix_pt": 1.0}),
                              ("dcp", {"folder": 1.0, "meta": 1.0, "suffix_pt": 0.0})):
            [result] = repo.evaluate_command([sys.executable, "-c", probe, "{path}"], ids[0], format=fmt,
                                             source=f"probe {fmt}")
            assert result.ok, result
            assert result.metrics == {**expected, "mode": 0o700}


def test_evaluate_calls_a_function_with_each_state(tmp_path: Path, db_url: str) -> None:
    repo, ids = _repo(tmp_path / "r", db_url)
    seen: list[tuple[int | None, float]] = []

    def score(state: dict[str, torch.Tensor], commit: ckptrepo.Commit) -> dict[str, float]:
        seen.append((commit.step, float(state["w"].sum())))
        return {"eval/wsum": float(state["w"].sum()), "eval/n": state["w"].numel()}

    with repo:
        results = repo.evaluate(score, along="main")
        assert [r.status for r in results] == ["ok"] * N and seen == [(10 * i, 16.0 * i) for i in range(N)]
        assert results[0].source == f"evaluate: {__name__}.{score.__qualname__}"
        assert score.__qualname__.endswith("<locals>.score")
        assert repo.get_commit(ids[3]).annotations == {"eval/wsum": 48.0, "eval/n": 16.0}
        assert [c.id for c in repo.best("eval/wsum", maximize=True, branch="main")] == [ids[-1]]
        assert [r.status for r in repo.evaluate(score, ids[::-1])] == ["skipped"] * N and len(seen) == N
        forced = repo.evaluate(score, ids[0], force=True, source="mine")
        assert forced[0].ok and forced[0].source == "mine" and len(seen) == N + 1
        with pytest.raises(ZeroDivisionError):  # what the function raises is raised; the commits before keep theirs
            repo.evaluate(lambda s, c: {"x": 1 / (30 - (c.step or 0))}, along="main", source="div")
        assert [repo.get_commit(c).annotations.get("x") for c in ids] == [1 / 30, 1 / 20, 1 / 10, None, None]
        again = repo.evaluate(lambda s, c: {"x": 1.0}, along="main", source="div")  # goes on where it stopped
        assert [r.status for r in again] == ["skipped"] * 3 + ["ok"] * 2


def test_pruned_commits_are_skipped_with_the_reason(tmp_path: Path, script: str) -> None:
    repo, ids = _repo(tmp_path / "r")
    with repo:
        repo.prune(keep_last=2)
        pruned = [c for c in ids if repo.get_commit(c).pruned]
        assert pruned
        results = repo.evaluate_command(script, along="main")
        by_id = {r.commit_id: r for r in results}
        for cid in ids:
            if cid in pruned:
                assert by_id[cid].status == "skipped" and by_id[cid].reason.startswith("pruned")  # type: ignore[union-attr]
            else:
                assert by_id[cid].ok
        assert [r.status for r in repo.evaluate(lambda s, c: {"y": 1.0}, pruned)] == ["skipped"] * len(pruned)


def test_bad_input_runs_nothing(tmp_path: Path, script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    repo, ids = _repo(tmp_path / "r")
    log = tmp_path / "paths.txt"
    monkeypatch.setenv("EVAL_LOG", str(log))
    with repo:
        with pytest.raises(UnknownRevision):
            repo.evaluate_command(script, [ids[0], "nope"])
        with pytest.raises(UsageError, match="not both"):
            repo.evaluate_command(script, ids[0], along="main")
        with pytest.raises(UsageError, match="unknown format"):
            repo.evaluate_command(script, ids[0], format="npz")
        with pytest.raises(UsageError, match="jobs"):
            repo.evaluate_command(script, ids[0], jobs=0)
        with pytest.raises(UsageError, match="every"):
            repo.evaluate_command(script, along="main", every=0)
    with ckptrepo.Repo.open(tmp_path / "r", read_only=True) as ro, pytest.raises(ReadOnlyRepository):
        ro.evaluate_command(script, ids[0])
    assert not log.exists()
    for args in (["--run", script], ["main", "--along", "main", "--run", script], ["main", "--every", "2", "--run",
                 script], ["main"], ["main", "--run", script, "--format", "npz"]):
        result = _cli(tmp_path / "r", "eval", *args)
        assert result.exit_code == 2 and result.stderr.startswith("error: "), (args, result.stderr)
    assert not log.exists()


def test_a_terminated_eval_kills_its_commands_and_removes_its_folder(tmp_path: Path) -> None:
    repo, _ = _repo(tmp_path / "r")
    repo.close()
    temp, pid_file = tmp_path / "tmp", tmp_path / "sleeper.pid"
    temp.mkdir()
    cmd = f"sleep 60 & echo $! > {shlex.quote(str(pid_file))}; wait"
    proc = subprocess.Popen([sys.executable, "-m", "ckptrepo.cli.app", "--repo", str(tmp_path / "r"), "eval",
                             "main", "main~1", "-j", "2", "--run", cmd], env={**os.environ, "TMPDIR": str(temp)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for _ in range(1200):
            if pid_file.exists() and pid_file.read_text().strip():
                break
            time.sleep(0.05)
        sleeper = int(pid_file.read_text())
        assert [p.name[:10] for p in temp.iterdir()] == ["ckpt-eval-"]  # its export, while the command runs
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    try:
        assert proc.returncode != 0
        for _ in range(200):
            if not _alive(sleeper):
                break
            time.sleep(0.05)
        assert not _alive(sleeper) and list(temp.iterdir()) == []
    finally:  # when it failed: leave no sleeper behind
        with contextlib.suppress(ProcessLookupError):
            os.killpg(os.getpgid(sleeper), signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"  # a zombie is dead


def test_results_that_cannot_be_recorded_fail_for_their_commit(tmp_path: Path) -> None:
    repo, ids = _repo(tmp_path / "r")
    with repo:
        # "loss" is what the commits logged when they were made (part of their ids): an annotation may not reuse it.
        results = repo.evaluate_command("echo '{\"loss\": 0.5}'", ids[:2])
        assert [r.status for r in results] == ["failed", "failed"]
        assert all((r.reason or "").startswith("not recorded: ") for r in results)
        assert repo.annotations(ids[0]) == [] and repo.get_commit(ids[0]).metrics == {"loss": 1.0}
