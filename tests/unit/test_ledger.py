"""The store's own record of the repository: commit manifests (format pinned) and the journal,
and the replay of ref changes a database rebuild does (``maintenance.rebuild.replay_refs``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import zstandard

from ckptrepo.errors import IntegrityError
from ckptrepo.ledger import journal, manifest
from ckptrepo.maintenance.rebuild import replay_refs
from ckptrepo.storage import MemoryBackend

A, B, C, D = ("a" * 64, "b" * 64, "c" * 64, "d" * 64)
CHUNKS = ["1" * 64, "2" * 64]


def _manifest(**overrides: Any) -> dict[str, Any]:
    row = {"message": "m", "created_at": "2026-11-28T10:00:00+00:00", "author": "me", "host": "h",
           "branch": "main", "step": 3, "epoch": None, "config": {"lr": 0.1}, "code_version": None,
           "skeleton": {"t": "w"}, "n_tensors": 1, "logical_bytes": 8, "new_bytes": 8, "stored_bytes": 5,
           "stall_s": 0.5, "wait_s": 0.0, "persist_s": 0.25, "nonfinite": 0}
    row.update(overrides)
    edges = [[A, "parent", 0, None]]
    entries = {"w": "e" * 64}
    row["id"] = manifest.commit_id(entries=entries, skeleton=row["skeleton"], edges=edges, message=row["message"],
                                   step=row["step"], epoch=row["epoch"], metrics={"loss": 0.5},
                                   config=row["config"], created_at=row["created_at"], author=row["author"],
                                   host=row["host"])
    stats = {"numel": 2, "mean": 0.0, "std": 1.0, "min": -1.0, "max": 1.0, "l2_norm": 1.4, "abs_max": 1.0,
             "nan_count": 0, "inf_count": 0}
    return manifest.build(row, edges, {"loss": 0.5}, entries, [("e" * 64, "float32", [2], 8, 4, None, stats, CHUNKS)],
                          branch="main", expected=A, at=1.5)


def test_the_manifest_format_is_pinned() -> None:
    body = _manifest()
    text = zstandard.ZstdDecompressor().decompress(manifest.encode(body)).decode()
    assert text == (
        '{"commit":{"author":"me","branch":"main","code_version":null,"config":{"lr":0.1},'
        '"created_at":"2026-11-28T10:00:00+00:00","epoch":null,"host":"h","logical_bytes":8,"message":"m",'
        '"n_tensors":1,"new_bytes":8,"nonfinite":0,"persist_s":0.25,"skeleton":{"t":"w"},"stall_s":0.5,"step":3,'
        '"stored_bytes":5,"wait_s":0.0},"edges":[["' + A + '","parent",0,null]],"entries":{"w":"' + "e" * 64 + '"},'
        '"format":1,"id":"' + body["id"] + '","metrics":{"loss":0.5},'
        '"move":{"at":1.5,"branch":"main","from":"' + A + '"},'
        '"tensors":{"' + "e" * 64 + '":["float32",[2],8,4,null,{"abs_max":1.0,"inf_count":0,"l2_norm":1.4,'
        '"max":1.0,"mean":0.0,"min":-1.0,"nan_count":0,"numel":2,"std":1.0},"' + "".join(CHUNKS) + '"]}}')
    assert manifest.key_of(body["id"]) == f"manifests/{body['id'][:2]}/{body['id']}.json.zst"
    back = manifest.read_bytes(manifest.encode(body), body["id"])
    assert back == body and manifest.chunk_ids(back["tensors"]["e" * 64]) == CHUNKS


@pytest.mark.parametrize("damage", ["garbage", "format", "field", "missing", "other"])
def test_a_damaged_manifest_is_refused(damage: str) -> None:
    body = _manifest()
    cid = body["id"]
    if damage == "garbage":
        data = b"not zstd"
    elif damage == "format":
        data = manifest.encode({**body, "format": 2})
    elif damage == "field":
        data = manifest.encode({**body, "commit": {**body["commit"], "message": "changed"}})
    elif damage == "missing":
        data = manifest.encode({k: v for k, v in body.items() if k != "entries"})
    else:
        data = manifest.encode(_manifest(step=4))
    with pytest.raises(IntegrityError):
        manifest.read_bytes(data, cid)


def test_manifest_keys() -> None:
    assert manifest.commit_of_key(manifest.key_of(A)) == A
    for key in (f"manifests/aa/{A}.json", f"manifests/bb/{A}.json.zst", "manifests/aa/x.json.zst", "journal/x"):
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
    assert all(isinstance(e["at"], float) for _, e in got)
    journal.discard(store, first)
    journal.discard(store, None)
    assert [e["op"] for _, e in journal.entries(store)] == ["prune"]
    store.put_bytes("journal/zz.json", b"{")
    with pytest.raises(IntegrityError):
        list(journal.entries(store))


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
