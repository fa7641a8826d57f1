"""One conformance suite for every storage backend, plus each backend's own guarantees."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest

from ckptrepo.errors import StorageError, UsageError
from ckptrepo.storage import Backend, LocalBackend, MemoryBackend, S3Backend, local_staging, open_backend
from ckptrepo.storage import s3 as s3_module

BAD_KEYS = ["", "/abs/key", "a//b", "a/", "../up", "a/../b", "a/./b", ".staging/x", "a\\b", "nul\x00"]


@pytest.fixture(params=["local", "memory", "file-url", "memory-url", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    kind = request.param
    if kind == "s3":
        store: Backend = open_backend(request.getfixturevalue("s3_url"), tmp_path / "repo-store")
    elif kind == "local":
        store = LocalBackend(tmp_path / "store")
    elif kind == "memory":
        store = MemoryBackend()
    elif kind == "file-url":
        store = open_backend((tmp_path / "viaurl").as_uri(), tmp_path / "unused")
    else:
        store = open_backend(f"memory://conformance-{id(request)}-{tmp_path.name}", tmp_path)
    yield store
    store.close()


def staged(store: Backend, data: bytes, name: str = "upload.tmp") -> Path:
    path = store.staging_dir() / name
    path.write_bytes(data)
    return path


# --- conformance: every backend -------------------------------------------------------


def test_is_a_backend(backend: Backend) -> None:
    assert isinstance(backend, Backend)
    assert "://" in backend.url


def test_put_bytes_then_read_everything_back(backend: Backend) -> None:
    data = bytes(range(256)) * 40
    backend.put_bytes("packs/ab/ab01.pack", data)
    assert backend.exists("packs/ab/ab01.pack")
    assert backend.get("packs/ab/ab01.pack") == data
    assert backend.size("packs/ab/ab01.pack") == len(data)
    assert backend.get_range("packs/ab/ab01.pack", 300, 17) == data[300:317]
    assert backend.get_range("packs/ab/ab01.pack", len(data), 0) == b""
    assert abs(backend.mtime("packs/ab/ab01.pack") - time.time()) < 60


def test_put_bytes_accepts_memoryview_and_overwrites(backend: Backend) -> None:
    backend.put_bytes("k", b"first version")
    backend.put_bytes("k", memoryview(b"second"))
    assert backend.get("k") == b"second"
    assert backend.size("k") == 6


def test_empty_object(backend: Backend) -> None:
    backend.put_bytes("empty", b"")
    assert backend.get("empty") == b""
    assert backend.size("empty") == 0
    backend.read_into("empty", 0, memoryview(bytearray()))


def test_read_into_fills_exactly(backend: Backend) -> None:
    data = os.urandom(10_000)
    backend.put_bytes("blob", data)
    out = bytearray(b"\xff" * 1000)
    backend.read_into("blob", 1234, memoryview(out))
    assert bytes(out) == data[1234:2234]


def test_read_into_typed_buffer(backend: Backend) -> None:
    values = np.arange(64, dtype=np.float32)
    backend.put_bytes("floats", values.tobytes())
    out = np.zeros(16, dtype=np.float32)
    backend.read_into("floats", 16 * 4, out.data)
    np.testing.assert_array_equal(out, values[16:32])


def test_reads_past_the_end_fail(backend: Backend) -> None:
    backend.put_bytes("short", b"0123456789")
    with pytest.raises(StorageError, match="short"):
        backend.get_range("short", 5, 6)
    with pytest.raises(StorageError, match="short"):
        backend.read_into("short", 8, memoryview(bytearray(3)))
    with pytest.raises(UsageError):
        backend.get_range("short", -1, 2)
    with pytest.raises(UsageError):
        backend.get_range("short", 0, -2)


def test_list_is_sorted_and_filters_by_string_prefix(backend: Backend) -> None:
    keys = [
        "packs/b1/b1x.pack",
        "packs/a2/a2x.pack",
        "packs/a1/a1y.pack",
        "packs/a1/a1x.pack",
        "other",
        "packsx",
    ]
    for key in keys:
        backend.put_bytes(key, key.encode())
    staged(backend, b"not an object")
    assert list(backend.list()) == sorted(keys)
    assert list(backend.list("packs/")) == sorted(k for k in keys if k.startswith("packs/"))
    assert list(backend.list("packs/a")) == ["packs/a1/a1x.pack", "packs/a1/a1y.pack", "packs/a2/a2x.pack"]
    assert list(backend.list("packs/a1/a1y")) == ["packs/a1/a1y.pack"]
    assert list(backend.list("nothing/")) == []


def test_delete(backend: Backend) -> None:
    backend.put_bytes("a/b", b"x")
    backend.delete("a/b")
    assert not backend.exists("a/b")
    assert list(backend.list()) == []
    backend.delete("a/b")
    backend.delete("never/was")


def test_delete_after_read_really_deletes(backend: Backend) -> None:
    backend.put_bytes("cached", b"0123456789")
    assert backend.get_range("cached", 2, 3) == b"234"
    backend.delete("cached")
    with pytest.raises(StorageError, match="cached"):
        backend.get_range("cached", 2, 3)


def test_overwrite_after_read_serves_new_bytes(backend: Backend) -> None:
    backend.put_bytes("k", b"old bytes!")
    assert backend.get_range("k", 0, 3) == b"old"
    backend.put_bytes("k", b"new bytes!")
    assert backend.get_range("k", 0, 3) == b"new"


@pytest.mark.parametrize(
    "call",
    [
        lambda b: b.get("no/such/key"),
        lambda b: b.get_range("no/such/key", 0, 1),
        lambda b: b.read_into("no/such/key", 0, memoryview(bytearray(1))),
        lambda b: b.size("no/such/key"),
        lambda b: b.mtime("no/such/key"),
    ],
)
def test_missing_key_is_a_storage_error_naming_it(backend: Backend, call: object) -> None:
    with pytest.raises(StorageError, match="no/such/key") as info:
        call(backend)  # type: ignore[operator]
    assert not isinstance(info.value, FileNotFoundError)
    assert not backend.exists("no/such/key")


@pytest.mark.parametrize("key", BAD_KEYS)
def test_bad_keys_are_rejected(backend: Backend, key: str) -> None:
    with pytest.raises(UsageError):
        backend.put_bytes(key, b"x")
    with pytest.raises(UsageError):
        backend.get(key)
    with pytest.raises(UsageError):
        backend.exists(key)
    with pytest.raises(UsageError):
        backend.delete(key)
    with pytest.raises(UsageError):
        backend.put_file(key, staged(backend, b"x"))
    assert list(backend.list()) == []


def test_put_file_is_atomic_and_consumes_the_file(backend: Backend) -> None:
    data = os.urandom(1 << 16)
    path = staged(backend, data)
    assert not backend.exists("packs/cd/cd.pack")
    assert list(backend.list()) == []
    backend.put_file("packs/cd/cd.pack", path)
    assert not path.exists()
    assert backend.get("packs/cd/cd.pack") == data
    assert list(backend.list()) == ["packs/cd/cd.pack"]
    assert list(backend.staging_dir().iterdir()) == []


def test_failed_put_file_leaves_no_key(backend: Backend) -> None:
    with pytest.raises(StorageError):
        backend.put_file("k", backend.staging_dir() / "does-not-exist")
    assert not backend.exists("k")
    assert list(backend.list()) == []


def test_concurrent_readers(backend: Backend) -> None:
    blobs = {f"packs/{i:02x}/{i:04x}.pack": os.urandom(4096 + i) for i in range(100)}
    for key, data in blobs.items():
        backend.put_bytes(key, data)
    errors: list[str] = []

    reads = 75 if isinstance(backend, S3Backend) else 300  # a GET to the S3 server costs ~10 ms

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(reads):
            key = rng.choice(list(blobs))
            data = blobs[key]
            offset = rng.randrange(len(data))
            out = bytearray(rng.randrange(len(data) - offset + 1))
            backend.read_into(key, offset, memoryview(out))
            if bytes(out) != data[offset : offset + len(out)]:
                errors.append(key)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(reader, range(8)))
    assert errors == []


# --- LocalBackend specifics -----------------------------------------------------------


def test_local_layout_and_staging_location(tmp_path: Path) -> None:
    store = LocalBackend(tmp_path / "store")
    store.put_bytes("packs/ab/abc.pack", b"payload")
    assert (tmp_path / "store" / "packs" / "ab" / "abc.pack").read_bytes() == b"payload"
    assert store.staging_dir() == tmp_path / "store" / ".staging"
    assert store.url == (tmp_path / "store").as_uri()


def test_local_put_file_write_ordering(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalBackend(tmp_path / "store")
    path = staged(store, b"pack bytes")
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: object, dst: object) -> None:
        events.append(("replace", str(dst)))
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    store.put_file("packs/ef/ef.pack", path)
    dest = tmp_path / "store" / "packs" / "ef" / "ef.pack"
    kinds = [kind for kind, _ in events]
    assert events[0] == ("fsync", str(path))
    replace_at = kinds.index("replace")
    assert events[replace_at] == ("replace", str(dest))
    # Each new folder's entry is made durable (in its parent) before the rename, the
    # rename itself (in the destination folder) after it.
    assert ("fsync", str(tmp_path / "store")) in events[:replace_at]
    assert ("fsync", str(tmp_path / "store" / "packs")) in events[:replace_at]
    assert events[-1] == ("fsync", str(dest.parent))


def test_local_put_file_from_outside_staging(tmp_path: Path) -> None:
    store = LocalBackend(tmp_path / "store")
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(b"abc")
    store.put_file("k", outside)
    assert not outside.exists()
    assert store.get("k") == b"abc"


def test_local_many_files_exceed_descriptor_cache(tmp_path: Path) -> None:
    store = LocalBackend(tmp_path / "store")
    for i in range(200):
        store.put_bytes(f"k{i}", str(i).encode())
    for _ in range(2):
        assert [store.get(f"k{i}") for i in range(200)] == [str(i).encode() for i in range(200)]
    store.close()
    assert store.get("k7") == b"7"


def test_local_reader_survives_concurrent_eviction(tmp_path: Path) -> None:
    store = LocalBackend(tmp_path / "store")
    for i in range(150):
        store.put_bytes(f"k{i}", bytes([i]) * 10_000)
    stop = threading.Event()
    failures: list[int] = []

    def churn() -> None:
        while not stop.is_set():
            store.close()

    def read(i: int) -> None:
        out = bytearray(10_000)
        for _ in range(50):
            store.read_into(f"k{i}", 0, memoryview(out))
            if out != bytes([i]) * 10_000:
                failures.append(i)

    churner = threading.Thread(target=churn)
    churner.start()
    try:
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(read, range(150)))
    finally:
        stop.set()
        churner.join()
    assert failures == []


# --- S3Backend specifics --------------------------------------------------------------


def _raw_s3(store: S3Backend) -> Any:
    return boto3.client("s3", endpoint_url=store.endpoint_url)


def test_s3_keys_live_under_the_prefix_and_staging_is_local(tmp_path: Path, s3_url: str) -> None:
    store = open_backend(s3_url, tmp_path / "repo" / "store")
    assert isinstance(store, S3Backend)
    assert store.url == s3_url
    assert store.staging_dir() == tmp_path / "repo" / "store" / ".staging"
    assert local_staging(store) == store.staging_dir()
    store.put_bytes("packs/ab/abc.pack", b"payload")
    raw = _raw_s3(store).list_objects_v2(Bucket=store.bucket)
    assert [item["Key"] for item in raw["Contents"]] == ["repo/store/packs/ab/abc.pack"]
    unprefixed = S3Backend(store.bucket, endpoint_url=store.endpoint_url)
    assert list(unprefixed.list()) == ["repo/store/packs/ab/abc.pack"]
    assert unprefixed.url == f"s3://{store.bucket}?endpoint_url={store.endpoint_url}"
    assert local_staging(unprefixed) is None
    private = unprefixed.staging_dir()
    assert private.is_dir() and not private.is_relative_to(tmp_path)


def test_s3_list_skips_foreign_object_names(tmp_path: Path, s3_url: str) -> None:
    store = open_backend(s3_url, tmp_path)
    assert isinstance(store, S3Backend)
    store.put_bytes("packs/ok.pack", b"x")
    for foreign in ("repo/store/packs/.hidden", "repo/store/a//b", "repo/storex/packs/p"):
        _raw_s3(store).put_object(Bucket=store.bucket, Key=foreign, Body=b"y")
    assert list(store.list()) == ["packs/ok.pack"]


def test_s3_large_file_goes_up_in_parts(
    tmp_path: Path, s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(s3_module, "_TRANSFER", s3_module.TransferConfig(
        multipart_threshold=5 << 20, multipart_chunksize=5 << 20, max_concurrency=2))
    store = open_backend(s3_url, tmp_path)
    data = os.urandom((12 << 20) + 123)
    store.put_file("packs/big.pack", staged(store, data))
    assert store.size("packs/big.pack") == len(data)
    assert store.get_range("packs/big.pack", (5 << 20) - 7, 20) == data[(5 << 20) - 7 : (5 << 20) + 13]
    assert store.get("packs/big.pack") == data
    assert list(store.staging_dir().iterdir()) == []


def test_s3_short_read_names_key_and_store(tmp_path: Path, s3_url: str) -> None:
    store = open_backend(s3_url, tmp_path)
    store.put_bytes("packs/short.pack", b"0123456789")
    with pytest.raises(StorageError, match=r"packs/short\.pack.*10 bytes"):
        store.get_range("packs/short.pack", 10, 1)
    with pytest.raises(StorageError, match=r"packs/short\.pack.*10 bytes"):
        store.read_into("packs/short.pack", 11, memoryview(bytearray(0)))
    with pytest.raises(StorageError, match=r"'no/such' in s3://") as info:
        store.get_range("no/such", 0, 1)
    assert "repo/store" in str(info.value)


# --- open_backend ---------------------------------------------------------------------


def test_open_backend_defaults_to_local_root(tmp_path: Path) -> None:
    store = open_backend(None, tmp_path / "store")
    assert isinstance(store, LocalBackend)
    assert store.root == tmp_path / "store"


def test_open_backend_plain_path_and_file_url(tmp_path: Path) -> None:
    plain = open_backend(str(tmp_path / "a"), tmp_path / "default")
    url = open_backend(f"file://{tmp_path}/b%20c", tmp_path / "default")
    host = open_backend(f"file://localhost{tmp_path}/d", tmp_path / "default")
    assert isinstance(plain, LocalBackend) and plain.root == tmp_path / "a"
    assert isinstance(url, LocalBackend) and url.root == tmp_path / "b c"
    assert isinstance(host, LocalBackend) and host.root == tmp_path / "d"


def test_open_backend_memory_is_shared_per_name(tmp_path: Path) -> None:
    first = open_backend("memory://shared-test", tmp_path)
    first.put_bytes("k", b"v")
    again = open_backend("memory://shared-test", tmp_path)
    other = open_backend("memory://other-test", tmp_path)
    assert again is first
    assert again.get("k") == b"v"
    assert not other.exists("k")


@pytest.mark.parametrize("url", ["http://example.com/x", "ftp://h/x", "gs://bucket/prefix"])
def test_open_backend_rejects_unknown_schemes(tmp_path: Path, url: str) -> None:
    with pytest.raises(UsageError) as info:
        open_backend(url, tmp_path)
    assert "file://" in str(info.value) and "memory://" in str(info.value) and "s3://" in str(info.value)


def test_open_backend_rejects_remote_file_hosts(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="host"):
        open_backend("file://fileserver/share", tmp_path)


@pytest.mark.parametrize("prefix", ["../", "/etc/", "a//b", "../../x", "a\\b"])
def test_list_rejects_prefixes_that_escape(backend: Backend, prefix: str) -> None:
    with pytest.raises(UsageError):
        list(backend.list(prefix))
