"""The store of a repository with remotes: what it lacks is read from them (a lazy clone, and
any repository that fetched: fetched chunks stay on the remote until read).

``TieredBackend`` is the repository's own store for everything it writes, lists and deletes;
only *reads* of a pack the local store does not hold go to a remote: the first remote (in the
order given: a clone's own remote first) that holds the pack, each opened at its first such
read. So gc, verify's leftovers, repack and every write stay local, and a remote is never
changed through it. A pack found locally once is read locally from then on; one the local store
no longer holds (gc, after ``localize`` moved its chunks) is looked up again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from ckptrepo.errors import StorageError
from ckptrepo.locations import ChunkLocation
from ckptrepo.storage.base import Backend

_PACKS = "packs/"
SHARED = ".store"  # the name reads of the repository's own store go by, under a node-local store


class TieredBackend:
    """``local`` for everything but reads of packs it lacks, which the first remote of the
    repository in ``repo_dir`` that holds them serves (``remote.config``: the lazy one, a clone's
    own, first; the list is read again when ``remotes.json`` changes; each remote opened at its
    first use). ``remotes``: a fixed list of ``(name, opener)`` instead (tests)."""

    def __init__(self, local: Backend, repo_dir: Path | None = None,
                 remotes: list[tuple[str, Callable[[], Backend]]] | None = None,
                 shared: Backend | None = None) -> None:
        self.local = local
        self.url = local.url
        self._repo_dir = repo_dir
        self._fixed = remotes
        self.shared = shared  # the repository's own store, under a node-local one (CKPT_NODE_STORE)
        self._stamp: float | None = None
        self.names: list[str] = []
        self._openers: dict[str, Callable[[], Backend]] = {}
        self._open: dict[str, Backend] = {}
        self._lock = threading.Lock()
        self._here: set[str] = set()
        self._where: dict[str, str] = {}  # pack key -> the remote that held it

    def _load(self) -> None:
        """(Re)read the list of remotes when it changed (under the lock)."""
        if self._fixed is not None:
            if not self.names:
                self.names, self._openers = [n for n, _ in self._fixed], dict(self._fixed)
            return
        if self._repo_dir is None:
            return
        from ckptrepo.remote import config
        from ckptrepo.remote.stores import open_remote

        path = self._repo_dir / config.FILE_NAME
        try:
            stamp = path.stat().st_mtime_ns
        except OSError:
            stamp = 0
        if stamp == self._stamp:
            return
        self._stamp = stamp
        remotes = sorted(config.load(self._repo_dir).values(), key=lambda r: (not r.lazy, r.name))

        def opener(url: str) -> Callable[[], Backend]:
            return lambda: open_remote(url).backend

        self.names = [r.name for r in remotes]
        self._openers = {r.name: opener(r.url) for r in remotes}
        if self.shared is not None:
            shared = self.shared
            self.names.insert(0, SHARED)
            self._openers[SHARED] = lambda: shared
        self._where.clear()
        for name in list(self._open):
            if name not in self._openers:
                self._open.pop(name).close()

    def remote_names(self) -> list[str]:
        """The remotes reads may go to, in order."""
        with self._lock:
            self._load()
            return list(self.names)

    def remote_store(self, name: str) -> Backend:
        """Remote ``name``'s store, opened at first use."""
        with self._lock:
            self._load()
            store = self._open.get(name)
            if store is None:
                store = self._open[name] = self._openers[name]()
            return store

    def _remote_for(self, key: str) -> Backend:
        with self._lock:
            self._load()
            names = list(self.names)
        name = self._where.get(key)
        if name is None or name not in names:
            for candidate in names:
                if self.remote_store(candidate).exists(key):
                    name = self._where[key] = candidate
                    break
            else:
                raise StorageError(detail=f"no object {key!r} in {self.url}"
                                   + (f" nor in remote(s) {', '.join(names)}" if names else ""))
        return self.remote_store(name)

    def is_local(self, key: str) -> bool:
        """Whether the local store holds ``key`` (packs, immutable, found once are remembered)."""
        if key in self._here:
            return True
        if self.local.exists(key):
            if key.startswith(_PACKS):
                self._here.add(key)
            return True
        return False

    def _source(self, key: str) -> Backend:
        if not key.startswith(_PACKS) or self.is_local(key):
            return self.local
        return self._remote_for(key)


    def _read(self, key: str, read: Callable[[Backend], object]) -> object:
        source = self._source(key)
        try:
            return read(source)
        except StorageError:
            if source is self.local and key.startswith(_PACKS):  # gone locally since: read through
                self._here.discard(key)
                return read(self._source(key))
            raise

    # -- reads ------------------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        return self._read(key, lambda b: b.get(key))  # type: ignore[return-value]

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        return self._read(key, lambda b: b.get_range(key, offset, length))  # type: ignore[return-value]

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        self._read(key, lambda b: b.read_into(key, offset, out))

    def size(self, key: str) -> int:
        return self._read(key, lambda b: b.size(key))  # type: ignore[return-value]

    def mtime(self, key: str) -> float:
        return self._read(key, lambda b: b.mtime(key))  # type: ignore[return-value]

    def exists(self, key: str) -> bool:
        if not key.startswith(_PACKS):
            return self.local.exists(key)
        if self.is_local(key):
            return True
        try:
            self._remote_for(key)
            return True
        except StorageError:
            return False

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        return self.local.read_versioned(key)

    # -- local only -------------------------------------------------------------------------

    def put_file(self, key: str, local_path: Path) -> None:
        self.local.put_file(key, local_path)

    def put_bytes(self, key: str, data: bytes | memoryview) -> None:
        self.local.put_bytes(key, data)

    def put_if(self, key: str, data: bytes | memoryview, *, expected: str | None) -> str | None:
        return self.local.put_if(key, data, expected=expected)

    def list(self, prefix: str = "") -> Iterator[str]:
        return self.local.list(prefix)

    def list_sized(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        return self.local.list_sized(prefix)

    def delete(self, key: str) -> None:
        self._here.discard(key)
        self.local.delete(key)

    def staging_dir(self) -> Path:
        return self.local.staging_dir()

    def close(self) -> None:
        self.local.close()
        with self._lock:
            for name, store in self._open.items():
                if name != SHARED:
                    store.close()
        if self.shared is not None:
            self.shared.close()

    @property
    def node_local(self) -> bool:
        """Whether ``local`` is a node-local store (``CKPT_NODE_STORE``) over the repository's."""
        return self.shared is not None


def over_remotes(local: Backend, repo_dir: Path, node: Path | None = None) -> TieredBackend:
    """The store of the repository in ``repo_dir``: ``local`` (its store), read through to its
    remotes; with ``node`` (``CKPT_NODE_STORE``), that folder, read through to ``local`` first."""
    if node is None:
        return TieredBackend(local, repo_dir)
    from ckptrepo.storage import LocalBackend

    # This process's fast tier; every node's packs reach the others through a remote (``Sync._replicate``).
    return TieredBackend(LocalBackend(node), repo_dir, shared=local)


class RemoteCopy:
    """A chunk's copy on a remote (``chunks.store.OtherCopy``): read with the remote's own
    locations (``lookup``: ``remote_chunks``), its delta bases from there too, and verified."""

    def __init__(self, store: Backend, lookup: Callable[[Collection[str]], dict[str, ChunkLocation]]) -> None:
        self._store, self._lookup = store, lookup

    def read_into(self, chunk_id: str, out: memoryview) -> None:
        from ckptrepo.chunks.store import ChunkReader

        loc = self._lookup([chunk_id]).get(chunk_id)
        if loc is None:
            raise StorageError(detail=f"chunk {chunk_id} is on no remote")
        ChunkReader(self._store, self._lookup).read_into(loc, out)
