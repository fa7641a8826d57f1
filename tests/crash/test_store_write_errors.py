"""Write errors of the store mid-commit: a clear error (``StoreFull``, ``StorageError``, exit
code 7), nothing visible, and the next commit works once the cause is gone. A full disk is a
real one: a small tmpfs mounted by the test (root only; skipped otherwise)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import ckptrepo
from ckptrepo import errors
from ckptrepo.cli.app import app

MIB = 1 << 20


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs at ``tmp_path / "fs"``, unmounted afterwards."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "fs"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(fs: Path, leave: int) -> Path:
    """A file taking all but ``leave`` bytes of ``fs``."""
    free = shutil.disk_usage(fs).free
    filler = fs / "filler"
    with open(filler, "wb") as f:
        f.truncate(0)
        f.write(b"\0" * max(0, free - leave))
    return filler


@pytest.mark.parametrize("blocking", [False, True])
def test_a_full_disk_fails_the_commit_cleanly_and_the_next_one_works(small_fs: Path, blocking: bool) -> None:
    with ckptrepo.Repo.init(small_fs / "repo", compression=False) as repo:
        first = repo.commit({"w": torch.arange(1000.0)}, blocking=True).wait()
        filler = fill(small_fs, leave=2 * MIB)
        big = {"w": torch.randn(4 * MIB // 4)}  # 4 MiB: does not fit
        with pytest.raises(errors.StoreFull) as exc:
            repo.commit(big, blocking=blocking).wait()
        assert exc.value.exit_code == 7 and "No space left" in str(exc.value) and "ckpt gc" in exc.value.hint
        assert [c.id for c in repo.log()] == [first.id]  # nothing of it is visible
        assert repo.verify(full=True).ok
        filler.unlink()
        again = repo.commit(big).wait()
        assert torch.equal(repo.checkout(again.id)["w"], big["w"])
        assert torch.equal(repo.checkout(first.id)["w"], torch.arange(1000.0))
        repo.gc(grace=0)  # what the failed commit left is reclaimed; nothing visible is
        assert repo.verify(full=True).ok and torch.equal(repo.checkout("main")["w"], big["w"])


def test_ckpt_commit_on_a_full_disk_exits_with_the_storage_code(small_fs: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    src = tmp_path / "big.safetensors"
    save_file({"w": torch.randn(4 * MIB // 4)}, str(src))
    runner = CliRunner()
    repo = small_fs / "repo"
    assert runner.invoke(app, ["--repo", str(repo), "init"]).exit_code == 0
    fill(small_fs, leave=2 * MIB)
    result = runner.invoke(app, ["--repo", str(repo), "commit", str(src)])
    assert result.exit_code == 7, result.output
    assert "No space left" in result.output
    with ckptrepo.Repo.open(repo) as r:
        assert r.log() == []


@pytest.mark.parametrize("blocking", [False, True])
def test_an_io_error_writing_the_store_fails_the_commit_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 blocking: bool) -> None:
    """The disk reports an I/O error when a commit's pack is made durable (injected into the
    process's fsync, as a failed writeback reports it): StorageError, not a raw OSError;
    nothing visible; the next commit works."""
    import errno

    with ckptrepo.Repo.init(tmp_path / "repo", compression=False) as repo:
        first = repo.commit({"w": torch.arange(1000.0)}, blocking=True).wait()
        real = os.fsync

        def failing(fd: int) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "fsync", failing)
        with pytest.raises(errors.StorageError) as exc:
            repo.commit({"w": torch.randn(MIB)}, blocking=blocking).wait()
        monkeypatch.setattr(os, "fsync", real)
        assert not isinstance(exc.value, errors.StoreFull) and exc.value.exit_code == 7
        assert "Input/output error" in str(exc.value)
        assert [c.id for c in repo.log()] == [first.id]
        again = repo.commit({"w": torch.ones(10)}).wait()
        assert torch.equal(repo.checkout(again.id)["w"], torch.ones(10)) and repo.verify(full=True).ok
