"""One commit, read-only, at a local folder, through FUSE (fusepy over libfuse 2).

``serve`` mounts the view of a commit (``Repo.view``) at an empty folder and serves it in the
calling thread until the folder is unmounted (``fusermount -u DIR``), or the process gets
SIGINT (Ctrl-C) or SIGTERM: libfuse unmounts then. ``ckpt mount`` runs it. ``mount`` is the
same as a context manager, for tests and programs: the filesystem runs in a child process
(a reader in the serving process could deadlock: a page fault of a memory map taken while
holding the GIL would wait for a FUSE thread that needs the GIL), the commit is resolved and
its view built here first, so a bad revision fails before anything is mounted.

The mount is read-only (``ro``; every write the kernel lets through gets EROFS), holds only
files and folders (mode 0444 and 0555, the mounting user's), each file's times the commit's.
File contents never change, so the kernel may keep them cached across opens (``kernel_cache``)
and its attributes as long as it likes. A chunk that fails its check fails the read with EIO
(and the reason on the serving process's stderr), never with wrong bytes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ckptrepo
from ckptrepo.errors import CkptError, IntegrityError, UnknownFile, UsageError

if TYPE_CHECKING:
    from ckptrepo.restore.view import CommitView

INSTALL_HINT = ("Install fusepy (`pip install 'ckptrepo[mount]'`) and libfuse 2 (Debian/Ubuntu: "
                "`apt-get install fuse libfuse2`; the kernel's /dev/fuse must be available, in a container "
                "`--device /dev/fuse --cap-add SYS_ADMIN`). fsspec reads need none of this: "
                "fsspec.open('ckptrepo://PATH@REV/FILE').")
_ATTR_TIMEOUT = 3600.0  # seconds the kernel may keep names and attributes: a view never changes


def load_fuse() -> Any:
    """The ``fuse`` module of fusepy; UsageError saying how to install what is missing (fusepy,
    or the libfuse 2 library it loads when imported)."""
    try:
        import fuse
    except ImportError as exc:
        raise UsageError("mounting a commit needs the Python package fusepy, which is not installed",
                         hint=INSTALL_HINT) from exc
    except OSError as exc:  # fusepy raises EnvironmentError("Unable to find libfuse")
        raise UsageError(f"mounting a commit needs libfuse 2 (libfuse.so.2): {exc}", hint=INSTALL_HINT) from exc
    return fuse


def check_folder(folder: Path) -> Path:
    """``folder`` made absolute; UsageError unless it is an existing, empty folder that is not a mount."""
    folder = Path(folder).absolute()
    if not folder.is_dir():
        raise UsageError(f"cannot mount at {folder}: no such folder", hint="Create an empty folder first.")
    if os.path.ismount(folder):
        raise UsageError(f"cannot mount at {folder}: something is mounted there",
                         hint=f"Unmount it first (`fusermount -u {folder}`), or pick another folder.")
    if any(folder.iterdir()):
        raise UsageError(f"cannot mount at {folder}: the folder is not empty", hint="Mount at an empty folder.")
    return folder


def operations(view: CommitView, mtime: float) -> Any:
    """fusepy operations serving ``view`` (files and folders, read-only)."""
    fuse = load_fuse()
    uid, gid = os.getuid(), os.getgid()

    class ViewOperations(fuse.Operations):  # type: ignore[misc,name-defined]  # fusepy is untyped
        use_ns = False

        def __init__(self) -> None:
            self.ready: Callable[[], None] | None = None

        def init(self, path: str) -> None:
            if self.ready is not None:
                self.ready()

        @staticmethod
        def _rel(path: str) -> str:
            return path.strip("/")

        def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
            rel = self._rel(path)
            times = {"st_atime": mtime, "st_mtime": mtime, "st_ctime": mtime, "st_uid": uid, "st_gid": gid}
            found = view.files.get(rel)
            if found is not None:
                return {"st_mode": stat.S_IFREG | 0o444, "st_nlink": 1, "st_size": found.size,
                        "st_blocks": -(-found.size // 512), **times}
            if rel in view.dirs:
                return {"st_mode": stat.S_IFDIR | 0o555, "st_nlink": 2, "st_size": 0, **times}
            raise fuse.FuseOSError(errno.ENOENT)

        def readdir(self, path: str, fh: Any) -> list[str]:
            rel = self._rel(path)
            if rel not in view.dirs:
                raise fuse.FuseOSError(errno.ENOENT if rel not in view.files else errno.ENOTDIR)
            return [".", "..", *view.dirs[rel]]

        def access(self, path: str, amode: int) -> int:
            self.getattr(path)
            if amode & os.W_OK:
                raise fuse.FuseOSError(errno.EROFS)
            return 0

        def open(self, path: str, flags: int) -> int:
            if self._rel(path) not in view.files:
                raise fuse.FuseOSError(errno.ENOENT if self._rel(path) not in view.dirs else errno.EISDIR)
            if flags & os.O_ACCMODE != os.O_RDONLY or flags & (os.O_TRUNC | os.O_CREAT | os.O_APPEND):
                raise fuse.FuseOSError(errno.EROFS)
            return 0

        def read(self, path: str, size: int, offset: int, fh: Any) -> bytes:
            try:
                return view.read(self._rel(path), offset, offset + size)
            except UnknownFile:
                raise fuse.FuseOSError(errno.ENOENT) from None
            except IntegrityError as exc:
                print(f"ckpt mount: reading {path!r} failed: {exc}", file=sys.stderr, flush=True)
                raise fuse.FuseOSError(errno.EIO) from None
            except Exception as exc:  # a missing pack, a database error: the reader gets EIO, the log the cause
                print(f"ckpt mount: reading {path!r} failed: {type(exc).__name__}: {exc}", file=sys.stderr,
                      flush=True)
                raise fuse.FuseOSError(errno.EIO) from None

        def statfs(self, path: str) -> dict[str, int]:
            total = sum(f.size for f in view.files.values())
            return {"f_bsize": 1 << 17, "f_frsize": 1 << 17, "f_blocks": -(-total // (1 << 17)), "f_bfree": 0,
                    "f_bavail": 0, "f_files": len(view.files) + len(view.dirs), "f_ffree": 0, "f_namemax": 255}

    return ViewOperations()


def serve(repo: str | Path, rev: str | None, folder: str | Path, *, layout: str = "auto",
          max_shard_size: int | str = "5GB", ready: Callable[[str], None] | None = None) -> None:
    """Mount the view of ``rev`` at ``folder`` (an empty folder) and serve it here until it is
    unmounted or the process is interrupted. ``ready(commit id)`` is called once the kernel has
    the filesystem. ``rev`` None: the current branch. UsageError for a missing fusepy or libfuse, or an unusable folder;
    the repository's errors for a bad revision, before anything is mounted."""
    fuse = load_fuse()
    target = check_folder(Path(folder))
    with ckptrepo.Repo.open(repo, read_only=True) as opened:
        view = opened.view(rev or opened.head, layout=layout, max_shard_size=max_shard_size)
        commit = opened.get_commit(view.commit_id)
        ops = operations(view, commit.created_at.timestamp())
        if ready is not None:
            ops.ready = lambda: ready(view.commit_id)
        try:
            fuse.FUSE(ops, str(target), foreground=True, ro=True, nothreads=False,
                      fsname=f"ckptrepo:{view.commit_id[:10]}", subtype="ckptrepo", kernel_cache=True,
                      default_permissions=True, attr_timeout=_ATTR_TIMEOUT, entry_timeout=_ATTR_TIMEOUT)
        except RuntimeError as exc:  # fuse_main failed: libfuse printed why on stderr
            raise CkptError(f"could not mount at {target} (libfuse returned {exc})", hint=INSTALL_HINT) from exc


_CHILD = "import sys; from ckptrepo.view.fuse_mount import serve; serve(*sys.argv[1:4], layout=sys.argv[4], " \
         "max_shard_size=sys.argv[5])"


@contextlib.contextmanager
def mount(repo: str | Path, rev: str, folder: str | Path, *, layout: str = "auto", max_shard_size: int | str = "5GB",
          timeout: float = 60.0) -> Iterator[Path]:
    """The view of ``rev`` mounted read-only at ``folder`` (an empty folder) for the ``with`` block,
    served by a child process; yields the folder. The revision is resolved here, at entry, and
    the mount pinned to that commit. Unmounted on exit (lazily if something still holds it).
    UsageError for a missing fusepy or libfuse or an unusable folder; CkptError when the
    child fails to mount within ``timeout`` seconds (with its error output)."""
    load_fuse()
    target = check_folder(Path(folder))
    with ckptrepo.Repo.open(repo, read_only=True) as opened:
        commit_id = opened.view(rev, layout=layout, max_shard_size=max_shard_size).commit_id
    with tempfile.TemporaryFile() as log:
        child = subprocess.Popen([sys.executable, "-c", _CHILD, str(Path(repo).absolute()), commit_id, str(target),
                                  layout, str(max_shard_size)], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + timeout
            while not os.path.ismount(target):
                if child.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    output = log.read().decode(errors="replace").strip()
                    raise CkptError(f"could not mount commit {commit_id[:10]} at {target}: "
                                    f"{output[-2000:] or 'the serving process exited'}", hint=INSTALL_HINT)
                time.sleep(0.02)
            yield target
        finally:
            unmount(target)
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def unmount(folder: Path) -> None:
    """Unmount the FUSE filesystem at ``folder`` (``fusermount -u``; lazily when it is busy)."""
    tool = shutil.which("fusermount") or shutil.which("fusermount3") or "fusermount"
    for attempt in range(10):
        if not os.path.ismount(folder):
            return
        lazy = ["-z"] if attempt == 9 else []
        subprocess.run([tool, "-u", *lazy, str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=False)
        time.sleep(0.05 * (attempt + 1) if os.path.ismount(folder) else 0)
