"""Pack store on a local (or mounted) filesystem.

Layout: each key is a file under ``root`` at the key's path; files being written live in
``root/.staging`` (the same filesystem, so the final rename is atomic). Reads go through a
small cache of open descriptors and ``os.pread``/``os.preadv``, safe to share between
reader threads.

Symbolic links below ``root`` (``root`` itself may be one) are never acted through by ``list``
and ``delete``: ``list`` neither lists a link nor enters a linked folder, and ``delete`` opens
each folder of the key without following links (``O_NOFOLLOW``) and removes the name inside
the folder it opened, so it never removes anything outside the store (a key whose folder is a
link is refused with StorageError; a key that is itself a link loses only the link).
``walk_files`` lists the staging folder for ``gc`` and ``verify`` the same way.

``put_if`` (compare-and-swap) serializes through ``root/.cas.lock`` (``flock``): like ``.staging``
a dot-name, so no key, never listed, and neither ``gc`` nor ``verify`` looks at it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ckptrepo.atomic import fsync_dir, fsync_file
from ckptrepo.errors import StorageError
from ckptrepo.ids import hash_bytes
from ckptrepo.storage.base import check_key, check_prefix, check_range, missing, short_read

STAGING_NAME = ".staging"
CAS_LOCK = ".cas.lock"  # held while a compare-and-swap reads, compares and writes (``put_if``)
_FD_CACHE_SIZE = 64
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_HAVE_PREADV = hasattr(os, "preadv")


def _ensure_dir(path: Path) -> None:
    """Create ``path`` and any missing parents, durably.

    Each new directory's entry is fsynced in its parent: a file renamed into a directory
    whose own entry is lost in a crash would be lost with it.
    """
    if path.is_dir():
        return
    missing_dirs: list[Path] = []
    probe = path
    while not probe.is_dir():
        missing_dirs.append(probe)
        probe = probe.parent
    for new_dir in reversed(missing_dirs):
        with contextlib.suppress(FileExistsError):
            new_dir.mkdir()
        fsync_dir(new_dir.parent)


class _CasLocks:
    """This process's side of ``LocalBackend.put_if``: a lock per store root for its threads, and
    the descriptors of ``CAS_LOCK`` it has open. ``put_if`` releases its ``flock`` explicitly
    (``LOCK_UN`` acts for every copy of the descriptor), and a child forked meanwhile closes its
    copies and starts with fresh locks (the parent's thread that held one is not in it), so a
    long-lived child never holds a lock its parent took."""

    def __init__(self) -> None:
        self.guard = threading.Lock()
        self.by_root: dict[str, threading.Lock] = {}
        self.open_fds: set[int] = set()

    def of(self, root: Path) -> threading.Lock:
        with self.guard:
            return self.by_root.setdefault(str(root), threading.Lock())

    def after_fork_in_child(self) -> None:
        for fd in self.open_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.open_fds = set()
        self.guard = threading.Lock()
        self.by_root = {}


_CAS = _CasLocks()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_CAS.after_fork_in_child)

_PUT_ATTEMPTS = 5  # a put whose staged file a concurrent gc removed is written again


@dataclass
class _Fd:
    fd: int
    users: int = 0
    stale: bool = False


class _FdCache:
    """LRU of read-only descriptors; a descriptor is closed only once no reader uses it."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._lock = threading.Lock()
        self._open: OrderedDict[str, _Fd] = OrderedDict()

    def _retire(self, entry: _Fd) -> None:
        entry.stale = True
        if entry.users == 0:
            os.close(entry.fd)

    @contextlib.contextmanager
    def use(self, key: str, path: Path) -> Iterator[int]:
        with self._lock:
            entry = self._open.get(key)
            if entry is not None:
                self._open.move_to_end(key)
                entry.users += 1
        if entry is None:
            fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
            with self._lock:
                entry = self._open.get(key)
                if entry is None:
                    entry = self._open[key] = _Fd(fd)
                    while len(self._open) > self._capacity:
                        self._retire(self._open.popitem(last=False)[1])
                else:
                    os.close(fd)
                entry.users += 1
        try:
            yield entry.fd
        finally:
            with self._lock:
                entry.users -= 1
                if entry.stale and entry.users == 0:
                    os.close(entry.fd)

    def forget(self, key: str) -> None:
        with self._lock:
            entry = self._open.pop(key, None)
            if entry is not None:
                self._retire(entry)

    def clear(self) -> None:
        with self._lock:
            while self._open:
                self._retire(self._open.popitem()[1])


def _pread_into(fd: int, out: memoryview, offset: int) -> int:
    """Read into ``out`` from ``offset`` until full or end of file; return bytes read."""
    done = 0
    total = len(out)
    while done < total:
        if _HAVE_PREADV:
            got = os.preadv(fd, [out[done:]], offset + done)
        else:  # pragma: no cover - platforms without preadv
            chunk = os.pread(fd, total - done, offset + done)
            got = len(chunk)
            out[done : done + got] = chunk
        if got == 0:
            break
        done += got
    return done


class LocalBackend:
    """Objects as files under ``root``; see the module docstring for the layout.

    ``put_file``/``put_bytes`` return only once the object's bytes and its directory entry
    are on stable storage. ``close`` releases cached descriptors; the backend stays usable.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()
        self.url = self.root.as_uri()
        self._fds = _FdCache(_FD_CACHE_SIZE)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def staging_dir(self) -> Path:
        staging = self.root / STAGING_NAME
        try:
            _ensure_dir(staging)
        except OSError as exc:
            raise StorageError(detail=f"cannot create {staging} ({exc})") from exc
        return staging

    def put_file(self, key: str, local_path: Path) -> None:
        dest = self._path(key)
        source = Path(local_path)
        try:
            # Write ordering step 1: the bytes must be on disk before the rename can make
            # the name visible, or a crash could leave a complete-looking name over a hole.
            fsync_file(source)
            _ensure_dir(dest.parent)
            try:
                os.replace(source, dest)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                source = self._restage(source)
                os.replace(source, dest)
            # The rename itself is durable only once its directory is; after this a database
            # row may name the key.
            fsync_dir(dest.parent)
        except OSError as exc:
            raise StorageError(detail=f"cannot store {key!r} in {self.url} ({exc})") from exc
        self._fds.forget(key)

    def _restage(self, source: Path) -> Path:
        """Copy a file from another filesystem into staging (fsynced) and remove the original."""
        fd, name = tempfile.mkstemp(prefix="restage-", dir=self.staging_dir())
        with os.fdopen(fd, "wb") as dst, open(source, "rb") as src:
            shutil.copyfileobj(src, dst, 1 << 20)
            dst.flush()
            # Same reason as in put_file: durable bytes before a visible name.
            os.fsync(dst.fileno())
        source.unlink()
        return Path(name)

    def put_bytes(self, key: str, data: bytes | memoryview) -> None:
        """Stage ``data`` and rename it to ``key``. A staged file that vanished before its rename
        (``gc`` at a grace period shorter than the write, which no lease can cover for the lease's
        own put) is written again, up to ``_PUT_ATTEMPTS`` times."""
        check_key(key)
        for attempt in range(1, _PUT_ATTEMPTS + 1):
            name = self._stage_bytes(key, data)
            try:
                self.put_file(key, name)
                return
            except StorageError:
                if attempt < _PUT_ATTEMPTS and not os.path.lexists(name):
                    continue
                raise
            finally:
                name.unlink(missing_ok=True)

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        """The bytes and a token: the BLAKE3 of the bytes. Read through a descriptor of its own
        (not the cache: another process may have replaced the file since)."""
        path = self._path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(detail=f"cannot read {key!r} from {self.url} ({exc})") from exc
        return data, hash_bytes(data)

    def put_if(self, key: str, data: bytes | memoryview, *, expected: str | None) -> str | None:
        """Compare-and-swap: under the store's CAS lock (``_cas_locked``) read the object, compare
        its token (BLAKE3 of the bytes) with ``expected``, then ``put_bytes`` (staged, fsynced,
        renamed, folder fsynced) and return the token of ``data``."""
        check_key(key)
        with self._cas_locked():
            found = self.read_versioned(key)
            if (None if found is None else found[1]) != expected:
                return None
            self.put_bytes(key, data)
        return hash_bytes(bytes(data))

    @contextlib.contextmanager
    def _cas_locked(self) -> Iterator[None]:
        """Hold the store's compare-and-swap lock: a ``threading.Lock`` per root for this
        process's threads, then an exclusive ``flock`` of ``root/CAS_LOCK`` (a dot-name: never
        listed, never a key) for other processes. Safe between processes and hosts whose
        filesystem implements ``flock`` (local disks; NFSv4); on one without locks the ``flock``
        fails (StorageError) or, where a filesystem fakes it, excludes nothing between hosts."""
        lock_path = self.root / CAS_LOCK
        with _CAS.of(self.root):
            try:
                _ensure_dir(self.root)
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | _O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0), 0o644)
            except OSError as exc:
                raise StorageError(detail=f"cannot open the lock {lock_path} ({exc})") from exc
            _CAS.open_fds.add(fd)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except OSError as exc:
                    raise StorageError(detail=f"cannot lock {lock_path} ({exc}): a compare-and-swap in "
                                              f"{self.url} needs a filesystem with working flock") from exc
                yield
            finally:
                with contextlib.suppress(OSError):
                    fcntl.flock(fd, fcntl.LOCK_UN)
                _CAS.open_fds.discard(fd)
                os.close(fd)

    def _stage_bytes(self, key: str, data: bytes | memoryview) -> Path:
        """A new file of the staging folder holding ``data`` (not fsynced: ``put_file`` does that)."""
        fd, name = tempfile.mkstemp(prefix="put-", suffix=".tmp", dir=self.staging_dir())
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        except OSError as exc:
            Path(name).unlink(missing_ok=True)
            raise StorageError(detail=f"cannot write {key!r} to staging ({exc})") from exc
        return Path(name)

    @contextlib.contextmanager
    def _reading(self, key: str) -> Iterator[int]:
        """A cached descriptor for ``key``, with OS errors turned into StorageError."""
        path = self._path(key)
        try:
            with self._fds.use(key, path) as fd:
                yield fd
        except FileNotFoundError as exc:
            raise missing(key, self.url) from exc
        except OSError as exc:
            raise StorageError(detail=f"cannot read {key!r} from {self.url} ({exc})") from exc

    def get(self, key: str) -> bytes:
        with self._reading(key) as fd:
            return self._pread(key, fd, 0, os.fstat(fd).st_size)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        check_range(offset, length)
        with self._reading(key) as fd:
            return self._pread(key, fd, offset, length)

    def _pread(self, key: str, fd: int, offset: int, length: int) -> bytes:
        data = os.pread(fd, length, offset)
        if len(data) < length:
            buf = bytearray(length)
            buf[: len(data)] = data
            got = len(data) + _pread_into(fd, memoryview(buf)[len(data) :], offset + len(data))
            if got != length:
                raise short_read(key, offset, length, os.fstat(fd).st_size)
            data = bytes(buf)
        return data

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        check_range(offset, 0)
        view = out if out.format == "B" and out.ndim == 1 else out.cast("B")
        with self._reading(key) as fd:
            if _pread_into(fd, view, offset) != len(view):
                raise short_read(key, offset, len(view), os.fstat(fd).st_size)

    def _stat(self, key: str) -> os.stat_result:
        try:
            return os.stat(self._path(key))
        except FileNotFoundError as exc:
            raise missing(key, self.url) from exc
        except OSError as exc:
            raise StorageError(detail=f"cannot stat {key!r} in {self.url} ({exc})") from exc

    def size(self, key: str) -> int:
        return self._stat(key).st_size

    def mtime(self, key: str) -> float:
        return self._stat(key).st_mtime

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> Iterator[str]:
        folder = check_prefix(prefix).rpartition("/")[0]
        keys: list[str] = []
        if folder and self._linked(folder):
            return iter(keys)  # the prefix's folder is a link: what it names is not the store's
        pending = [(self.root / folder if folder else self.root, folder)]
        while pending:
            path, rel = pending.pop()
            try:
                entries = list(os.scandir(path))
            except OSError:
                continue  # gone meanwhile, or unreadable (as os.walk skips it)
            for entry in entries:
                if entry.name.startswith(".") or entry.is_symlink():
                    continue
                key = f"{rel}/{entry.name}" if rel else entry.name
                if entry.is_dir(follow_symlinks=False):
                    if (key + "/").startswith(prefix) or prefix.startswith(key + "/"):
                        pending.append((Path(entry.path), key))
                elif entry.is_file(follow_symlinks=False) and key.startswith(prefix):
                    keys.append(key)
        return iter(sorted(keys))

    def list_sized(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        sized = []
        for key in self.list(prefix):
            with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                sized.append((key, os.lstat(self.root / key).st_size))
        return iter(sized)

    def _linked(self, folder: str) -> bool:
        """Whether a folder on the way from ``root`` to ``folder`` (itself included) is a link."""
        path = self.root
        for part in folder.split("/"):
            path = path / part
            try:
                if stat.S_ISLNK(os.lstat(path).st_mode):
                    return True
            except OSError:
                return False  # missing: nothing below it to list
        return False

    def delete(self, key: str) -> None:
        folder, _, name = check_key(key).rpartition("/")
        self._fds.forget(key)
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StorageError(detail=f"cannot delete {key!r} from {self.url} ({exc})") from exc
        try:
            for part in folder.split("/") if folder else ():
                try:
                    inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _O_CLOEXEC, dir_fd=fd)
                except FileNotFoundError:
                    return
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise StorageError(detail=f"cannot delete {key!r} from {self.url}: its folder {part!r} "
                                                  "is a symbolic link (or no folder), which the store never "
                                                  "acts through") from exc
                    raise
                os.close(fd)
                fd = inner
            # No directory fsync: a deletion lost in a crash only brings back an unreferenced
            # object, which the next gc removes again.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=fd)
        except StorageError:
            raise
        except OSError as exc:
            raise StorageError(detail=f"cannot delete {key!r} from {self.url} ({exc})") from exc
        finally:
            os.close(fd)

    def close(self) -> None:
        self._fds.clear()


def walk_files(staging: Path, links: list[str]) -> Iterator[tuple[int, str, str, os.stat_result]]:
    """``(folder descriptor, name, path relative to staging, lstat)`` of every regular file under
    ``staging`` (the store's staging folder, for gc and verify), walked without following a
    symbolic link, ``staging`` itself included: each link met is appended to ``links``. The
    descriptor is valid until the next item; remove a file with ``os.unlink(name, dir_fd=fd)``."""
    try:
        top = staging.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(top.st_mode):
        links.append(str(staging))
        return
    if not stat.S_ISDIR(top.st_mode):
        return
    # fwalk pins each folder by descriptor (lstat, open, fstat), so none is entered through a link.
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(staging, follow_symlinks=False):
        rel = os.path.relpath(dirpath, staging)
        files = set(filenames)
        for name in sorted(dirnames + filenames):
            path = name if rel == "." else f"{rel}/{name}"
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # renamed into place or removed by its writer meanwhile
            if stat.S_ISLNK(st.st_mode):
                links.append(str(staging / path))
            elif stat.S_ISREG(st.st_mode) and name in files:
                yield dir_fd, name, path, st
