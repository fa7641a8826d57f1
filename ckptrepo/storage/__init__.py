"""Pack stores behind one interface (``Backend``), chosen by URL with ``open_backend``."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote, urlsplit

from ckptrepo.errors import UsageError
from ckptrepo.storage.base import Backend, check_key
from ckptrepo.storage.local import STAGING_NAME, LocalBackend
from ckptrepo.storage.memory import MemoryBackend

if TYPE_CHECKING:
    from ckptrepo.storage.s3 import S3Backend


def __getattr__(name: str) -> Any:
    # The S3 backend (boto3 and botocore: ~10 MiB of memory, ~0.3 s to import) loads only
    # when an s3:// store is opened or S3Backend is asked for.
    if name == "S3Backend":
        from ckptrepo.storage.s3 import S3Backend

        return S3Backend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Backend", "LocalBackend", "MemoryBackend", "S3Backend", "check_key", "local_staging", "open_backend"]

_memory_lock = threading.Lock()
_memory_stores: dict[str, MemoryBackend] = {}


def _open_file(url: str, default_root: Path) -> Backend:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise UsageError(f"store URL {url!r} names host {parts.netloc!r}; file:// URLs are local")
    path = unquote(parts.path)
    if not path:
        raise UsageError(f"store URL {url!r} has no path", hint="Write file:///absolute/path.")
    return LocalBackend(Path(path))


def _open_memory(url: str, default_root: Path) -> Backend:
    name = url[len("memory://") :]
    with _memory_lock:
        store = _memory_stores.get(name)
        if store is None:
            store = _memory_stores[name] = MemoryBackend(name)
        return store


def _open_s3(url: str, default_root: Path) -> Backend:
    from ckptrepo.storage.s3 import S3Backend

    store = S3Backend.from_url(url, staging=default_root / STAGING_NAME)
    try:
        store.check()
    except BaseException:
        store.close()
        raise
    return store


# Scheme -> opener(url, default_root).
_OPENERS: dict[str, Callable[[str, Path], Backend]] = {
    "file": _open_file,
    "memory": _open_memory,
    "s3": _open_s3,
}


def local_staging(backend: Backend) -> Path | None:
    """Where ``backend`` keeps files being written, without creating the folder.

    None for a store whose staging folder is private to the process (memory, or an
    S3Backend made without one). gc and verify look there for leftovers of interrupted writes.
    """
    if isinstance(backend, LocalBackend):
        return backend.root / STAGING_NAME
    inner = getattr(backend, "local", None)  # a store over a local one (``remote.tiered``): that one's
    if inner is not None and inner is not backend:
        return local_staging(inner)
    s3 = sys.modules.get("ckptrepo.storage.s3")  # not loaded: no S3Backend exists
    if s3 is not None and isinstance(backend, s3.S3Backend):
        return cast(Path | None, backend.shared_staging)
    return None


def open_backend(url: str | None, default_root: Path) -> Backend:
    """The store for ``url``.

    None means the local store at ``default_root``; a plain path (relative paths are taken
    from the current directory) or ``file://`` URL a LocalBackend there; ``memory://NAME``
    the process-wide in-memory store of that name (every open of the same name returns the
    same instance); ``s3://BUCKET[/PREFIX][?endpoint_url=...&region=...]`` an S3Backend
    staging at ``default_root/.staging`` (the local store's staging folder), after one
    request that checks bucket, credentials and endpoint (StorageError with a hint
    otherwise). Any other scheme raises UsageError naming the supported ones.
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
            hint="Give a path, file:///absolute/path, s3://bucket/prefix or memory://name.",
        )
    return opener(url, default_root)
