"""Bisect (``Repo.bisect``, ``ckpt bisect``): the first commit of a first-parent line where a
predicate turns true, on a run whose ``layers.1.weight`` gains a NaN at a known step.

What is checked: ``--stat`` finds that commit from stored statistics alone (every chunk read and
store read stubbed to fail) and names the tensor that changed; ``--where`` finds it on a logged
metric and on an annotation; ``--run`` finds it by running a real command on exported states in
about log2(n) runs, stepping around commits the command skips (exit 125); the ends are checked
(false at GOOD, true at BAD) and GOOD must be on BAD's first-parent line; the CLI prints each test
and the result, or one JSON document.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner, Result

import ckptrepo
from ckptrepo.cli.app import app
from ckptrepo.errors import BisectAborted, BisectEndpoint, NotOnFirstParentLine, UsageError
from ckptrepo.testing import parts

N = 16
NAN_AT = 9  # the commit (index on main) whose layers.1.weight first holds a NaN
ACC_DROP = 12  # the first commit annotated with a low eval/acc

# Exits 1 when tensor "layers.1.weight" (float32) of the exported safetensors file holds a NaN, 0
# otherwise; 125 (skip) for the steps listed in SKIP_STEPS. Standard library only.
CHECK = r'''
import json, os, struct, sys
if os.environ["CKPT_EVAL_STEP"] in os.environ.get("SKIP_STEPS", "").split(","):
    sys.exit(125)
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    body = f.read()
begin, end = header["layers.1.weight"]["data_offsets"]
values = struct.unpack(f"<{(end - begin) // 4}f", body[begin:end])
sys.exit(1 if any(v != v for v in values) else 0)
'''


@dataclass
class Run:
    repo: ckptrepo.Repo
    path: Path
    main: list[str]  # main's commits, oldest first
    side: str  # the head of a branch forked from main[3]


def _state(i: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    state = {"layers.0.weight": torch.randn(8, 8, generator=g), "layers.1.weight": torch.randn(8, 8, generator=g),
             "head.bias": torch.full((8,), 0.1 * i)}
    if i >= NAN_AT:
        state["layers.1.weight"][2, 3] = float("nan")
    return state


def _make(path: Path, db_url: str | None) -> Run:
    repo = ckptrepo.Repo.init(path, db_url=db_url)
    g = torch.Generator().manual_seed(0)
    main = []
    for i in range(N):
        loss = 2.0 - 0.05 * i if i < NAN_AT else 9.0
        main.append(repo.commit(_state(i, g), step=100 * i, metrics={"loss": loss}, blocking=True).wait().id)
        repo.annotate(main[-1], metrics={"eval/acc": 0.9 if i < ACC_DROP else 0.1}, source="test")
    side = repo.commit(_state(0, g), branch="side", parents=[main[3]], step=301, blocking=True).wait().id
    return Run(repo, path, main, side)


@pytest.fixture
def run(tmp_path: Path, db_url: str) -> Iterator[Run]:
    made = _make(tmp_path / "r", db_url)
    with made.repo:
        yield made


@pytest.fixture
def sqlite_run(tmp_path: Path) -> Iterator[Run]:
    made = _make(tmp_path / "r", None)
    with made.repo:
        yield made


class ByteRead(Exception):
    """A test read tensor bytes where it must not."""


def _no_byte_reads(repo: ckptrepo.Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every read of chunk or store bytes fail."""
    p = parts(repo)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ByteRead(args)

    for name in ("read", "read_into", "_fetch"):
        monkeypatch.setattr(p.reader, name, refuse)
    for name in ("get", "get_range", "read_into"):
        monkeypatch.setattr(p.backend, name, refuse)


def test_stat_finds_the_nan_from_stored_statistics_alone(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_byte_reads(run.repo, monkeypatch)
    with pytest.raises(ByteRead):  # the stubs do catch a read
        run.repo.load_tensor(run.main[0], "head.bias")
    steps: list[Any] = []
    result = run.repo.bisect(run.main[0], run.main[-1], stat="layers.*:nan", on_step=steps.append)
    assert (result.first_bad, result.parent, result.first_bad_step) == (run.main[NAN_AT], run.main[NAN_AT - 1], 900)
    assert result.found and result.candidates == (run.main[NAN_AT],) and result.commits == N - 1
    assert list(result.tested) == steps and steps[0].verdict == "good" and steps[1].verdict == "bad"
    assert result.steps <= 2 + math.ceil(math.log2(N))
    top = result.changed[0]
    assert top.name == "layers.1.weight" and top.b is not None and top.b.stats.nan_count == 1
    assert {d.name for d in result.changed} == {"layers.0.weight", "layers.1.weight", "head.bias"}
    # Other statistics and globs; a predicate already true at GOOD is refused.
    assert run.repo.bisect(run.main[0], run.main[-1], stat="head.*:abs_max>0.55").first_bad == run.main[6]
    assert run.repo.bisect(run.main[0], run.main[-1], stat="*.weight:nan>=1").first_bad == run.main[NAN_AT]
    with pytest.raises(BisectEndpoint, match="the predicate is bad at GOOD"):
        run.repo.bisect(run.main[NAN_AT], run.main[-1], stat="*:nan")
    with pytest.raises(BisectEndpoint, match="the predicate is good at BAD"):
        run.repo.bisect(run.main[0], run.main[-1], stat="head.*:nan")


def test_where_finds_a_metric_and_an_annotation(run: Run) -> None:
    on_metric = run.repo.bisect(run.main[0], run.main[-1], where="loss > 5")
    assert on_metric.first_bad == run.main[NAN_AT] and on_metric.predicate == "where: loss > 5"
    on_annotation = run.repo.bisect("main~15", "main", where="eval/acc < 0.5 and step > 0")
    assert on_annotation.first_bad == run.main[ACC_DROP] and on_annotation.first_bad_step == 100 * ACC_DROP
    with pytest.raises(UsageError, match="unknown field or metric 'nope'"):
        run.repo.bisect(run.main[0], run.main[-1], where="nope > 1")


def test_run_finds_it_with_a_command_in_about_log2_runs(run: Run, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "check.py"
    script.write_text(CHECK)
    cmd = f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {{path}}"
    result = run.repo.bisect(run.main[0], run.main[-1], run=cmd)
    assert result.first_bad == run.main[NAN_AT] and result.found
    assert result.steps <= 2 + math.ceil(math.log2(N)) and {s.detail for s in result.tested} <= {
        "exit status 0", "exit status 1"}
    assert result.changed[0].name == "layers.1.weight"
    # Commits the command cannot test are stepped around; one next to the answer leaves two candidates.
    monkeypatch.setenv("SKIP_STEPS", f"{100 * (NAN_AT - 1)},{100 * (NAN_AT - 4)}")
    skipping = run.repo.bisect(run.main[0], run.main[-1], run=cmd)
    assert skipping.candidates == (run.main[NAN_AT - 1], run.main[NAN_AT]) and not skipping.found
    assert "skip" in {s.verdict for s in skipping.tested}
    with pytest.raises(BisectAborted, match=r"timed out after 0\.2 s"):
        run.repo.bisect(run.main[0], run.main[-1], run="sleep 30", timeout=0.2)


def test_good_must_be_on_bad_s_first_parent_line(run: Run) -> None:
    for good, bad in ((run.side, run.main[-1]), (run.main[-1], run.main[0]), (run.main[5], run.main[5]),
                      (run.main[5], run.side)):
        with pytest.raises(NotOnFirstParentLine):
            run.repo.bisect(good, bad, stat="*:nan")
    # A line that forks: from main[2] to the side branch's head runs through main[3].
    assert run.repo.bisect(run.main[2], run.side, where="step == 301").first_bad == run.side
    for kwargs in ({}, {"where": "loss > 1", "stat": "*:nan"}, {"stat": "*:bogus"}, {"stat": "*:nan", "top": -1}):
        with pytest.raises(UsageError):
            run.repo.bisect(run.main[0], run.main[-1], **kwargs)


def _cli(path: Path, *args: str) -> Result:
    return CliRunner().invoke(app, ["--repo", str(path), *args], catch_exceptions=False)


def test_cli_prints_each_test_and_the_result(sqlite_run: Run) -> None:
    path, main = sqlite_run.path, sqlite_run.main
    human = _cli(path, "bisect", main[0], main[-1], "--stat", "*:nan")
    assert human.exit_code == 0, human.stderr
    lines = human.stdout.splitlines()
    assert lines[0].startswith(f"good {main[0][:10]}  step 0") and lines[1].startswith(f"bad  {main[-1][:10]}")
    assert f"first bad commit: {main[NAN_AT][:10]} (step 900)" in human.stdout
    assert re.search(r"~ +layers\.1\.weight +1 \(\+1\) ", human.stdout)  # first: it gained a NaN
    doc = json.loads(_cli(path, "bisect", "main~15", "main", "--where", "loss > 5", "--top", "1", "--json").stdout)
    assert doc["first_bad"] == main[NAN_AT] and doc["first_bad_commit"]["step"] == 900
    assert len(doc["changed"]) == 1 and doc["tested"][0]["verdict"] == "good"
    wrong = _cli(path, "bisect", main[0], main[-1], "--stat", "*:nan", "--where", "loss > 5")
    assert wrong.exit_code == 2 and "exactly one predicate" in wrong.stderr
    ends = _cli(path, "bisect", main[0], main[-1], "--where", "loss > 100", "--json")
    assert ends.exit_code == 2 and "where bisect needs it bad" in json.loads(ends.stderr)["error"]


PROBE = """
import atexit, sys
atexit.register(lambda: sys.stderr.write("\\nLOADED=" + ",".join(m for m in ("torch",) if m in sys.modules) + "\\n"))
sys.argv = ["ckpt", *sys.argv[1:]]
from ckptrepo.cli.app import main
main()
"""


def test_cli_bisect_on_rows_imports_no_torch(sqlite_run: Run) -> None:
    for predicate in (["--stat", "*:nan"], ["--where", "loss > 5"]):
        done = subprocess.run([sys.executable, "-c", PROBE, "--repo", str(sqlite_run.path), "bisect", "main~15",
                               "main", *predicate, "--json"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["first_bad"] == sqlite_run.main[NAN_AT]
        assert done.stderr.strip().splitlines()[-1] == "LOADED=", done.stderr  # torch costs seconds per process
