"""Compare-and-swap on every store (``Backend.read_versioned`` / ``put_if``): what remotes move
their refs with. Of writers racing with one expected version, exactly one wins; none is lost."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptrepo.errors import UsageError
from ckptrepo.storage import LocalBackend, MemoryBackend, open_backend
from ckptrepo.storage.base import Backend


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
    second = store.put_if("refs/a", b"two", expected=version)
    assert second is not None and second != first
    assert store.put_if("refs/a", b"three", expected=version) is None  # stale version
    assert store.get("refs/a") == b"two"
    assert store.put_if("refs/missing", b"x", expected=first) is None  # no object at that version
    assert store.read_versioned("refs/missing") is None


def test_bad_keys_are_refused(store: Backend) -> None:
    with pytest.raises(UsageError):
        store.put_if("../up", b"x", expected=None)
    with pytest.raises(UsageError):
        store.read_versioned("/abs")


def _increment(store: Backend, key: str, times: int) -> int:
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
    threads = [threading.Thread(target=_increment, args=(store, "counter", 25)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.get("counter") == b"150"


def test_racing_processes_lose_no_update_in_a_folder(tmp_path: Path) -> None:
    store = LocalBackend(tmp_path / "store")
    store.put_if("counter", b"0", expected=None)
    code = ("import sys; from pathlib import Path; from ckptrepo.storage import LocalBackend\n"
            "from tests.unit.test_storage_cas import _increment\n"
            "_increment(LocalBackend(Path(sys.argv[1])), 'counter', 40)\n")
    root = Path(__file__).resolve().parents[2]
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "store")], cwd=root) for _ in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    assert store.get("counter") == b"120"
    assert ".cas.lock" not in list(store.list(""))
