"""Atomic, durable output (``ckptrepo.atomic``): a folder or a file is built under a temporary
name, fsynced whole, renamed into place and its folder fsynced; a failure publishes nothing and
leaves no temporary behind."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptrepo import atomic
from ckptrepo.errors import OutputExists, UsageError


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _build(into: Path) -> None:
    (into / "sub" / "deeper").mkdir(parents=True)
    (into / "a").write_bytes(b"a")
    (into / "sub" / "b").write_bytes(b"b")
    (into / "sub" / "deeper" / "c").write_bytes(b"c")


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    """Every fsync and rename the helpers make, in order, as ``(what, path)``."""
    seen: list[tuple[str, str]] = []
    real_file, real_dir, real_replace = atomic.fsync_file, atomic.fsync_dir, os.replace

    def fsync_file(path: str | Path) -> None:
        seen.append(("file", str(path)))
        real_file(path)

    def fsync_dir(path: str | Path) -> None:
        seen.append(("dir", str(path)))
        real_dir(path)

    def replace(src: str | Path, dst: str | Path) -> None:
        seen.append(("rename", f"{src} -> {dst}"))
        real_replace(src, dst)

    monkeypatch.setattr(atomic, "fsync_file", fsync_file)
    monkeypatch.setattr(atomic, "fsync_dir", fsync_dir)
    monkeypatch.setattr(os, "replace", replace)
    yield seen


def test_a_folder_is_fsynced_whole_before_its_rename_and_its_parent_after(tmp_path: Path,
                                                                           events: list[tuple[str, str]]) -> None:
    final = tmp_path / "out"
    with atomic.atomic_build(final) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".") and not tmp.exists()
        tmp.mkdir()
        _build(tmp)
        (tmp / "link").symlink_to(tmp_path)  # not followed
    assert (final / "sub" / "deeper" / "c").read_bytes() == b"c" and _names(tmp_path) == ["out"]
    rename = [i for i, (what, _) in enumerate(events) if what == "rename"]
    assert len(rename) == 1
    before = {(what, str(Path(p).relative_to(tmp))) for what, p in events[: rename[0]]}
    assert before == {("file", "a"), ("file", "sub/b"), ("file", "sub/deeper/c"),
                      ("dir", "sub/deeper"), ("dir", "sub"), ("dir", ".")}
    assert [p for what, p in events[: rename[0]] if what == "dir"][-1] == str(tmp)  # the folder after its content
    assert events[rename[0] + 1:] == [("dir", str(tmp_path))]


def test_an_empty_folder_is_replaced_and_one_with_content_refuses(tmp_path: Path) -> None:
    final = tmp_path / "out"
    final.mkdir()
    with atomic.atomic_build(final) as tmp:
        tmp.mkdir()
        _build(tmp)
    assert _names(final) == ["a", "sub"]
    with pytest.raises(OutputExists), atomic.atomic_build(final) as tmp:
        tmp.mkdir()
        (tmp / "new").write_bytes(b"new")
    assert _names(final) == ["a", "sub"] and _names(tmp_path) == ["out"]  # untouched, no temporary left
    (tmp_path / "file").write_bytes(b"f")
    with pytest.raises(OutputExists), atomic.atomic_build(tmp_path / "file") as tmp:
        tmp.mkdir()  # a folder never replaces a file
    assert (tmp_path / "file").read_bytes() == b"f" and _names(tmp_path) == ["file", "out"]


def test_a_block_that_raises_publishes_nothing_and_leaves_no_temporary(tmp_path: Path) -> None:
    final = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt), atomic.atomic_build(final) as tmp:
        tmp.mkdir()
        _build(tmp)
        raise KeyboardInterrupt
    assert _names(tmp_path) == []


def test_a_refused_rename_publishes_nothing_and_leaves_no_temporary(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(src: str | Path, dst: str | Path) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="Input/output error") as refused, atomic.atomic_build(tmp_path / "out") as tmp:
        tmp.mkdir()
        _build(tmp)
    assert not isinstance(refused.value, OutputExists) and _names(tmp_path) == []


def test_a_file_with_companions_replaces_one_moved_aside(tmp_path: Path) -> None:
    final, building, aside = tmp_path / "db", tmp_path / "db.building", tmp_path / "db.old"
    for suffix, data in (("", b"old"), ("-wal", b"old log"), ("-shm", b"old index")):
        Path(f"{final}{suffix}").write_bytes(data)
    for suffix in ("", "-wal", "-shm"):  # what a build interrupted at the same name left
        Path(f"{building}{suffix}").write_bytes(b"leftover")
    with atomic.atomic_build(final, temporary=building, aside=aside, companions=("-wal", "-shm")) as tmp:
        assert tmp == building and _names(tmp_path) == ["db", "db-shm", "db-wal"]
        tmp.write_bytes(b"new")
    assert final.read_bytes() == b"new" and aside.read_bytes() == b"old"
    assert Path(f"{aside}-wal").read_bytes() == b"old log" and Path(f"{aside}-shm").read_bytes() == b"old index"
    assert _names(tmp_path) == ["db", "db.old", "db.old-shm", "db.old-wal"]


def test_a_failed_build_at_a_fixed_name_removes_it_and_its_companions(tmp_path: Path) -> None:
    final, building = tmp_path / "db", tmp_path / "db.building"
    final.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="no"), atomic.atomic_build(
            final, temporary=building, aside=tmp_path / "db.old", companions=("-wal",)) as tmp:
        tmp.write_bytes(b"half")
        Path(f"{tmp}-wal").write_bytes(b"log")
        raise RuntimeError("no")
    assert _names(tmp_path) == ["db"] and final.read_bytes() == b"old"  # nothing moved aside either


def test_fsync_dir_skips_what_cannot_be_synced_and_raises_the_rest(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    failure = [errno.EINVAL]

    def fsync(fd: int) -> None:
        raise OSError(failure[0], os.strerror(failure[0]))

    monkeypatch.setattr(os, "fsync", fsync)
    atomic.fsync_dir(tmp_path)  # a filesystem without folder fsync: nothing to do
    failure[0] = errno.EIO
    with pytest.raises(OSError, match="Input/output error"):
        atomic.fsync_dir(tmp_path)
    with pytest.raises(FileNotFoundError):
        atomic.fsync_dir(tmp_path / "missing")


def test_atomic_output_words_a_failed_step_and_leaves_no_temporary(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f"
    with atomic.atomic_output(target) as tmp:
        tmp.write_bytes(b"one")
    with pytest.raises(OutputExists), atomic.atomic_output(target, replace=False) as tmp:
        tmp.write_bytes(b"two")
    assert target.read_bytes() == b"one" and _names(tmp_path) == ["f"]

    def broken(path: str | Path) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(atomic, "fsync_dir", broken)
    with pytest.raises(UsageError, match=re.escape(f"cannot write {target}: Input/output error")), \
            atomic.atomic_output(target) as tmp:
        tmp.write_bytes(b"three")
    assert _names(tmp_path) == ["f"]
