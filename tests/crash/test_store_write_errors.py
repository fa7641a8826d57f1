"""Write errors of the store mid-commit: a clear error (``StoreFull``, ``StorageError``, exit
code 7), nothing visible, and the next commit works once the cause is gone. A full disk is a
real one: a small tmpfs mounted by the test (root only; skipped otherwise); an S3 endpoint
that goes away is the tests' S3 server behind a proxy that cuts every connection mid-upload."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


class CuttingProxy:
    """A TCP proxy on loopback in front of the S3 server that goes away (closes every
    connection and refuses new ones) once ``cut_after`` bytes of requests went through, until
    ``restore()``."""

    def __init__(self, target_port: int, cut_after: int) -> None:
        import socket
        import threading

        self.target_port, self.cut_after, self.sent, self.up = target_port, cut_after, 0, True
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self.lock:
                self.open += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: Any, dst: Any, request: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                if request:
                    self.sent += len(data)
                    if self.up and self.sent > self.cut_after:
                        self.go_away()
                        return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.close()

    def go_away(self) -> None:
        self.up = False
        with self.lock:
            for sock in self.open:
                with contextlib.suppress(OSError):
                    sock.close()
            self.open.clear()

    def restore(self) -> None:
        self.sent, self.up = 0, True
        self.cut_after = 1 << 62

    def close(self) -> None:
        self.go_away()
        self.listener.close()


def test_an_s3_endpoint_that_goes_away_mid_commit_fails_it_cleanly(tmp_path: Path, s3_endpoint: str,
                                                                   s3_credentials: None) -> None:
    """The S3 endpoint disappears while a commit's packs upload: StorageError (after boto's
    retries), nothing visible; with the endpoint back, the same commit succeeds."""
    import uuid
    from urllib.parse import urlparse

    import boto3

    bucket = f"ckpt-{uuid.uuid4().hex[:20]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    proxy = CuttingProxy(int(urlparse(s3_endpoint).port or 0), cut_after=1 << 62)
    url = f"s3://{bucket}/store?endpoint_url=http://127.0.0.1:{proxy.port}"
    try:
        with ckptrepo.Repo.init(tmp_path / "repo", store_url=url, compression=False) as repo:
            first = repo.commit({"w": torch.arange(1000.0)}, blocking=True).wait()
            big = {"w": torch.randn(8 * MIB // 4)}
            proxy.sent, proxy.cut_after = 0, 2 * MIB  # a quarter into the upload
            with pytest.raises(errors.StorageError) as exc:
                repo.commit(big).wait()
            assert exc.value.exit_code == 7 and not proxy.up
            proxy.restore()
            assert [c.id for c in repo.log()] == [first.id]
            again = repo.commit(big).wait()
            assert torch.equal(repo.checkout(again.id)["w"], big["w"])
            assert repo.verify(full=True).ok
    finally:
        proxy.close()


def test_a_full_disk_under_the_database_fails_the_commit_cleanly(small_fs: Path, tmp_path: Path) -> None:
    """The packs go to a store elsewhere and fit; the database's own disk is full: StoreFull
    from its transaction, nothing visible, and the next commit works once space is freed."""
    with ckptrepo.Repo.init(small_fs / "repo", store_url=str(tmp_path / "store"), compression=False) as repo:
        first = repo.commit({"w": torch.arange(1000.0)}, blocking=True).wait()
        filler = fill(small_fs, leave=0)
        state = {"w": torch.randn(MIB // 4)}
        with pytest.raises(errors.StoreFull, match="the database"):
            repo.commit(state).wait()
        filler.unlink()
        assert [c.id for c in repo.log()] == [first.id]
        again = repo.commit(state).wait()
        assert torch.equal(repo.checkout(again.id)["w"], state["w"]) and repo.verify(full=True).ok
