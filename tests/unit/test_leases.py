"""Leases in the store (``ledger.leases``): what one holds, when it is live or stale, what it protects."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckptrepo import knobs
from ckptrepo.errors import StorageError, StoreFull
from ckptrepo.ledger import leases
from ckptrepo.storage import LocalBackend, MemoryBackend


def _dead_pid() -> int:
    """The pid of a process of this host that has ended (and been reaped)."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    return int(proc.stdout)


def _put(backend: MemoryBackend, key: str, body: object) -> None:
    backend.put_bytes(key, json.dumps(body).encode())


def test_a_lease_is_one_small_object_put_once_and_deleted_on_release(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "store")
    lease = leases.Lease(backend, "commit")
    assert lease.key is None and list(backend.list(leases.PREFIX)) == []
    key = lease.take()
    assert lease.take() == key  # taken once, whoever asks again
    assert leases.is_key(key) and list(backend.list(leases.PREFIX)) == [key]
    body = json.loads(backend.get(key))
    assert body == {"host": leases.HOST, "pid": os.getpid(), "purpose": "commit",
                    "at": pytest.approx(time.time(), abs=60)}
    found = leases.read(backend)
    assert [f.key for f in found.live] == [key] and not found.stale
    lease.release()
    lease.release()  # safe to repeat
    assert lease.key is None and list(backend.list(leases.PREFIX)) == []
    assert leases.read(backend) == leases.Leases()


def test_a_lease_that_cannot_be_put_is_a_storage_error() -> None:
    class Full(MemoryBackend):
        def put_bytes(self, key: str, data: bytes | memoryview) -> None:
            raise OSError(errno.ENOSPC, "No space left on device", "lease")

    class Refusing(MemoryBackend):
        def put_bytes(self, key: str, data: bytes | memoryview) -> None:
            raise OSError(errno.EACCES, "Permission denied", "lease")

    with pytest.raises(StoreFull):
        leases.Lease(Full(), "commit").take()
    lease = leases.Lease(Refusing(), "commit")
    with pytest.raises(StorageError, match="Permission denied"):
        lease.take()
    assert lease.key is None


def test_a_lease_of_a_process_of_this_host_that_ended_is_stale() -> None:
    backend = MemoryBackend()
    _put(backend, "leases/00000000000000000001-0000000000000001.json",
         {"host": leases.HOST, "pid": _dead_pid(), "purpose": "commit", "at": time.time()})
    _put(backend, "leases/00000000000000000002-0000000000000002.json",
         {"host": "another-host", "pid": _dead_pid(), "purpose": "rank 1", "at": time.time()})
    found = leases.read(backend)
    assert [f.purpose for f in found.stale] == ["commit"]
    assert [f.host for f in found.live] == ["another-host"]  # its pid says nothing here


def test_a_lease_older_than_the_ttl_is_stale_whoever_holds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = MemoryBackend()
    key = leases.Lease(backend, "commit").take()
    _put(backend, "leases/00000000000000000002-0000000000000002.json", {"host": "another-host", "pid": 1})
    now = time.time()
    assert len(leases.read(backend, now=now).live) == 2  # the unreadable one too: live until the TTL
    later = now + leases.ttl_s() + 1
    assert {f.key for f in leases.read(backend, now=later).stale} == {key, "leases/00000000000000000002-"
                                                                             "0000000000000002.json"}
    monkeypatch.setenv("CKPT_LEASE_TTL", "10")
    assert len(leases.read(backend, now=now + 11).stale) == 2
    assert len(leases.read(backend, now=now + 5).live) == 2


def test_the_ttl_knob_defaults_to_the_documented_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CKPT_LEASE_TTL", raising=False)
    assert leases.ttl_s() == knobs.KNOBS["LEASE_TTL"].default == 6 * 3600


def test_a_live_lease_protects_what_was_stored_from_its_own_store_time_on() -> None:
    lease = leases.Found("leases/x", "h", 1, "commit", at=1_000.0, mtime=2_000.0)  # the writer's clock is off
    found = leases.Leases(live=(lease,))
    assert found.protects(2_000.0) and found.protects(9_999.0)
    assert found.protects(2_000.0 - leases.MARGIN_S) and not found.protects(2_000.0 - leases.MARGIN_S - 0.01)
    assert found.protects_local(1_000.0) and not found.protects_local(1_000.0 - leases.MARGIN_S - 0.01)
    assert not leases.Leases(stale=(lease,)).protects(9_999.0)  # a stale one protects nothing


def test_release_deletes_only_lease_keys() -> None:
    backend = MemoryBackend()
    backend.put_bytes("packs/ab/abcd.pack", b"x")
    key = leases.take(backend, "rank 1")
    leases.release(backend, ["packs/ab/abcd.pack", key, "leases/../packs"])
    assert list(backend.list("")) == ["packs/ab/abcd.pack"]


def test_a_lease_of_a_process_that_ended_but_was_not_reaped_is_stale() -> None:
    backend = MemoryBackend()
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        while Path(f"/proc/{zombie.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            time.sleep(0.01)  # ended; not waited for yet
        _put(backend, "leases/00000000000000000001-0000000000000001.json",
             {"host": leases.HOST, "pid": zombie.pid, "purpose": "rank 1", "at": time.time()})
        _put(backend, "leases/00000000000000000002-0000000000000002.json",
             {"host": leases.HOST, "pid": os.getpid(), "purpose": "commit", "at": time.time()})
        found = leases.read(backend)
        assert [f.pid for f in found.stale] == [zombie.pid] and [f.pid for f in found.live] == [os.getpid()]
    finally:
        zombie.wait()
