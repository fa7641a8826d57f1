"""The knobs: read from the environment, with defaults written once, in ``knobs.KNOBS``, which the
code reads and the documented table shows."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from ckptrepo import knobs
from ckptrepo.errors import UsageError
from ckptrepo.explore.runner import COMMAND_ENVIRONMENT

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
CODE = [p for folder in ("ckptrepo", "cli") for p in sorted((ROOT / folder).rglob("*"))
        if p.suffix in (".py", ".c", ".h") and "__pycache__" not in p.parts]
GETTERS = {"get_int": int, "get_bool": int, "get_str": str}  # each getter and the type of default it reads


def _default(knob: knobs.Knob) -> object:
    return knob.default() if callable(knob.default) else knob.default


def _getter_calls() -> list[tuple[str, int, str, ast.Call]]:
    """Every call of a knob getter in the code: ``(file, line, getter, call)``."""
    calls = []
    for path in CODE:
        if path.suffix != ".py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
                if name in GETTERS:
                    calls.append((str(path.relative_to(ROOT)), node.lineno, name, node))
    return calls


def _constants(path: Path) -> dict[str, str]:
    """The module-level ``NAME = "text"`` assignments of ``path``."""
    out = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            out[node.targets[0].id] = node.value.value
    return out


def test_the_documented_table_is_the_knobs_table() -> None:
    text = DESIGN.read_text(encoding="utf-8")
    table = text.split("<!-- knobs-table", 1)[1].split("<!-- /knobs-table -->", 1)[0]
    rows = re.findall(r"^\| `CKPT_[A-Z0-9_]+` \| .*? \| .*? \|$", table, re.M)
    expected = [f"| `{k.variable}` | {k.shown_default} | {k.doc} |" for k in knobs.KNOBS.values()]
    assert rows == expected, "docs/design.md's knobs table should read:\n" + "\n".join(expected)


def test_every_default_is_one_a_getter_reads_or_shown_in_words() -> None:
    for knob in knobs.KNOBS.values():
        if knob.default is None or callable(knob.default) or knob.default == "":
            assert knob.shown, f"{knob.name}: a default that is no plain value needs its words (shown)"
        elif knob.shown:  # words beside a plain value, never another value
            assert knob.shown.startswith(f"{knob.default} ("), knob.name
        assert knob.default is None or isinstance(_default(knob), int | str), knob.name


# Variables ckptrepo sets for a user's command (``ckpt eval``): named in the code, never read.
FOR_COMMANDS = set(COMMAND_ENVIRONMENT)


def test_every_ckpt_variable_in_the_code_is_a_knob() -> None:
    used = {m for p in CODE for m in re.findall(r"\bCKPT_[A-Z0-9_]*[A-Z0-9]\b", p.read_text(encoding="utf-8"))}
    used -= FOR_COMMANDS
    assert used, "the scan found no CKPT_ name at all"
    assert used <= {k.variable for k in knobs.KNOBS.values()}, used - {k.variable for k in knobs.KNOBS.values()}


def test_no_getter_call_passes_a_default_and_each_reads_a_knob_of_its_type() -> None:
    calls = _getter_calls()
    read: set[str] = set()
    for file, line, getter, call in calls:
        where = f"{file}:{line}"
        assert len(call.args) == 1 and not call.keywords, f"{where}: {getter} takes the knob's name only"
        arg = call.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            name = arg.value
        elif isinstance(arg, ast.Name) and arg.id in _constants(ROOT / file):
            name = _constants(ROOT / file)[arg.id]
        else:
            assert file == "ckptrepo/knobs.py", f"{where}: name the knob with a literal or a module constant"
            continue
        assert name in knobs.KNOBS, f"{where}: {name!r} is not in knobs.KNOBS"
        assert isinstance(_default(knobs.KNOBS[name]), GETTERS[getter]), f"{where}: {getter} of {name}"
        read.add(name)
    # Every knob is read: by a getter, or (default None) where its variable is named outside.
    named = {m for p in CODE if p.name != "knobs.py"
             for m in re.findall(r"\bCKPT_([A-Z0-9_]*[A-Z0-9])\b|KNOBS\[\"([A-Z0-9_]+)\"\]", p.read_text("utf-8"))}
    outside = {a or b for a, b in named} - {v.removeprefix("CKPT_") for v in FOR_COMMANDS}
    assert read | outside == set(knobs.KNOBS), set(knobs.KNOBS) - read - outside


def test_knobs_read_the_environment_and_else_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CKPT_MAX_INFLIGHT", raising=False)
    assert knobs.get_int("MAX_INFLIGHT") == knobs.KNOBS["MAX_INFLIGHT"].default == 1
    monkeypatch.setenv("CKPT_MAX_INFLIGHT", "3")
    assert knobs.get_int("MAX_INFLIGHT") == 3
    monkeypatch.setenv("CKPT_MAX_INFLIGHT", "")
    assert knobs.get_int("MAX_INFLIGHT") == 1
    monkeypatch.setenv("CKPT_MAX_INFLIGHT", "three")
    with pytest.raises(UsageError, match="CKPT_MAX_INFLIGHT='three' is not an integer"):
        knobs.get_int("MAX_INFLIGHT")
    monkeypatch.delenv("CKPT_DIRECT_IO", raising=False)
    assert knobs.get_bool("DIRECT_IO") is True
    monkeypatch.setenv("CKPT_DIRECT_IO", "0")
    assert knobs.get_bool("DIRECT_IO") is False
    monkeypatch.delenv("CKPT_BACKGROUND_PRIORITY", raising=False)
    assert knobs.get_str("BACKGROUND_PRIORITY") == "normal"
    monkeypatch.setenv("CKPT_WORKERS", "0")
    assert knobs.workers() == 1


def test_a_computed_default_is_computed_only_when_the_variable_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    import getpass

    def no_user() -> str:
        raise KeyError("no such user")

    monkeypatch.setattr(getpass, "getuser", no_user)
    monkeypatch.setenv("CKPT_AUTHOR", "ada")
    assert knobs.get_str("AUTHOR") == "ada"
    monkeypatch.delenv("CKPT_AUTHOR")
    with pytest.raises(KeyError, match="no such user"):
        knobs.get_str("AUTHOR")
    monkeypatch.delenv("CKPT_WORKERS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 7)
    assert knobs.workers() == 7


def test_an_unknown_knob_or_a_getter_of_the_wrong_type_is_a_programming_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(KeyError):
        knobs.get_int("NOT_A_KNOB")
    monkeypatch.delenv("CKPT_BACKGROUND_PRIORITY", raising=False)
    with pytest.raises(TypeError):
        knobs.get_int("BACKGROUND_PRIORITY")
    with pytest.raises(TypeError):
        knobs.get_str("NO_AVX2")
