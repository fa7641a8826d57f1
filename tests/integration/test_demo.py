"""The demo trains, commits, branches and restores in a fresh repository, quickly with few steps."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from ckptrepo import Repo, demo
from ckptrepo.cli.app import app


def test_demo_builds_both_branches(tmp_path: Path) -> None:
    out = io.StringIO()
    root = demo.main(tmp_path / "tour", steps=16, every=4, console=Console(file=out, width=100))
    assert root == tmp_path / "tour"
    text = out.getvalue()
    assert "bit-identical" in text and "log lr-high" in text and "dedup" in text and "repack   encoded" in text

    with Repo.open(root) as repo:
        # The tour encodes what the commits stored raw before it prints the sizes.
        assert repo.repack_pending() == (0, 0)
        stats = repo.stats()
        assert 0 < stats.stored_bytes < stats.unique_bytes
        assert {b.name for b in repo.branches()} == {"main", "lr-high"}
        main = repo.log("main")
        branch = repo.log("lr-high")
    assert [c.step for c in main] == [16, 12, 8, 4]
    # lr-high forks at main@step=8 and commits at 12 and 16 on top of it.
    assert [c.step for c in branch] == [16, 12, 8, 4]
    assert [c.branch for c in branch] == ["lr-high", "lr-high", "main", "main"]
    assert branch[2].id == main[2].id
    assert branch[0].metrics.keys() == {"loss", "val_acc"}
    assert all(c.n_tensors > 0 for c in main)


def test_ckpt_demo_command(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["demo", "--dir", str(tmp_path / "d"), "--steps", "8"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    assert "lr-high" in result.stdout
    with Repo.open(tmp_path / "d") as repo:
        assert {b.name for b in repo.branches()} == {"main", "lr-high"}
