"""The pieces of ``ckpt eval`` and ``ckpt bisect`` that need no repository: the last line of a
command's stdout read as metrics, placeholders replaced shell-safely, a command run (exit status,
environment, timeout killing what it started), ``--stat`` specs parsed, and the binary search
over a line (skips included)."""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

import pytest

from ckptrepo.errors import BisectEndpoint, UsageError
from ckptrepo.explore import bisect, runner
from ckptrepo.explore.predicates import parse_stat

# -- the last line of stdout ------------------------------------------------------------------------


def test_metrics_come_from_the_last_non_blank_line() -> None:
    out = 'loading...\n{"not": "this"}\n{"loss": 0.25, "acc": 1, "big": 1e300}\n\n  \n'
    assert runner.parse_metrics(out) == {"loss": 0.25, "acc": 1.0, "big": 1e300}
    assert isinstance(runner.parse_metrics('{"n": 3}')["n"], float)


@pytest.mark.parametrize(("stdout", "why"), [
    ("", "printed nothing"),
    ("\n  \n", "printed nothing"),
    ('{"loss": 0.5}\nall done', "not a JSON object: 'all done'"),
    ("[1, 2]", "not a JSON object"),
    ('{"loss": 0.5', "not a JSON object"),
    ("{}", "holds no metric"),
    ('{"loss": "0.5"}', "'loss' is not a number"),
    ('{"ok": true}', "'ok' is not a number"),
    ('{"loss": null}', "'loss' is not a number"),
    ('{"loss": [1]}', "'loss' is not a number"),
    ('{"loss": NaN}', "'loss' is not a finite number"),
    ('{"loss": -Infinity}', "'loss' is not a finite number"),
    ('{"": 1}', "is not 1 to 255 characters"),
    ('{"' + "x" * 256 + '": 1}', "is not 1 to 255 characters"),
])
def test_a_bad_last_line_says_what_is_wrong(stdout: str, why: str) -> None:
    with pytest.raises(runner.MetricsError) as caught:
        runner.parse_metrics(stdout)
    assert why in str(caught.value)


def test_tail_keeps_the_last_lines_and_characters() -> None:
    text = "\n".join(f"line {i}" for i in range(100)) + "\n\n"
    assert runner.tail(text, lines=3) == "line 97\nline 98\nline 99"
    cut = runner.tail("x" * 5000, chars=100)
    assert len(cut) == 100 and cut.startswith("...")


# -- placeholders ---------------------------------------------------------------------------------


def test_placeholders_are_quoted_for_the_shell_and_other_braces_stay() -> None:
    nasty = "/tmp/a b/$(touch pwned);'x'.safetensors"
    cmd = runner.substitute('python3 -c \'print({"a": 1})\' {path} --rev={rev} --step {step} {other}',
                            path=nasty, rev="ab" * 32, step=500)
    words = shlex.split(cmd)
    assert words[3] == nasty  # one word, exactly the path: nothing of it is shell syntax
    assert words[2] == 'print({"a": 1})' and words[4] == "--rev=" + "ab" * 32 and words[6] == "500"
    assert words[7] == "{other}"
    assert runner.substitute("x {step} {rev}", path="p") == "x '' ''"  # unknown: empty words
    assert runner.substitute("{path}", path=nasty, shell=False) == nasty


def test_a_command_gets_its_values_in_placeholders_and_environment(tmp_path: Path) -> None:
    target = tmp_path / "it's a dir" / "state.safetensors"
    target.parent.mkdir()
    target.write_bytes(b"12345")
    script = ('import json, os, sys; p = sys.argv[1]; e = os.environ; '
              'print(json.dumps({"size": os.path.getsize(p), "same": float(p == e["CKPT_EVAL_PATH"]), '
              '"step": int(e["CKPT_EVAL_STEP"]), "rev_ok": float(e["CKPT_EVAL_REV"] == sys.argv[2])}))')
    cmd = f"{shlex.quote(sys.executable)} -c {shlex.quote(script)} {{path}} {{rev}}"
    out = runner.run_command(cmd, target, rev="c0ffee" * 10, step=7)
    assert out.ok, out
    assert out.metrics == {"size": 5.0, "same": 1.0, "step": 7.0, "rev_ok": 1.0}
    argv = runner.run_command([sys.executable, "-c", script, "{path}", "{rev}"], target, rev="r", step=7)
    assert argv.metrics == {"size": 5.0, "same": 1.0, "step": 7.0, "rev_ok": 1.0}


def test_failures_say_why_with_the_end_of_stderr(tmp_path: Path) -> None:
    failed = runner.run_command("echo progress; echo oops >&2; exit 3", tmp_path)
    assert (failed.ok, failed.returncode, failed.error, failed.stderr_tail, failed.last_line) == (
        False, 3, "exit status 3", "oops", "progress")
    chatty = runner.run_command("echo 'done, no json'", tmp_path)
    assert chatty.returncode == 0 and not chatty.ok and "not a JSON object" in (chatty.error or "")
    unparsed = runner.run_command("echo 'done, no json'", tmp_path, parse=False)
    assert unparsed.ok and unparsed.metrics is None
    missing = runner.run_command(["/nonexistent/program"], tmp_path)
    assert missing.returncode is None and (missing.error or "").startswith("could not start")


def test_a_timeout_kills_the_command_and_what_it_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    # The shell starts a background sleeper and waits on it: both must die with the group.
    out = runner.run_command(f"sleep 60 & echo $! > {shlex.quote(str(pid_file))}; wait", tmp_path, timeout=0.5)
    assert out.timed_out and out.returncode is None and out.error == "timed out after 0.5 s"
    child = int(pid_file.read_text())
    for _ in range(200):  # killed with the group; reaped by init soon after
        if not _alive(child):
            break
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"  # a zombie is dead


def test_exported_writes_into_a_private_folder_removed_afterwards() -> None:
    seen: list[Path] = []

    def write(path: Path) -> None:
        path.write_bytes(b"state")
        seen.append(path)

    with runner.exported(write, "torch") as path:
        assert path.name == "state.pt" and path.read_bytes() == b"state"
        assert os.stat(path.parent).st_mode & 0o777 == 0o700
    assert seen == [path] and not path.parent.exists()
    with pytest.raises(RuntimeError), runner.exported(write, "safetensors") as path:
        raise RuntimeError("the command failed")
    assert not path.parent.exists()
    assert runner.state_path(Path("/x"), "dcp") == Path("/x/state")


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"command": "  "}, "empty"),
    ({"command": 3}, "string"),
    ({"command": ["ok", 1]}, "string"),
    ({"fmt": "npz"}, "unknown format"),
    ({"timeout": 0}, "timeout"),
    ({"timeout": float("nan")}, "timeout"),
    ({"jobs": 0}, "jobs"),
    ({"jobs": True}, "jobs"),
])
def test_bad_run_options_are_refused(kwargs: dict[str, object], match: str) -> None:
    args = {"command": "true", "fmt": "safetensors", "timeout": None, "jobs": 1, **kwargs}
    with pytest.raises(UsageError, match=match):
        runner.check_options(args["command"], args["fmt"], timeout=args["timeout"], jobs=args["jobs"])  # type: ignore[arg-type]
    assert runner.check_options(["a b", "c"], "dcp") == "'a b' c"


# -- --stat specs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "glob", "column", "op", "threshold"), [
    ("*:nan", "*", "nan_count", ">", 0.0),
    ("layers.*.weight:inf", "layers.*.weight", "inf_count", ">", 0.0),
    ("*:abs_max>1e4", "*", "abs_max", ">", 1e4),
    ("head.*: norm < 1e-6", "head.*", "l2_norm", "<", 1e-6),
    ("*:NaN >= 10", "*", "nan_count", ">=", 10.0),
    ("a:b:mean<=-2", "a:b", "mean", "<=", -2.0),  # the last colon splits
    ("*:std==0", "*", "std", "==", 0.0),
    ("*:min!=0", "*", "min", "!=", 0.0),
    ("*:numel>5", "*", "numel", ">", 5.0),
])
def test_stat_specs_parse(spec: str, glob: str, column: str, op: str, threshold: float) -> None:
    p = parse_stat(spec)
    assert (p.glob, p.column, p.op, p.threshold, p.text) == (glob, column, op, threshold, spec)


@pytest.mark.parametrize(("spec", "match"), [
    ("nan", "expected GLOB:STAT"),
    (":nan", "expected GLOB:STAT"),
    ("*:", "cannot read"),
    ("*:bogus", "unknown statistic 'bogus'"),
    ("*:abs_max", "abs_max needs a comparison"),
    ("*:abs_max>", "cannot read"),
    ("*:abs_max>big", "'big' is not a number"),
    ("*:abs_max>inf", "finite"),
    ("*:abs_max=>3", "cannot read"),
    ("*:abs_max>3 4", "cannot read"),
])
def test_bad_stat_specs_say_what_is_wrong(spec: str, match: str) -> None:
    with pytest.raises(UsageError, match=match) as caught:
        parse_stat(spec)
    assert "GLOB:STAT" in caught.value.hint


def test_a_stat_predicate_matches_names_and_values() -> None:
    p = parse_stat("layers.*:abs_max>2")
    assert p.matches("layers.0.attn/q.weight") and not p.matches("head.layers.0")
    assert p.holds(2.5) and not p.holds(2.0) and not p.holds(None) and not p.holds(float("nan"))
    assert parse_stat("*:nan").holds(1) and not parse_stat("*:nan").holds(0)


# -- the search -------------------------------------------------------------------------------------


def _line(n: int) -> list[bisect.LineCommit]:
    return [bisect.LineCommit(f"{i:064x}", i * 10, None) for i in range(n)]


@pytest.mark.parametrize("n", [2, 3, 10, 1000, 1025])
def test_search_finds_the_first_bad_commit_in_about_log2_tests(n: int) -> None:
    for first in sorted({1, n // 3, n // 2, n - 1}):
        if first < 1:
            continue
        tested: list[int] = []

        def test(c: bisect.LineCommit, tested: list[int] = tested, first: int = first) -> bisect.Verdict:
            tested.append(c.step // 10)  # type: ignore[operator]
            return ("bad" if c.step // 10 >= first else "good"), None  # type: ignore[operator]

        found, candidates, steps = bisect.search(_line(n), test)
        assert (found, candidates) == (first, [first])
        assert tested[:2] == [0, n - 1] and len(steps) == len(tested)
        assert len(tested) <= 2 + (n - 1).bit_length()


def test_skipped_commits_are_stepped_around_and_may_stay_candidates() -> None:
    line = _line(9)

    def verdicts(first: int, skip: set[int]) -> bisect.Test:
        def test(c: bisect.LineCommit) -> bisect.Verdict:
            i = c.step // 10  # type: ignore[operator]
            if i in skip:
                return "skip", "exit status 125"
            return ("bad" if i >= first else "good"), None

        return test

    assert bisect.search(line, verdicts(5, {3}))[:2] == (5, [5])  # 3 skipped, 4 good and 5 bad settle it
    assert bisect.search(line, verdicts(5, {4}))[:2] == (5, [4, 5])  # 4 untested: it may be the first bad
    found, candidates, _ = bisect.search(line, verdicts(5, {3, 4, 5}))
    assert found == 6 and candidates == [3, 4, 5, 6]  # could be any of them


def test_the_ends_must_be_good_and_bad() -> None:
    with pytest.raises(BisectEndpoint, match=r"the predicate is bad at GOOD .* where bisect needs it good"):
        bisect.search(_line(5), lambda c: ("bad", None))
    with pytest.raises(BisectEndpoint, match=r"is skip at BAD .*\(step 40\) \(exit status 125\)"):
        bisect.search(_line(5), lambda c: ("good", None) if c.step == 0 else ("skip", "exit status 125"))
