"""The store's own record of the repository: commit manifests (format pinned) and the journal,
and the replay of ref changes a database rebuild does (``maintenance.replay.replay_refs``)."""

from __future__ import annotations

import json
from typing import Any

import blake3
import pytest
import zstandard

from ckptrepo.errors import IntegrityError
from ckptrepo.ids import tensor_id
from ckptrepo.ledger import fields, journal, manifest
from ckptrepo.maintenance.replay import replay_refs
from ckptrepo.rows import TensorRow
from ckptrepo.storage import MemoryBackend

A, B, C, D = ("a" * 64, "b" * 64, "c" * 64, "d" * 64)
CHUNKS = ["1" * 64, "2" * 64]
T = tensor_id("float32", [2], 4, CHUNKS)
STATS = {"numel": 2, "mean": 0.0, "std": 1.0, "min": -1.0, "max": 1.0, "l2_norm": 1.4, "abs_max": 1.0,
         "nan_count": 0, "inf_count": 0}


def _manifest(tensor: tuple[Any, ...] = ("float32", [2], 8, 4, None, STATS, CHUNKS), **overrides: Any
              ) -> dict[str, Any]:
    row = {"message": "m", "created_at": "2026-11-28T10:00:00+00:00", "author": "me", "host": "h",
           "branch": "main", "step": 3, "epoch": None, "config": {"lr": 0.1}, "code_version": None,
           "skeleton": {"t": "w"}, "n_tensors": 1, "logical_bytes": 8, "new_bytes": 8, "stored_bytes": 5,
           "stall_s": 0.5, "wait_s": 0.0, "persist_s": 0.25, "nonfinite": 0}
    row.update(overrides)
    edges = [[A, "parent", 0, None]]
    tid = tensor_id(tensor[0], tensor[1], tensor[3], tensor[6], tensor[4])
    entries = {"w": tid}
    row["id"] = manifest.commit_id(entries=entries, skeleton=row["skeleton"], edges=edges, message=row["message"],
                                   step=row["step"], epoch=row["epoch"], metrics={"loss": 0.5},
                                   config=row["config"], created_at=row["created_at"], author=row["author"],
                                   host=row["host"])
    dtype, shape, nbytes, chunk_size, boxes, stats, chunks = tensor  # a record's fields, in its order
    rows = [TensorRow(tensor_id=tid, dtype=dtype, shape=shape, nbytes=nbytes, chunk_size=chunk_size, chunk_ids=chunks,
                      boxes=boxes, stats=stats)]
    return manifest.build(row, edges, {"loss": 0.5}, entries, rows, branch="main", expected=A, at=1.5)


def test_the_manifest_format_is_pinned() -> None:
    body = _manifest()
    text = manifest.encode(body).decode()
    assert text == (
        '{"checksum":"' + body["checksum"] + '",'
        '"commit":{"author":"me","branch":"main","code_version":null,"config":{"lr":0.1},'
        '"created_at":"2026-11-28T10:00:00+00:00","epoch":null,"host":"h","logical_bytes":8,"message":"m",'
        '"n_tensors":1,"new_bytes":8,"nonfinite":0,"persist_s":0.25,"skeleton":{"t":"w"},"stall_s":0.5,"step":3,'
        '"stored_bytes":5,"wait_s":0.0},"edges":[["' + A + '","parent",0,null]],"entries":{"w":"' + T + '"},'
        '"format":2,"id":"' + body["id"] + '","metrics":{"loss":0.5},'
        '"move":{"at":1.5,"branch":"main","from":"' + A + '"},'
        '"tensors":{"' + T + '":["float32",[2],8,4,null,{"abs_max":1.0,"inf_count":0,"l2_norm":1.4,'
        '"max":1.0,"mean":0.0,"min":-1.0,"nan_count":0,"numel":2,"std":1.0},"' + "".join(CHUNKS) + '"]}}')
    # The checksum is BLAKE3 of that text without it.
    without = json.dumps({k: v for k, v in body.items() if k != "checksum"}, sort_keys=True, separators=(",", ":"))
    assert body["checksum"] == blake3.blake3(without.encode()).hexdigest()
    assert manifest.key_of(body["id"]) == f"manifests/{body['id'][:2]}/{body['id']}.json"
    back = manifest.read_bytes(manifest.encode(body), body["id"])
    assert back == body and manifest.chunk_ids(back["tensors"][T]) == CHUNKS


def test_a_format_1_manifest_without_a_checksum_is_still_read_and_its_tensors_checked() -> None:
    body = {k: v for k, v in _manifest().items() if k != "checksum"}

    def legacy(value: dict[str, Any]) -> bytes:  # how format 1 stored a manifest
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True)
        return zstandard.ZstdCompressor(level=9).compress(text.encode())

    assert manifest.read_bytes(legacy({**body, "format": 1}), body["id"])["format"] == 1
    with pytest.raises(IntegrityError, match="checksum"):
        manifest.read_bytes(manifest.encode(body), body["id"])  # format 2 needs one
    for wrong in (legacy(body), manifest.encode({**body, "format": 1})):  # each format in its own form only
        with pytest.raises(IntegrityError, match="neither format 1"):
            manifest.read_bytes(wrong, body["id"])
    forged = {**body, "format": 1, "tensors": {T: ["int32", [2], 8, 4, None, STATS, "".join(CHUNKS)]}}
    with pytest.raises(IntegrityError, match="does not hash to its id"):
        manifest.read_bytes(legacy(forged), body["id"])
    assert manifest.commit_of_key(manifest.key_of(A, legacy=True)) == A


def _resealed(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with a checksum that matches it again: a forger's manifest, not a bit flip."""
    return {**body, "checksum": fields.checksum(body)}


@pytest.mark.parametrize("damage", ["garbage", "format", "field", "missing", "other", "dtype", "shape", "chunks",
                                    "stats", "extra_tensor", "unknown_dtype", "nbytes", "bad_id", "edge_kind",
                                    "n_tensors", "huge"])
def test_a_damaged_manifest_is_refused(damage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manifest, "MAX_BYTES", 1 << 20)
    body = _manifest()
    cid = body["id"]
    record = body["tensors"][T]
    other_chunks = ["3" * 64, "4" * 64]
    if damage == "garbage":
        data = b"not zstd"
    elif damage == "format":
        data = manifest.encode(_resealed({**body, "format": 3}))
    elif damage == "field":
        data = manifest.encode(_resealed({**body, "commit": {**body["commit"], "message": "changed"}}))
    elif damage == "missing":
        data = manifest.encode(_resealed({k: v for k, v in body.items() if k != "entries"}))
    elif damage == "other":
        data = manifest.encode(_manifest(step=4))
    elif damage == "dtype":  # the probe's int32 tensor: a record that no longer hashes to its id
        data = manifest.encode(_resealed({**body, "tensors": {T: ["int32", *record[1:]]}}))
    elif damage == "shape":
        data = manifest.encode(_resealed({**body, "tensors": {T: [record[0], [1, 2], *record[2:]]}}))
    elif damage == "chunks":  # another commit's chunk ids under this commit's tensor id
        data = manifest.encode(_resealed({**body, "tensors": {T: [*record[:6], "".join(other_chunks)]}}))
    elif damage == "stats":  # a statistic changed, checksum left as it was (a bit flip)
        data = manifest.encode({**body, "tensors": {T: [*record[:5], {**STATS, "max": 9.0}, record[6]]}})
    elif damage == "extra_tensor":
        extra = tensor_id("float32", [2], 4, other_chunks)
        data = manifest.encode(_resealed({**body, "tensors": {**body["tensors"],
                                                               extra: [*record[:6], "".join(other_chunks)]}}))
    elif damage == "unknown_dtype":
        data = manifest.encode(_resealed({**body, "tensors": {T: ["float99", *record[1:]]}}))
    elif damage == "nbytes":
        bad = _manifest(tensor=("float32", [2], 12, 4, None, STATS, CHUNKS))
        cid = bad["id"]
        data = manifest.encode(bad)
    elif damage == "bad_id":
        data = manifest.encode(_resealed({**body, "entries": {"w": "not an id"}}))
    elif damage == "edge_kind":
        data = manifest.encode(_resealed({**body, "edges": [[A, "sideways", 0, None]]}))
    elif damage == "n_tensors":
        data = manifest.encode(_resealed({**body, "commit": {**body["commit"], "n_tensors": 2}}))
    else:  # a small frame that expands past the bound
        data = zstandard.ZstdCompressor().compress(b" " * (manifest.MAX_BYTES + 1))
        assert len(data) < 1 << 10
    with pytest.raises(IntegrityError):
        manifest.read_bytes(data, cid)


def test_every_single_bit_flip_of_a_manifest_is_refused() -> None:
    body = _manifest()
    data = bytearray(manifest.encode(body))
    for bit in range(len(data) * 8):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(IntegrityError):
            manifest.read_bytes(bytes(flipped), body["id"])


def test_manifest_keys() -> None:
    assert manifest.commit_of_key(manifest.key_of(A)) == A
    for key in (f"manifests/aa/{A}.jsonl", f"manifests/bb/{A}.json.zst", "manifests/aa/x.json", "journal/x"):
        assert manifest.commit_of_key(key) is None


def test_the_journal_keeps_entries_in_order_and_takes_back_a_failed_change() -> None:
    store = MemoryBackend()
    first = journal.append(store, {"op": "ref", "kind": "tag", "name": "t", "to": A})
    with pytest.raises(RuntimeError), journal.entry(store, {"op": "ref", "kind": "tag", "name": "u", "to": B}):
        raise RuntimeError("the transaction failed")
    with journal.entry(store, {"op": "prune", "commits": [A]}):
        pass
    got = list(journal.entries(store))
    assert got[0][0] == first and [e["op"] for _, e in got] == ["ref", "prune"]
    assert all(isinstance(e["at"], float) and e["key"] == k for k, e in got)
    journal.discard(store, first)
    journal.discard(store, None)
    assert [e["op"] for _, e in journal.entries(store)] == ["prune"]
    store.put_bytes("journal/zz.json", b"{")
    with pytest.raises(IntegrityError):
        list(journal.entries(store))
    found = journal.read(store)
    assert [e["op"] for _, e in found.entries] == ["prune"] and [k for k, _ in found.damaged] == ["journal/zz.json"]


@pytest.mark.parametrize("damage", ["flip", "renamed", "op", "name_type", "target", "commits", "legacy_ok"])
def test_a_damaged_journal_entry_is_refused(damage: str) -> None:
    store = MemoryBackend()
    key = journal.append(store, {"op": "ref", "kind": "branch", "name": "main", "to": A})
    entry = json.loads(store.get(key))
    if damage == "flip":  # a bit flip that keeps the JSON valid: the checksum catches it
        data = store.get(key).replace(A.encode(), B.encode())
    elif damage == "renamed":
        data = store.get(key)
        key = key.replace("-", "-0", 1)[:-6] + ".json"
    elif damage == "legacy_ok":
        data = json.dumps({k: v for k, v in entry.items() if k not in ("key", "checksum")}).encode()
    else:
        changed = {"op": {"op": "rm"}, "name_type": {"name": 5}, "target": {"to": "main"},
                   "commits": {"op": "prune", "commits": ["x"]}}[damage]
        data = json.dumps(_resealed({**entry, **changed})).encode()
    if damage == "legacy_ok":
        assert journal.decode(data, key)["to"] == A
        return
    with pytest.raises(IntegrityError, match="journal entry"):
        journal.decode(data, key)


def _move(cid: str, expected: str | None, at: float, branch: str = "main") -> dict[str, Any]:
    return {"edges": [], "move": {"branch": branch, "from": expected, "at": at}}


def test_commit_moves_replay_by_compare_and_swap_in_time_order() -> None:
    refs, lost = replay_refs({A: _move(A, None, 1.0), B: _move(B, A, 2.0), C: _move(C, B, 3.0)}, [])
    assert refs == {("branch", "main"): C} and lost == []


def test_a_move_stamped_before_its_predecessor_still_applies() -> None:
    # Another host's clock is behind: C (on top of B) carries an earlier time than B.
    refs, lost = replay_refs({A: _move(A, None, 1.0), B: _move(B, A, 5.0), C: _move(C, B, 3.0)}, [])
    assert refs == {("branch", "main"): C} and lost == []


def test_of_two_moves_from_one_head_the_one_continued_wins_and_the_other_is_lost() -> None:
    # B and C both expected A; D continues from C, so C won and B's move never applied.
    refs, lost = replay_refs({A: _move(A, None, 1.0), B: _move(B, A, 2.0), C: _move(C, A, 2.5),
                              D: _move(D, C, 3.0)}, [])
    assert refs[("branch", "main")] == D and lost == [B]
    # Without D, the later of the two is taken (nothing tells them apart but time).
    refs, lost = replay_refs({A: _move(A, None, 1.0), B: _move(B, A, 2.0), C: _move(C, A, 2.5)}, [])
    assert refs[("branch", "main")] == C and lost == [B]


def test_journalled_ref_changes_apply_as_written() -> None:
    manifests = {A: _move(A, None, 1.0), B: _move(B, A, 2.0)}
    entries = [
        {"op": "ref", "kind": "branch", "name": "exp", "to": A, "at": 1.5},
        {"op": "ref", "kind": "tag", "name": "v1", "to": A, "at": 1.6},
        {"op": "ref", "kind": "branch", "name": "main", "to": A, "at": 3.0},  # reset by force
        {"op": "ref", "kind": "branch", "name": "exp", "to": None, "at": 4.0},  # deleted
        {"op": "prune", "commits": [B], "at": 5.0},
    ]
    refs, lost = replay_refs(manifests, entries)
    assert refs == {("branch", "main"): A, ("tag", "v1"): A} and lost == []
    assert json.dumps(sorted(refs.items()))


def test_a_move_expecting_a_commit_whose_manifest_is_lost_still_applies() -> None:
    # B's manifest is lost: its own move is unknown, C's move expected B. B is replayed as a move
    # from whatever head the branch has, so C (and what follows) still lands on main.
    refs, lost = replay_refs({A: _move(A, None, 1.0), C: _move(C, B, 3.0), D: _move(D, C, 4.0)}, [],
                             {B: [("main", 3.0)]})
    assert refs == {("branch", "main"): D} and lost == []
    # Without that, C and D would be lost moves (each left on a conflicts/ branch by a rebuild).
    refs, lost = replay_refs({A: _move(A, None, 1.0), C: _move(C, B, 3.0), D: _move(D, C, 4.0)}, [])
    assert refs == {("branch", "main"): A} and sorted(lost) == [C, D]
