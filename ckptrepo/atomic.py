"""Whole-file output that is atomic and durable: the one helper every file ckptrepo writes in
place of another goes through (``config.json``, ``.ckpt/HEAD``, exported checkpoints, charts).

A reader of the final path sees the old file or the complete new one, never a torn one, and
after a crash the new name never points at bytes that did not reach the disk: the bytes are
written to a temporary name in the same folder, fsynced, renamed over the final name, and the
folder's entries fsynced. Pack files take the store's own path (``storage.Backend.put_file``),
with the same order.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

from ckptrepo.errors import OutputExists, UsageError


def fsync_dir(path: Path) -> None:
    """Make the entries of folder ``path`` durable (a rename into it survives a crash). A
    platform that cannot open a folder (Windows) persists renames on its own: nothing to do."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def check_new(path: Path) -> None:
    """OutputExists when anything is at ``path``, a symbolic link included (dangling or not)."""
    if os.path.lexists(path):
        raise OutputExists(path=str(path))


@contextlib.contextmanager
def atomic_output(path: Path, *, replace: bool = True) -> Iterator[Path]:
    """Yield a fresh temporary path beside ``path`` for the caller to create and write; then
    publish it: fsync the file, rename it over ``path``, fsync the folder. A symbolic link at
    ``path`` is replaced itself, never followed.

    ``replace=False``: nothing at ``path`` is ever replaced (OutputExists, whatever appeared there
    while the block ran): the file is published by a hard link to ``path``, which the OS refuses
    when the name is taken; on a filesystem without hard links, by a rename after checking.

    When the block raises, the temporary file is removed and ``path`` is untouched. UsageError
    (naming ``path``) when its folder does not exist or the OS refuses a step.
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise UsageError(f"cannot write {path}: folder {path.parent} does not exist")
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        yield tmp
        # The bytes must be durable before the name points at them, or a crash leaves a torn file.
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            _publish_new(tmp, path)
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from e
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    fsync_dir(path.parent)  # the rename is durable only once the folder's entries are


def _publish_new(tmp: Path, path: Path) -> None:
    """Give the file ``tmp`` the name ``path`` too, unless that name is taken (OutputExists)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise OutputExists(path=str(path)) from None
    except OSError:  # no hard links here (FAT, some network and FUSE filesystems)
        check_new(path)
        os.replace(tmp, path)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``, atomically and durably (see ``atomic_output``)."""
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)
