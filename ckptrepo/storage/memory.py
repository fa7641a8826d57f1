"""In-process pack store for tests: a dict behind a lock.

"Durable" here means "stored in this process": the data dies with it. Puts are atomic
(a key maps to its complete bytes or is absent) and every method is thread-safe.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

from ckptrepo.errors import StorageError
from ckptrepo.ids import hash_bytes
from ckptrepo.storage.base import check_key, check_prefix, check_range, missing, short_read


class MemoryBackend:
    """Objects as ``bytes`` in a dict; ``staging_dir`` is a private temporary directory.

    ``close`` is a no-op: several openers may share one instance (``open_backend``), and
    the staging directory is removed when the instance is garbage-collected.
    """

    def __init__(self, name: str = "") -> None:
        self.url = f"memory://{name}"
        self._lock = threading.Lock()
        self._objects: dict[str, tuple[bytes, float]] = {}
        self._staging: Path | None = None

    def staging_dir(self) -> Path:
        with self._lock:
            if self._staging is None:
                self._staging = Path(tempfile.mkdtemp(prefix="ckpt-memory-staging-"))
                weakref.finalize(self, shutil.rmtree, self._staging, True)
            return self._staging

    def put_file(self, key: str, local_path: Path) -> None:
        check_key(key)
        path = Path(local_path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise StorageError(detail=f"cannot store {key!r}: {exc}") from exc
        self.put_bytes(key, data)
        path.unlink(missing_ok=True)

    def put_bytes(self, key: str, data: bytes | memoryview) -> None:
        check_key(key)
        stored = bytes(data)
        with self._lock:
            self._objects[key] = (stored, time.time())

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        """The bytes and a token: the BLAKE3 of the bytes."""
        check_key(key)
        with self._lock:
            entry = self._objects.get(key)
        return None if entry is None else (entry[0], hash_bytes(entry[0]))

    def put_if(self, key: str, data: bytes | memoryview, *, expected: str | None) -> str | None:
        check_key(key)
        stored = bytes(data)
        with self._lock:
            entry = self._objects.get(key)
            current = None if entry is None else hash_bytes(entry[0])
            if current != expected:
                return None
            self._objects[key] = (stored, time.time())
        return hash_bytes(stored)

    def _data(self, key: str) -> bytes:
        check_key(key)
        with self._lock:
            entry = self._objects.get(key)
        if entry is None:
            raise missing(key, self.url)
        return entry[0]

    def get(self, key: str) -> bytes:
        return self._data(key)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        check_range(offset, length)
        data = self._data(key)
        if offset + length > len(data):
            raise short_read(key, offset, length, len(data))
        return data[offset : offset + length]

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        check_range(offset, 0)
        view = out if out.format == "B" and out.ndim == 1 else out.cast("B")
        data = self._data(key)
        if offset + len(view) > len(data):
            raise short_read(key, offset, len(view), len(data))
        view[:] = memoryview(data)[offset : offset + len(view)]

    def size(self, key: str) -> int:
        return len(self._data(key))

    def mtime(self, key: str) -> float:
        check_key(key)
        with self._lock:
            entry = self._objects.get(key)
        if entry is None:
            raise missing(key, self.url)
        return entry[1]

    def exists(self, key: str) -> bool:
        check_key(key)
        with self._lock:
            return key in self._objects

    def list(self, prefix: str = "") -> Iterator[str]:
        check_prefix(prefix)
        with self._lock:
            keys = sorted(k for k in self._objects if k.startswith(prefix))
        return iter(keys)

    def list_sized(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        check_prefix(prefix)
        with self._lock:
            return iter(sorted((k, len(v[0])) for k, v in self._objects.items() if k.startswith(prefix)))

    def delete(self, key: str) -> None:
        check_key(key)
        with self._lock:
            self._objects.pop(key, None)

    def close(self) -> None:
        return None
