"""Atomic and durable output: the helpers every file or folder ckptrepo writes in place of
another goes through.

``atomic_output`` writes one file (``config.json``, ``.ckpt/HEAD``, exported checkpoints,
charts); ``atomic_build`` builds a folder, or a file with companions, under a temporary name and
publishes it (a new repository folder, an exported DCP folder, a rebuilt SQLite database). Both
keep one order: a reader of the final path sees what was there or the complete new output,
never a torn one, and after a crash the final name never points at bytes that did not reach the
disk: everything is written under a temporary name in the same folder, fsynced, renamed to the
final name, and the folder's entries fsynced. Pack files take the store's own path
(``storage.Backend.put_file``), with the same order and ``fsync_file`` / ``fsync_dir``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

from ckptrepo.errors import OutputExists, UsageError

# What fsync of a folder answers on a filesystem (or platform) that cannot sync one.
_NO_FOLDER_SYNC = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS})


def fsync_file(path: str | Path) -> None:
    """Make the bytes of the file at ``path`` durable; OSError when the OS refuses."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | Path) -> None:
    """Make the entries of folder ``path`` durable (a rename into it survives a crash).

    Nothing to do where folders cannot be synced: a folder this process may not open (Windows
    opens none; renames persist there on their own) or a filesystem whose fsync of a folder
    answers "not supported". Any other failure (an I/O error, a missing folder) is an OSError.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except PermissionError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in _NO_FOLDER_SYNC:
            raise
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
    tmp = _temporary_beside(path)
    try:
        try:
            yield tmp
            # The bytes must be durable before the name points at them, or a crash leaves a torn file.
            fsync_file(tmp)
            if replace:
                os.replace(tmp, path)
            else:
                _publish_new(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        fsync_dir(path.parent)  # the rename is durable only once the folder's entries are
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from e


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


@contextlib.contextmanager
def atomic_build(path: Path, *, temporary: Path | None = None, aside: Path | None = None,
                 companions: tuple[str, ...] = ()) -> Iterator[Path]:
    """Yield a path beside ``path`` where nothing is, for the block to build there a folder and
    everything in it, or a file; then publish that build at ``path``, atomically and durably.

    The path yielded is ``temporary`` when given (a name in ``path``'s folder: what a build
    interrupted there left, and its companions, is removed first), else a fresh hidden name.
    When the block returns, in this order: every file and folder it built is fsynced (a folder
    after what it holds; symbolic links and special files are left alone); with ``aside``,
    whatever is at ``path`` and at ``path`` + each suffix of ``companions`` (a SQLite
    database's ``-wal`` and ``-shm``) is renamed to ``aside`` + the same suffix; the build is
    renamed to ``path``, which replaces only what a rename may (a file by a file, an empty
    folder by a folder: OutputExists when something else is there, a folder with content, a
    folder where a file was built or the reverse); and ``path``'s folder is fsynced.

    A reader of ``path`` sees what was there until the rename, then the whole build (with
    ``aside``: nothing between the first move aside and the rename). A crash before the renames
    leaves ``path`` as it was and the build under its temporary name; once the folder's fsync
    returned, the build is at ``path`` for good; in between, each rename may have happened or not.

    When the block raises, or a step up to the rename fails (OutputExists, or an OSError as the
    OS gave it: the caller words it), the temporary and its companions are removed and nothing
    is published; what was moved aside stays there (so a rename refused after the moves leaves
    nothing at ``path``). An OSError from the last fsync comes after the rename: the build is
    published, not known durable.
    """
    path = Path(path)
    tmp = Path(temporary) if temporary is not None else _temporary_beside(path)
    _remove(tmp, companions)
    try:
        yield tmp
        # The built bytes and names must be durable before ``path`` names them, or a crash
        # could leave a complete-looking output over missing files.
        _fsync_tree(tmp)
        if aside is not None:
            for suffix in ("", *companions):
                with contextlib.suppress(FileNotFoundError):
                    os.rename(f"{path}{suffix}", f"{aside}{suffix}")
        try:
            os.replace(tmp, path)
        except OSError as e:
            if os.path.lexists(path):
                raise OutputExists(path=str(path)) from e
            raise
    except BaseException:
        with contextlib.suppress(OSError):
            _remove(tmp, companions)
        raise
    fsync_dir(path.parent)  # the renames are durable only once the folder's entries are


def _temporary_beside(path: Path) -> Path:
    """A fresh hidden name in ``path``'s folder, for output on its way to ``path``."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")


def _remove(tmp: Path, companions: tuple[str, ...]) -> None:
    """Remove ``tmp`` (a folder with what it holds, or a file) and ``tmp`` + each suffix."""
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp)
    else:
        tmp.unlink(missing_ok=True)
    for suffix in companions:
        Path(f"{tmp}{suffix}").unlink(missing_ok=True)


def _fsync_tree(path: Path) -> None:
    """fsync the regular file ``path``, or every regular file and folder under the folder
    ``path`` and then ``path`` itself, never through a symbolic link."""
    mode = os.lstat(path).st_mode
    if stat.S_ISREG(mode):
        fsync_file(path)
    elif stat.S_ISDIR(mode):
        with os.scandir(path) as entries:
            inside = [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)
                      or e.is_file(follow_symlinks=False)]
        for child in inside:
            _fsync_tree(child)
        fsync_dir(path)
