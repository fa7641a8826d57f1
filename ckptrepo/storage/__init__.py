"""Pack stores behind one interface (``Backend``), chosen by URL with ``open_backend``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlsplit

from ckptrepo.errors import UsageError
from ckptrepo.storage.base import Backend, check_key
from ckptrepo.storage.local import LocalBackend
from ckptrepo.storage.memory import MemoryBackend

__all__ = ["Backend", "LocalBackend", "MemoryBackend", "check_key", "open_backend"]

_memory_lock = threading.Lock()
_memory_stores: dict[str, MemoryBackend] = {}


def _open_file(url: str) -> Backend:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise UsageError(f"store URL {url!r} names host {parts.netloc!r}; file:// URLs are local")
    path = unquote(parts.path)
    if not path:
        raise UsageError(f"store URL {url!r} has no path", hint="Write file:///absolute/path.")
    return LocalBackend(Path(path))


def _open_memory(url: str) -> Backend:
    name = url[len("memory://") :]
    with _memory_lock:
        store = _memory_stores.get(name)
        if store is None:
            store = _memory_stores[name] = MemoryBackend(name)
        return store


# Scheme -> opener. The S3-compatible object store registers "s3" here.
_OPENERS: dict[str, Callable[[str], Backend]] = {
    "file": _open_file,
    "memory": _open_memory,
}


def open_backend(url: str | None, default_root: Path) -> Backend:
    """The store for ``url``.

    None means the local store at ``default_root``; a plain path (relative paths are taken
    from the current directory) or ``file://`` URL a LocalBackend there; ``memory://NAME``
    the process-wide in-memory store of that name (every open of the same name returns the
    same instance). Any other scheme raises UsageError naming the supported ones.
    """
    if url is None:
        return LocalBackend(default_root)
    scheme, sep, _ = url.partition("://")
    if not sep:
        if not url:
            raise UsageError("empty store URL", hint="Give a path, file:///path or memory://name.")
        return LocalBackend(Path(url))
    opener = _OPENERS.get(scheme.lower())
    if opener is None:
        supported = ", ".join(f"{name}://" for name in sorted(_OPENERS))
        raise UsageError(
            f"unsupported store URL {url!r}: supported are {supported} and plain paths",
            hint="Give a path, file:///absolute/path or memory://name.",
        )
    return opener(url)
