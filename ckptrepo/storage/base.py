"""The one interface every pack store implements, and the key rules they share.

A store holds immutable objects under '/'-separated relative keys such as
``packs/ab/ab12...ef.pack``. Writes are atomic and durable when they return (write
ordering step 1 in docs/design.md): a key is either absent or complete, never partial, and
once ``put_*`` returns a crash cannot take it back. Reads of a missing key raise
StorageError naming the key; malformed keys raise UsageError.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

from ckptrepo.errors import StorageError, UsageError


@runtime_checkable
class Backend(Protocol):
    """A pack store. Implementations are thread-safe: any method may be called from any thread."""

    url: str

    def put_file(self, key: str, local_path: Path) -> None:
        """Durably store the file at ``local_path`` under ``key``, atomically.

        ``key`` is absent or complete, never partial. The file is consumed (moved or
        deleted). ``local_path`` should be inside ``self.staging_dir()``.
        """
        ...

    def put_bytes(self, key: str, data: bytes | memoryview) -> None:
        """Durably and atomically store ``data`` under ``key`` (same guarantees as ``put_file``)."""
        ...

    def get(self, key: str) -> bytes:
        """The whole object."""
        ...

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes from ``offset``; StorageError if the object is shorter."""
        ...

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        """Fill ``out`` exactly with the object's bytes from ``offset``; StorageError if it is shorter."""
        ...

    def size(self, key: str) -> int:
        """The object's length in bytes."""
        ...

    def mtime(self, key: str) -> float:
        """When the object was stored, in seconds since the epoch (gc grace periods use it)."""
        ...

    def exists(self, key: str) -> bool:
        """Whether ``key`` names a complete object."""
        ...

    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys starting with ``prefix`` (a plain string prefix, not only a folder), sorted."""
        ...

    def list_sized(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """``(key, size in bytes)`` of the keys ``list`` gives (one listing: no request per key
        on an object store)."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object; a missing key is not an error."""
        ...

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        """The object's bytes and an opaque version token, or None when there is no such object.

        The token is that of the bytes returned (one read, never another write's token). It
        changes with every write of other content; tokens of equal content may be equal (local and
        memory stores: the BLAKE3 of the bytes; S3: the ETag), so a caller that compares and swaps
        writes a time or a nonce into what it stores. Tokens compare only within one store.
        """
        ...

    def put_if(self, key: str, data: bytes | memoryview, *, expected: str | None) -> str | None:
        """Store ``data`` under ``key`` only if the object is still at version ``expected``.

        ``expected`` is a token ``read_versioned`` or ``put_if`` gave for ``key``; None means "only
        if there is no object". Returns the new version token (what ``read_versioned`` gives until
        the next write), or None when the precondition failed and nothing was written: None given
        while the object exists, a token while it does not, a token of other content. The write is
        atomic and durable as ``put_bytes``. Of writers racing with one ``expected``, at most one
        succeeds and the others get None (exactly one on local and memory stores; S3 may refuse a
        whole burst with 409 Conflict): callers re-read and retry. Only ``put_if`` calls are ordered
        against each other, not a ``put_bytes`` or ``delete`` of the same key: keys moved by
        compare-and-swap are written only by ``put_if``. On S3 None can also follow a write that
        landed but whose response was lost (the client's retry is refused): a caller's nonce in
        what ``read_versioned`` then gives tells. Malformed keys raise UsageError, failures of
        the store StorageError.
        """
        ...

    def staging_dir(self) -> Path:
        """A local directory (created if needed) for files being written before ``put_file``."""
        ...

    def close(self) -> None:
        """Release cached resources (open files, connections)."""
        ...


def check_key(key: str) -> str:
    """Return ``key`` if it is a valid object key, else raise UsageError.

    Keys are '/'-separated, relative, without empty segments, without segments starting
    with '.' (that covers '.' and '..', and reserves dot-names for a backend's own
    temporary files), and without backslashes or NUL characters.
    """
    if not isinstance(key, str) or not key:
        raise UsageError(f"invalid storage key {key!r}: keys are non-empty strings")
    if key.startswith("/"):
        raise UsageError(f"invalid storage key {key!r}: keys are relative (no leading '/')")
    if "\\" in key or "\x00" in key:
        raise UsageError(f"invalid storage key {key!r}: backslashes and NUL are not allowed")
    for part in key.split("/"):
        if not part:
            raise UsageError(f"invalid storage key {key!r}: empty path segment")
        if part.startswith("."):
            raise UsageError(f"invalid storage key {key!r}: segments must not start with '.'")
    return key


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if it can start a valid key, else raise UsageError.

    Its folder part (up to the last '/') must be a valid key; its last part a valid start
    of a segment.
    """
    folder, _, last = prefix.rpartition("/")
    if folder:
        check_key(folder)
    if prefix.startswith("/") or "\\" in last or "\x00" in last:
        raise UsageError(f"invalid storage key prefix {prefix!r}")
    return prefix


def check_range(offset: int, length: int) -> None:
    """Raise UsageError for a negative offset or length."""
    if offset < 0 or length < 0:
        raise UsageError(f"invalid byte range: offset {offset}, length {length}")


def missing(key: str, url: str) -> StorageError:
    """The error for reading a key that is not stored."""
    return StorageError(detail=f"no object {key!r} in {url}")


def short_read(key: str, offset: int, length: int, size: int) -> StorageError:
    """The error for a range that runs past the end of an object."""
    return StorageError(detail=f"object {key!r} has {size} bytes, cannot read {length} bytes at offset {offset}")
