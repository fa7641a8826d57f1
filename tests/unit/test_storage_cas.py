"""Compare-and-swap on every store (``Backend.read_versioned`` / ``put_if``): what remotes move
their refs with. Of writers racing with one expected version, exactly one wins; no update is lost,
between threads on every store and between processes on a folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptrepo.errors import StorageError, UsageError
from ckptrepo.storage import LocalBackend, MemoryBackend, open_backend
from ckptrepo.storage.base import Backend
from ckptrepo.storage.local import CAS_LOCK
from ckptrepo.storage.s3 import S3Backend

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["local", "memory", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "s3":
        backend: Backend = open_backend(request.getfixturevalue("s3_url"), tmp_path / "staging-root")
    elif request.param == "local":
        backend = LocalBackend(tmp_path / "store")
    else:
        backend = MemoryBackend()
    yield backend
    backend.close()


def test_create_only_when_absent_replace_only_at_the_version_read(store: Backend) -> None:
    assert store.read_versioned("refs/a") is None
    first = store.put_if("refs/a", b"one", expected=None)
    assert first is not None
    assert store.put_if("refs/a", b"again", expected=None) is None  # exists
    data, version = store.read_versioned("refs/a") or (b"", "")
    assert data == b"one" and version == first
    second = store.put_if("refs/a", memoryview(b"two"), expected=version)
    assert second is not None and second != first
    assert store.read_versioned("refs/a") == (b"two", second)  # the token put_if returned
    assert store.put_if("refs/a", b"three", expected=version) is None  # stale version
    assert store.get("refs/a") == b"two"
    assert store.put_if("refs/missing", b"x", expected=first) is None  # no object at that version
    assert store.read_versioned("refs/missing") is None
    store.delete("refs/a")
    assert store.put_if("refs/a", b"four", expected=second) is None  # gone meanwhile
    assert store.put_if("refs/a", b"four", expected=None) is not None
    assert list(store.list("")) == ["refs/a"]  # a folder's lock file is no key


def test_bad_keys_are_refused(store: Backend) -> None:
    for key in ("../up", "/abs", "a//b", CAS_LOCK, "refs/.hidden"):
        with pytest.raises(UsageError):
            store.put_if(key, b"x", expected=None)
        with pytest.raises(UsageError):
            store.read_versioned(key)


def test_one_of_writers_racing_with_one_version_wins(store: Backend) -> None:
    version = store.put_if("ref", b"start", expected=None)
    writers = 8
    barrier = threading.Barrier(writers)
    results: list[str | None] = [None] * writers

    def write(i: int) -> None:
        barrier.wait()
        results[i] = store.put_if("ref", f"writer {i}".encode(), expected=version)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, r in enumerate(results) if r is not None]
    assert len(winners) == 1
    assert store.read_versioned("ref") == (f"writer {winners[0]}".encode(), results[winners[0]])


def _increment(store: Backend, key: str, times: int) -> int:
    """Add one to the counter at ``key``, ``times`` times, by read-compare-swap; the retries taken."""
    retries = 0
    for _ in range(times):
        while True:
            got = store.read_versioned(key)
            assert got is not None
            if store.put_if(key, str(int(got[0]) + 1).encode(), expected=got[1]) is not None:
                break
            retries += 1
    return retries


def test_racing_threads_lose_no_update(store: Backend) -> None:
    store.put_if("counter", b"0", expected=None)
    times = 15 if isinstance(store, S3Backend) else 50  # each try is two requests to the S3 server
    threads = [threading.Thread(target=_increment, args=(store, "counter", times)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.get("counter") == str(8 * times).encode()


_INCREMENT = """
import sys
from pathlib import Path
from ckptrepo.storage import LocalBackend
store = LocalBackend(Path(sys.argv[1]))
for _ in range(int(sys.argv[2])):
    while True:
        data, version = store.read_versioned("counter")
        if store.put_if("counter", str(int(data) + 1).encode(), expected=version) is not None:
            break
"""


def test_racing_processes_lose_no_update_in_a_folder(tmp_path: Path) -> None:
    store = LocalBackend(tmp_path / "store")
    store.put_if("counter", b"0", expected=None)
    procs = [subprocess.Popen([sys.executable, "-c", _INCREMENT, str(store.root), "60"], cwd=ROOT) for _ in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    assert store.get("counter") == b"180"
    assert (store.root / CAS_LOCK).is_file()
    assert list(store.list("")) == ["counter"]


_FORK_WHILE_LOCKED = """
import os, sys, time
from pathlib import Path
from ckptrepo.storage import LocalBackend
store = LocalBackend(Path(sys.argv[1]))
held = store._cas_locked()  # kept referenced: a collected one would release the lock
held.__enter__()
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
print(child, flush=True)
os._exit(0)  # dies holding the lock, its forked child still alive
"""


def test_a_forked_child_does_not_keep_the_folder_lock(tmp_path: Path) -> None:
    store = LocalBackend(tmp_path / "store")
    proc = subprocess.Popen([sys.executable, "-c", _FORK_WHILE_LOCKED, str(store.root)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())  # not read to the end: the child holds the pipe open
    proc.stdout.close()
    assert proc.wait(timeout=60) == 0
    try:
        done = threading.Event()
        thread = threading.Thread(target=lambda: (store.put_if("ref", b"x", expected=None), done.set()), daemon=True)
        thread.start()
        assert done.wait(timeout=20), "the forked child still holds the compare-and-swap lock"
        assert store.get("ref") == b"x"
    finally:
        os.kill(child, signal.SIGKILL)


def test_failures_of_a_folder_are_storage_errors(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"not a folder")
    store = LocalBackend(tmp_path / "file")
    with pytest.raises(StorageError):
        store.put_if("ref", b"x", expected=None)
    with pytest.raises(StorageError):
        store.read_versioned("ref")


def test_a_folder_without_locks_is_a_storage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fcntl

    def no_locks(fd: int, op: int) -> None:
        if op & fcntl.LOCK_EX:
            raise OSError(37, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    store = LocalBackend(tmp_path / "store")
    with pytest.raises(StorageError, match="flock"):
        store.put_if("ref", b"x", expected=None)
    assert store.read_versioned("ref") is None


def test_failures_of_s3_are_storage_errors(tmp_path: Path, s3_url: str) -> None:
    store = S3Backend.from_url(s3_url.replace("s3://ckpt-", "s3://absent-", 1), tmp_path / "staging")
    with pytest.raises(StorageError):
        store.put_if("ref", b"x", expected=None)
    with pytest.raises(StorageError):
        store.read_versioned("ref")
