"""What starting ``ckpt`` and importing ``ckptrepo`` load (issue 45, item 9; issue 46).

``ckpt --version`` is answered before any command module is imported, so it loads neither the
database stack (sqlalchemy), nor torch, nor rich; ``import ckptrepo`` alone loads no database
stack either, its public names being imported at first use (PEP 562 ``__getattr__``). A command
imports its own module alone (``ckpt log``: not the formats, the plots, the web UI, rich's tables).
Each check runs in a fresh interpreter, since this one has imported everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

import ckptrepo

HEAVY = ("sqlalchemy", "torch", "rich", "numpy", "alembic", "ckptrepo.repository", "ckptrepo.cli.render")
ROOT = Path(__file__).resolve().parents[2]


def _loaded_after(code: str) -> dict[str, bool]:
    """Which of ``HEAVY`` are in ``sys.modules`` once ``code`` ran in a fresh interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT,
                         timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_version_imports_no_database_stack_torch_or_rich() -> None:
    loaded = _loaded_after("import sys\nsys.argv = ['ckpt', '--version']\n"
                           "from ckptrepo.cli.app import main\nmain()")
    assert not any(loaded.values()), loaded


def test_version_prints_the_version() -> None:
    out = subprocess.run([sys.executable, "-m", "ckptrepo.cli.app", "--version"], capture_output=True, text=True,
                         check=True, cwd=ROOT, timeout=120)
    assert out.stdout.startswith("ckpt ") and out.stderr == ""


OTHER_COMMANDS = ("ckptrepo.cli.state_commands", "ckptrepo.cli.analysis_commands", "ckptrepo.cli.ui_commands",
                  "ckptrepo.cli.verify_commands", "ckptrepo.cli.lineage_render", "ckptrepo.formats", "rich.table",
                  "rich.live")


def test_log_imports_its_own_command_alone(tmp_path: Path) -> None:
    ckptrepo.Repo.init(tmp_path).close()
    code = (f"import sys\nsys.argv = ['ckpt', '--repo', {str(tmp_path)!r}, 'log', '-n', '20']\n"
            "from ckptrepo.cli.app import main\ntry:\n    main()\nexcept SystemExit as e:\n    assert not e.code\n"
            f"import json\nprint(json.dumps([m for m in {OTHER_COMMANDS!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         timeout=120)
    assert "no commits yet" in out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_import_ckptrepo_loads_no_database_stack() -> None:
    loaded = _loaded_after("import ckptrepo")
    assert not loaded["sqlalchemy"] and not loaded["torch"] and not loaded["ckptrepo.repository"], loaded


def test_every_public_name_still_imports() -> None:
    for name in ckptrepo.__all__:
        assert getattr(ckptrepo, name) is not None, name
    from ckptrepo import DEFAULT_BRANCH, Commit, Repo, errors, find_repo
    from ckptrepo.repository import Repo as RepoItself
    from ckptrepo.types import Commit as CommitItself

    assert Repo is RepoItself and Commit is CommitItself and DEFAULT_BRANCH == "main"
    assert callable(find_repo) and errors.CkptError
    assert set(ckptrepo.__all__) <= set(dir(ckptrepo))


def test_unknown_name_is_an_attribute_error() -> None:
    try:
        ckptrepo.NoSuchName  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchName" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("ckptrepo.NoSuchName exists")


def test_public_names_load_lazily_in_a_fresh_interpreter() -> None:
    loaded = _loaded_after("import ckptrepo\nassert ckptrepo.RefInfo.__name__ == 'RefInfo'")
    assert not loaded["sqlalchemy"], loaded  # a result type needs no database
    loaded = _loaded_after("from ckptrepo import Repo\nassert Repo.__name__ == 'Repo'")
    assert loaded["sqlalchemy"] and loaded["ckptrepo.repository"]


def test_the_app_with_every_command_for_cli_runner() -> None:
    from ckptrepo.cli.app import app

    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("init", "status", "commit", "checkout", "log", "show", "branch", "verify", "plot", "ui"):
        assert command in result.stdout, command
    assert CliRunner().invoke(app, ["--version"]).stdout.startswith("ckpt ")
    for group, commands in (("lineage", ("ancestors", "merge-base")), ("db", ("upgrade", "rebuild")),
                            ("plot", ("history", "metrics"))):
        result = CliRunner().invoke(app, [group, "--help"])
        assert result.exit_code == 0 and all(command in result.stdout for command in commands), result.stdout
    result = CliRunner().invoke(app, ["lgo"])
    assert result.exit_code == 2 and "Did you mean 'log'" in result.output
