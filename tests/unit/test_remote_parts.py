"""The remote's parts on their own: the list of remotes, ref objects and their checks, the
coalescing of byte ranges, and the tiered store (reads through, writes and deletes local)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptrepo.config import RepoConfig
from ckptrepo.errors import FormatError, IntegrityError, RemoteExists, StorageError, UnknownRemote, UsageError
from ckptrepo.ledger import fields
from ckptrepo.locations import ChunkLocation
from ckptrepo.remote import config, refs
from ckptrepo.remote.tiered import TieredBackend
from ckptrepo.remote.transfer import _ranges
from ckptrepo.storage import MemoryBackend
from ckptrepo.types import RemoteInfo

ID = "ab" * 32
OTHER = "cd" * 32


def test_remote_names_and_the_file(tmp_path: Path) -> None:
    for bad in ("", "a/b", ".hidden", "x" * 64, "a..b", "name.lock", "sp ace", "-lead"):
        with pytest.raises(UsageError):
            config.check_name(bad)
    assert config.load(tmp_path) == {}
    config.add(tmp_path, RemoteInfo("origin", "/data/r", replicate=True))
    with pytest.raises(RemoteExists):
        config.add(tmp_path, RemoteInfo("origin", "/elsewhere"))
    assert config.load(tmp_path)["origin"] == RemoteInfo("origin", "/data/r", replicate=True)
    with pytest.raises(UnknownRemote) as caught:
        config.remove(tmp_path, "orign")
    assert "origin" in caught.value.hint
    assert config.remove(tmp_path, "origin").url == "/data/r"
    (tmp_path / config.FILE_NAME).write_text('{"remotes": {"../x": {"url": "/y"}}}')
    with pytest.raises(FormatError):
        config.load(tmp_path)
    (tmp_path / config.FILE_NAME).write_text("not json")
    with pytest.raises(FormatError):
        config.load(tmp_path)


def test_ref_objects_move_by_compare_and_swap_and_are_checked() -> None:
    store = MemoryBackend()
    assert refs.read(store, "branch", "main") is None
    assert refs.swap(store, "branch", "main", ID, None)
    first = refs.read(store, "branch", "main")
    assert first is not None and first.target == ID
    assert not refs.swap(store, "branch", "main", OTHER, None)  # exists already
    assert refs.swap(store, "branch", "main", OTHER, first)
    assert not refs.swap(store, "branch", "main", ID, first)  # a stale version
    current = refs.read(store, "branch", "main")
    assert current is not None and refs.swap(store, "branch", "main", None, current)  # a tombstone
    assert refs.heads(refs.read_all(store)) == {}
    assert refs.swap(store, "tag", "feature/v1", ID, None)
    assert refs.heads(refs.read_all(store)) == {("tag", "feature/v1"): ID}
    assert refs.key_of("tag", "feature/v1") == "refs/tag/feature%2Fv1.json"


@pytest.mark.parametrize("change", ["flip", "rename", "bad-name", "bad-target", "huge"])
def test_a_damaged_ref_object_is_refused(change: str) -> None:
    store = MemoryBackend()
    refs.swap(store, "branch", "main", ID, None)
    key = refs.key_of("branch", "main")
    body = json.loads(store.get(key))
    if change == "flip":
        store.put_bytes(key, store.get(key).replace(b"ab", b"ac", 1))
    elif change == "rename":
        store.put_bytes(refs.key_of("branch", "other"), store.get(key))
        key = refs.key_of("branch", "other")
    else:
        body.pop(fields.CHECKSUM)
        if change == "bad-name":
            body["name"] = "../../etc"
        elif change == "bad-target":
            body["to"] = "not an id"
        else:
            body["name"] = "x" * 70000
        body[fields.CHECKSUM] = fields.checksum(body)
        store.put_bytes(key, json.dumps(body).encode())
    with pytest.raises(IntegrityError) as caught:
        refs.read_all(store)
    assert key in caught.value.message or "remote" in caught.value.message


def test_the_marker_holds_the_settings_a_clone_takes() -> None:
    store = MemoryBackend()
    assert refs.read_marker(store) is None
    refs.write_marker(store, "repo1", RepoConfig(chunk_size=1 << 16))
    marker = refs.read_marker(store)
    assert marker is not None and marker["repo_id"] == "repo1" and marker["config"]["chunk_size"] == 1 << 16
    refs.write_marker(store, "repo2", RepoConfig())  # kept: written once
    assert refs.read_marker(store)["repo_id"] == "repo1"  # type: ignore[index]
    store.put_bytes(refs.MARKER, b"{}")
    with pytest.raises(IntegrityError):
        refs.read_marker(store)


def test_ranges_read_close_payloads_together() -> None:
    def loc(pack: str, offset: int, length: int) -> ChunkLocation:
        return ChunkLocation(f"{offset:064x}", pack, offset, length, length, 0)

    got = list(_ranges([loc("p", 10, 5), loc("p", 15, 5), loc("p", 200_000, 5), loc("q", 0, 3)]))
    assert [(p, o, n, len(run)) for p, o, n, run in got] == [("p", 10, 10, 2), ("p", 200_000, 5, 1), ("q", 0, 3, 1)]


def test_the_tiered_store_reads_through_and_writes_here() -> None:
    local, remote = MemoryBackend(), MemoryBackend()
    remote.put_bytes("packs/aa/x.pack", b"remote bytes")
    remote.put_bytes("manifests/aa/m.json", b"not read through")
    store = TieredBackend(local, remotes=[("origin", lambda: remote)])
    assert store.get("packs/aa/x.pack") == b"remote bytes"
    assert store.get_range("packs/aa/x.pack", 7, 5) == b"bytes"
    assert not store.is_local("packs/aa/x.pack")
    with pytest.raises(StorageError):
        store.get("manifests/aa/m.json")  # only packs are read through
    store.delete("packs/aa/x.pack")  # never on the remote
    assert remote.exists("packs/aa/x.pack")
    store.put_bytes("packs/aa/x.pack", b"local bytes!")
    assert store.get("packs/aa/x.pack") == b"local bytes!" and store.is_local("packs/aa/x.pack")
    assert list(store.list("packs/")) == ["packs/aa/x.pack"] and list(remote.list("packs/")) == ["packs/aa/x.pack"]
    with pytest.raises(StorageError):
        store.get("packs/bb/none.pack")


def _pack(tmp_path: Path) -> tuple[str, int, list[ChunkLocation], bytes]:
    from ckptrepo.chunks.pack import PackWriter
    from ckptrepo.ids import hash_bytes

    writer = PackWriter(tmp_path)
    for i in range(3):
        payload = bytes([i]) * 100
        writer.add(hash_bytes(payload), 0, payload, 100)
    pid, path, entries = writer.finish()
    return pid, path.stat().st_size, entries, path.read_bytes()


def test_a_bundle_carries_pack_indexes_and_manifests_each_checked(tmp_path: Path) -> None:
    import base64

    from ckptrepo.remote import bundles

    pid, size, entries, data = _pack(tmp_path)
    tail = bundles.tail_of(pid, size, entries)
    assert tail is not None and data.endswith(tail)
    assert bundles.tail_of(pid, size, entries[:2]) is None  # not that pack's rows
    store = MemoryBackend()
    key, _ = bundles.write(store, [(pid, size, tail)], [])
    assert bundles.is_key(key)
    got = bundles.read(store.get(key), key)
    assert got.packs == {pid: (size, entries)} and not got.problems
    # An index that does not hash to its pack's id is refused, the rest of the bundle kept.
    other = bytearray(tail)
    other[5] ^= 1
    key2, _ = bundles.write(store, [(pid, size, bytes(other)), ("ab" * 32, size, tail)], [])
    got = bundles.read(store.get(key2), key2)
    assert got.packs == {} and len(got.problems) == 2
    # A damaged frame is one IntegrityError naming the bundle.
    with pytest.raises(IntegrityError) as caught:
        bundles.read(store.get(key)[:-3], key)
    assert key in caught.value.message
    # Folding: the new bundle repeats the old one's items and says it covers it.
    folded = bundles.read(store.get(key), key)
    key3, _ = bundles.write(store, [], [], fold=[folded], covers=[key])
    got = bundles.read(store.get(key3), key3)
    assert got.covers == [key] and pid in got.packs
    assert base64.b64decode(got.tails[pid][1]) == tail
