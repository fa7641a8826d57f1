"""What ``ckpt`` prints, end to end (issue 45, items 8 and 9).

- Stored strings (a commit message, metric names, tensor names from an untrusted safetensors
  header, a store key) reach the terminal with their control characters escaped, and exactly
  under ``--json``.
- Output to a pipe is not wrapped.
- Under ``--json`` a failure is one JSON line on stderr (Typer's usage errors too).
- ``checkout REV -o FILE`` replaces nothing without ``--force`` and never follows a symlink.
- Huge integers are usage errors (exit 2), never an OverflowError with a "bug" hint; in the UI, 400.
- A mistyped revision gets a did-you-mean; ``plot metrics a b``; import-run's own hint; the
  ``--allow-pickle`` warning; verify's word on objects gc never removes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner, Result

from ckptrepo import Repo, errors
from ckptrepo.cli.app import app

Run = Callable[..., Result]

# Clear screen, window title (OSC, ended by BEL), hidden text, a forged line, bidi controls.
EVIL = "\x1b[2J\x1b]0;pwned\x07\x1b[8mhidden\x1b[0m\r\nforged: line\u202eabc\u2066x\u2069"
ESCAPED = "\\x1b[2J\\x1b]0;pwned\\x07\\x1b[8mhidden\\x1b[0m\\r\\nforged: line\\u202eabc\\u2066x\\u2069"
MESSAGE = "msg " + EVIL
METRIC = "loss" + EVIL
TENSOR = "w" + EVIL
HUGE = "100000000000000000000"


@pytest.fixture
def run(tmp_path: Path) -> Run:
    runner = CliRunner()

    def invoke(*args: str, repo: Path | None = tmp_path / "work") -> Result:
        argv = (["--repo", str(repo)] if repo is not None else []) + list(args)
        return runner.invoke(app, argv, catch_exceptions=False)

    return invoke


@pytest.fixture
def work(run: Run, tmp_path: Path) -> Path:
    """A repository with two commits on main whose message, metric and tensor names are EVIL
    (the tensor's from a safetensors header), and a branch ``side``."""
    assert run("init").exit_code == 0
    repo_dir = tmp_path / "work"
    first, second = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({TENSOR: torch.zeros(8), "b": torch.ones(4)}, str(first))
    save_file({TENSOR: torch.arange(8.0), "b": torch.ones(4)}, str(second))
    with Repo.open(repo_dir) as repo:
        repo.commit_file(first, message=MESSAGE, step=1, metrics={METRIC: 2.0})
        repo.commit_file(second, message=MESSAGE, step=2, metrics={METRIC: 1.0})
        repo.branch("side", at="main~1")
    return repo_dir


def _assert_safe(text: str) -> None:
    """Nothing but printable characters and line feeds, and no line the EVIL string forged."""
    bad = sorted({repr(ch) for ch in text if not (ch.isprintable() or ch == "\n")})
    assert not bad, f"control characters reached the terminal: {bad}"
    # (``show`` keeps a message's line breaks, its later lines indented in the message field)
    assert not any(line.startswith("forged") for line in text.splitlines())


TEXT_COMMANDS = [
    ["log"], ["log", "--graph"], ["log", "--all"], ["show", "main"], ["show", "main~1"], ["branch"],
    ["history", TENSOR], ["diff", "main~1", "main"], ["best", "-m", METRIC], ["lineage", "ancestors", "main"],
]


@pytest.mark.parametrize("argv", TEXT_COMMANDS, ids=lambda argv: " ".join(a.split("\x1b")[0] for a in argv))
def test_stored_strings_are_escaped_in_text_output(run: Run, work: Path, argv: list[str]) -> None:
    result = run(*argv)
    assert result.exit_code == 0, result.stderr
    _assert_safe(result.stdout)
    _assert_safe(result.stderr)
    assert "\\x1b[2J" in result.stdout


def test_show_escapes_every_stored_string(run: Run, work: Path) -> None:
    out = run("show", "main").stdout
    first_line = ESCAPED.split("\\r\\n")[0]
    assert "msg " + first_line in out  # the message keeps its line break, escaped otherwise
    assert f"loss{ESCAPED}=1" in out  # the metric name, on one line
    assert f"w{ESCAPED}" in out  # the tensor name from the safetensors header


def test_json_output_holds_the_strings_exactly(run: Run, work: Path) -> None:
    log = json.loads(run("log", "--json").stdout)
    assert [c["message"] for c in log] == [MESSAGE, MESSAGE]
    assert all(list(c["metrics"]) == [METRIC] for c in log)
    shown = json.loads(run("show", "main", "--json").stdout)
    assert TENSOR in {t["name"] for t in shown["tensors"]}
    history = json.loads(run("history", TENSOR, "--json").stdout)
    assert json.dumps(history)  # a document, parsed back
    diff = json.loads(run("diff", "main~1", "main", "--json").stdout)
    assert TENSOR in {t["name"] for t in diff["tensors"]}


def test_verify_escapes_a_store_key_and_says_gc_leaves_foreign_objects(run: Run, work: Path) -> None:
    (work / ".ckpt" / "store" / f"notes{EVIL}.txt").write_bytes(b"not ckptrepo's")
    result = run("verify")
    assert result.exit_code == 0, result.stdout + result.stderr  # a warning, not an error
    _assert_safe(result.stdout)
    assert "foreign_object" in result.stdout and "gc never removes it" in result.stdout
    assert "leftovers gc reclaims" not in result.stdout
    report = json.loads(run("verify", "--json").stdout)
    foreign = [p for p in report["warnings"] if p["kind"] == "foreign_object"]
    assert len(foreign) == 1 and EVIL in foreign[0]["detail"] and "gc reclaims" not in foreign[0]["detail"]
    run("gc")
    assert (work / ".ckpt" / "store" / f"notes{EVIL}.txt").exists()


def test_piped_output_does_not_wrap(run: Run, work: Path, tmp_path: Path) -> None:
    long = " ".join(f"phrase{i:03d}" for i in range(25))  # 249 characters, spaces between phrases
    path = tmp_path / "c.safetensors"
    save_file({"z": torch.zeros(2)}, str(path))
    assert run("commit", str(path), "-m", long, "--step", "3").exit_code == 0
    log = run("log").stdout.splitlines()
    assert any(line.endswith(long) for line in log), log
    assert sum("phrase" in line for line in log) == 1
    show = run("show", "main").stdout.splitlines()
    assert any(line.rstrip().endswith(long) for line in show)
    table = run("branch").stdout.splitlines()
    assert any(long in line for line in table)


def _json_error(result: Result, code: int) -> dict[str, Any]:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    document = json.loads(lines[0])
    assert set(document) == {"error", "hint", "exit_code"} and document["exit_code"] == code
    assert document["error"]
    return document


def test_errors_under_json_are_one_json_line(run: Run, work: Path, tmp_path: Path) -> None:
    unknown = _json_error(run("show", "mian", "--json"), errors.UnknownRevision.exit_code)
    assert unknown["error"] == "Unknown revision 'mian'." and "main" in unknown["hint"]
    assert "Traceback" not in unknown["hint"]
    _json_error(run("stats", "--json", repo=tmp_path / "nowhere"), errors.NotARepository.exit_code)
    for argv in (["log", "--bogus", "--json"], ["log", "--json", "-n", "many"], ["log", "-n", HUGE, "--json"],
                 ["lineage", "ancestors", "--json", "--bogus", "main"], ["lgo", "--json"]):
        usage = _json_error(run(*argv), 2)
        assert "--help" in usage["hint"]
    # A failure quoting a stored string: one JSON line whatever it holds (the message quotes it by repr).
    failed = _json_error(run("history", TENSOR + "x", "--json"), errors.UnknownTensor.exit_code)
    assert repr(TENSOR + "x") in failed["error"]
    text = run("history", TENSOR + "x")
    _assert_safe(text.stderr)
    assert text.stderr.startswith("error: ")


def test_errors_without_json_stay_text(run: Run, work: Path) -> None:
    result = run("log", "--bogus")
    assert result.exit_code == 2 and not result.stderr.lstrip().startswith("{")
    assert "--json" not in result.stderr
    result = run("log", "--", "--json")  # after --, --json is an argument (a revision), not the option
    assert result.exit_code == errors.UnknownRevision.exit_code
    assert result.stderr.startswith("error: ")


def _state(path: Path) -> Any:
    if path.suffix == ".pt" or (path.suffix == ".data" and path.read_bytes()[:2] == b"PK"):
        return torch.load(path, weights_only=True)
    return load_file(str(path))


EXPORTS = [("out.safetensors", None), ("out.pt", None), ("out.data", "safetensors"), ("out.data", "torch")]


@pytest.mark.parametrize(("name", "fmt"), EXPORTS, ids=["safetensors (streamed)", "torch", "--format safetensors",
                                                         "--format torch"])
def test_checkout_output_replaces_nothing_without_force(run: Run, work: Path, tmp_path: Path, name: str,
                                                        fmt: str | None) -> None:
    formats = ["--format", fmt] if fmt else []
    target = tmp_path / name
    target.write_bytes(b"precious")
    refused = run("checkout", "main", "-o", str(target), *formats)
    assert refused.exit_code == errors.OutputExists.exit_code == 4, refused.stderr
    assert refused.stderr.startswith("error: Cannot write") and "--force" in refused.stderr
    assert target.read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(name)) == [name]  # no temporary left
    _json_error(run("checkout", "main", "-o", str(target), *formats, "--json"), 4)

    replaced = run("checkout", "main", "-o", str(target), *formats, "--force")
    assert replaced.exit_code == 0, replaced.stderr
    assert torch.equal(_state(target)[TENSOR], torch.arange(8.0))


@pytest.mark.parametrize(("name", "fmt"), EXPORTS, ids=["safetensors (streamed)", "torch", "--format safetensors",
                                                         "--format torch"])
def test_checkout_output_never_follows_a_symlink(run: Run, work: Path, tmp_path: Path, name: str,
                                                 fmt: str | None) -> None:
    formats = ["--format", fmt] if fmt else []
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"not yours")
    link = tmp_path / name
    link.symlink_to(victim)
    assert run("checkout", "main", "-o", str(link), *formats).exit_code == 4
    assert link.is_symlink() and victim.read_bytes() == b"not yours"

    dangling = tmp_path / ("dangling" + Path(name).suffix)
    dangling.symlink_to(tmp_path / "created-through-the-link")
    assert run("checkout", "main", "-o", str(dangling), *formats).exit_code == 4
    assert not (tmp_path / "created-through-the-link").exists()

    assert run("checkout", "main", "-o", str(link), *formats, "--force").exit_code == 0
    assert not link.is_symlink() and victim.read_bytes() == b"not yours"  # the link itself was replaced
    assert torch.equal(_state(link)[TENSOR], torch.arange(8.0))


def test_checkout_force_needs_output(run: Run, work: Path) -> None:
    result = run("checkout", "side", "--force")
    assert result.exit_code == 2 and "--force" in result.stderr


def test_export_api_replace_false(work: Path, tmp_path: Path) -> None:
    target = tmp_path / "api.safetensors"
    target.write_bytes(b"x")
    with Repo.open(work) as repo:
        with pytest.raises(errors.OutputExists):
            repo.export("main", target, replace=False)
        assert target.read_bytes() == b"x"
        repo.export("main", target)  # replace=True by default, as before
    assert torch.equal(load_file(str(target))[TENSOR], torch.arange(8.0))


HUGE_ARGV = [
    ["log", "-n", HUGE], ["log", f"main~{HUGE}"], ["log", f"main^{HUGE}"], ["show", f"main@step={HUGE}"],
    ["show", "main~" + "9" * 5000], ["diff", "main", f"main~{HUGE}"], ["history", "b", "-n", HUGE],
    ["best", "-m", METRIC, "-n", HUGE], ["lineage", "ancestors", "main", "--depth", HUGE],
    ["prune", "--keep-last", HUGE, "--dry-run"], ["prune", "--keep-every", HUGE, "--dry-run"],
    ["prune", "--keep-younger-than", f"{HUGE}d", "--dry-run"], ["gc", "--grace", "1e308", "--dry-run"],
    ["gc", "--grace", "nan", "--dry-run"], ["ui", "--port", HUGE], ["demo", "--steps", HUGE],
    ["init", "--max-delta-depth", HUGE, "elsewhere"],
]


@pytest.mark.parametrize("argv", HUGE_ARGV, ids=lambda argv: " ".join(a[:30] for a in argv if "\x1b" not in a))
def test_huge_integers_are_usage_errors(run: Run, work: Path, tmp_path: Path, argv: list[str]) -> None:
    result = run(*argv)
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert "bug" not in result.stderr and "Traceback" not in result.stderr and "Overflow" not in result.stderr


@pytest.mark.parametrize("option", ["--step", "--epoch"])
def test_huge_step_or_epoch_commits_nothing(run: Run, work: Path, tmp_path: Path, option: str) -> None:
    path = tmp_path / "c.safetensors"
    save_file({"z": torch.zeros(2)}, str(path))
    result = run("commit", str(path), option, str(2**63))
    assert result.exit_code == 2 and "bug" not in result.stderr
    assert run("commit", str(path), option, str(2**63 - 1)).exit_code == 0  # the largest a column holds


def test_ui_huge_integers_are_400(work: Path) -> None:
    from starlette.testclient import TestClient

    from ckptrepo.ui import create_app

    with Repo.open(work, read_only=True) as repo, TestClient(create_app(repo), raise_server_exceptions=False) as c:
        for url, params in [("/api/commits", {"limit": HUGE}), ("/api/commits", {"offset": HUGE}),
                            ("/api/commits", {"offset": "9" * 5000}), ("/api/commits", {"limit": "1_0"}),
                            ("/api/commits", {"rev": f"main~{HUGE}"}), ("/api/history", {"name": "b", "limit": HUGE}),
                            ("/api/commits/main@step=" + HUGE, {})]:
            response = c.get(url, params=params)
            assert response.status_code == 400, (url, params, response.status_code, response.text[:200])
            body = response.json()
            assert body["error"] and len(body["error"]) < 300
        page = c.get("/tensor/b", params={"along": f"main~{HUGE}"})
        assert page.status_code == 400
        assert c.get("/api/commits", params={"limit": "2", "offset": "1"}).status_code == 200


def test_mistyped_revision_did_you_mean(run: Run, work: Path) -> None:
    typo = run("show", "sdie")
    assert typo.exit_code == 3 and "Did you mean 'side'?" in typo.stderr
    short = run("show", "abc")
    assert short.exit_code == 3 and "4 hex digits" in short.stderr
    assert "4+ hex digits" in run("show", "zzzz-nothing").stderr  # the error's own hint says it too


def test_plot_metrics_takes_space_separated_names(run: Run, work: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    chart = tmp_path / "m.png"
    both = run("plot", "metrics", METRIC, METRIC + "2", "-o", str(chart))  # the second is unknown: refused by name
    assert both.exit_code == 2 and "2" in both.stderr
    result = run("plot", "metrics", METRIC, METRIC, "-o", str(chart), "--json")
    assert result.exit_code == 0, result.stderr
    assert chart.stat().st_size > 0


def test_import_run_errors_carry_their_own_hint(run: Run, work: Path, tmp_path: Path) -> None:
    empty = tmp_path / "run"
    empty.mkdir()
    result = run("import-run", str(empty))
    assert result.exit_code == errors.InvalidInput.exit_code
    assert "ckpt commit" not in result.stderr and "import-run" in result.stderr
    (empty / "epoch=0-step=10.ckpt").write_bytes(b"garbage, not a checkpoint")
    result = run("import-run", str(empty))
    assert result.exit_code == errors.InvalidInput.exit_code
    assert "ckpt commit" not in result.stderr and "import-run" in result.stderr


def test_allow_pickle_warning_names_all_it_unpickles(run: Run, work: Path, tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    save_file({"z": torch.zeros(2)}, str(path))
    result = run("commit", str(path), "--allow-pickle")
    assert result.exit_code == 0
    warning = " ".join(result.stderr.split())
    assert "torch.save files" in warning and "skeleton" in warning and "DCP folder" in warning


def test_symlinked_export_folder_is_not_touched(work: Path, tmp_path: Path) -> None:
    """A folder at the target stays a UsageError, --force or not (a folder is never replaced)."""
    folder = tmp_path / "dir.safetensors"
    folder.mkdir()
    runner = CliRunner()
    for extra in ([], ["--force"]):
        result = runner.invoke(app, ["--repo", str(work), "checkout", "main", "-o", str(folder), *extra])
        assert result.exit_code == 2 and "folder" in result.stderr
    assert folder.is_dir() and not os.listdir(folder)


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    """`ckpt log | head -1`: when the pipe's reader has closed it, the command prints no error
    (no 'Check free space' hint) and exits non-zero: 141 (as a shell reports SIGPIPE) when the
    command met the closed pipe, 1 when Click did, flushing after it."""
    import subprocess
    import sys

    with Repo.init(tmp_path / "repo") as repo:
        for step in range(400):
            repo.commit({"w": torch.zeros(2)}, step=step, message="m" * 300)
    script = ("import sys; sys.argv = ['ckpt', '--repo', sys.argv[1], 'log']\n"
              "from ckptrepo.cli.app import main\nmain()")
    with subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "repo")], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.read(10)
        proc.stdout.close()
        stderr = proc.stderr.read().decode()
        code = proc.wait(timeout=120)
    assert stderr == ""
    assert code in (1, 141)
