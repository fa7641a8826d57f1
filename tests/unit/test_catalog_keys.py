"""Integer keys of chunks and tensors (schema 0010): ``catalog.allocate_keys`` and how
``catalog.record_commit`` gives keys to new rows and finds those of stored ones, on SQLite and
PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from sqlalchemy import Engine, delete, select

from ckptrepo.db import catalog
from ckptrepo.db.engine import session_factory, write_transaction
from ckptrepo.db.models import Chunk, Entry, Tensor, TensorChunk
from ckptrepo.errors import ConcurrentChange
from ckptrepo.locations import ChunkLocation
from ckptrepo.rows import TensorRow

NOW = datetime(2026, 11, 27, tzinfo=timezone.utc)
COMMIT = {"message": "", "author": "", "host": "", "branch": None, "step": None, "epoch": None, "config": None,
          "code_version": None, "skeleton": {}, "n_tensors": 0, "logical_bytes": 0, "new_bytes": 0, "stored_bytes": 0,
          "stall_s": 0.0, "wait_s": 0.0, "persist_s": 0.0, "nonfinite": 0}
STATS = {"numel": 1, "mean": None, "std": None, "min": None, "max": None, "l2_norm": None, "abs_max": None,
         "nan_count": 0, "inf_count": 0}


def _hex(i: int) -> str:
    return f"{i:064x}"


def _tid(chunks: list[int]) -> str:
    return "-".join(map(str, chunks)).rjust(64, "0")


def _record(engine: Engine, commit: int, tensors: dict[str, list[int]], new_chunks: list[int], *,
            parent: catalog.CommitLayout | None = None, bases: dict[int, int] | None = None) -> catalog.CommitLayout:
    """Record commit ``_hex(commit)`` whose entry ``name`` is a tensor made of the chunks listed
    (tensor id ``_tid(chunks)``), writing ``new_chunks`` (chunk ``x``: ``_hex(x)``, a delta against
    ``bases[x]`` if there) into pack ``_hex(9000 + commit)``."""
    bases = bases or {}
    pack = _hex(9000 + commit)
    rows = [TensorRow(tensor_id=_tid(c), dtype="uint8", shape=[len(c)], nbytes=len(c), chunk_size=1,
                      chunk_ids=[_hex(x) for x in c], stats=STATS)
            for c in tensors.values()]
    with write_transaction(session_factory(engine)) as s:
        return catalog.record_commit(
            s, packs=[catalog.PackRow(pack, 10, len(new_chunks))],
            chunks=[ChunkLocation(_hex(x), pack, x, 1, 1, 0, 1 if x in bases else 0,
                                     _hex(bases[x]) if x in bases else None) for x in new_chunks],
            tensors=rows, commit={"id": _hex(commit), "created_at": NOW, **COMMIT},
            entries={name: _tid(c) for name, c in tensors.items()},
            edges=[catalog.EdgeRow(parent.commit_id, "parent", 0)] if parent is not None else [],
            metrics={}, now=NOW, parent=parent)


def _layout(engine: Engine) -> dict[str, list[str]]:
    """Every tensor's chunk ids, read through the keys: {tensor id: [chunk id, ...]}."""
    with session_factory(engine)() as s:
        rows = s.execute(select(Tensor.id, TensorChunk.seq, Chunk.id)
                         .join(TensorChunk, TensorChunk.tensor_key == Tensor.key)
                         .join(Chunk, Chunk.key == TensorChunk.chunk_key)
                         .order_by(Tensor.id, TensorChunk.seq)).all()
    out: dict[str, list[str]] = {}
    for tid, _, cid in rows:
        out.setdefault(tid, []).append(cid)
    return out


def test_keys_increase_and_are_never_given_again(engine: Engine) -> None:
    with write_transaction(session_factory(engine)) as s:
        first = catalog.allocate_keys(s, "chunks", 3)
        assert first == sorted(first) and len(set(first)) == 3
        assert catalog.allocate_keys(s, "chunks", 0) == []
    _record(engine, 1, {"a": [1, 2]}, [1, 2])
    with session_factory(engine)() as s:
        top = max(s.scalars(select(Chunk.key)))
    with write_transaction(session_factory(engine)) as s:  # the newest chunk row goes (as gc deletes)
        s.execute(delete(TensorChunk))
        s.execute(delete(Chunk).where(Chunk.key == top))
    with write_transaction(session_factory(engine)) as s:
        assert min(catalog.allocate_keys(s, "chunks", 2)) > top


def test_record_commit_uses_stored_rows_keys(engine: Engine) -> None:
    """A commit that meets chunks and tensors already stored (without a parent's layout to name
    them, as when a concurrent commit inserted them) refers to the stored rows: one row per id,
    stored rows unchanged, every chunk list read back through the keys as committed."""
    _record(engine, 1, {"a": [1, 2], "b": [3]}, [1, 2, 3])
    # Chunks 2 and 3 and tensor [3] are stored already; written again into another pack here.
    two = _record(engine, 2, {"a": [2, 4], "b": [3]}, [2, 3, 4, 5], bases={5: 4})
    three = _record(engine, 3, {"c": [5, 1], "b": [3]}, [], parent=two)
    with session_factory(engine)() as s:
        assert s.scalar(select(Chunk.pack_id).where(Chunk.id == _hex(2))) == _hex(9001)  # kept as it was
        ids = list(s.scalars(select(Chunk.id)))
        assert sorted(ids) == [_hex(x) for x in range(1, 6)]
        assert len(list(s.scalars(select(Tensor.id)))) == 4
        base = s.scalar(select(Chunk.base_key).where(Chunk.id == _hex(5)))
        assert base == s.scalar(select(Chunk.key).where(Chunk.id == _hex(4)))
        entries = {cid: dict(s.execute(select(Entry.name, Tensor.id).join(Tensor, Tensor.key == Entry.tensor_key)
                                       .where(Entry.commit_id == _hex(cid))).all()) for cid in (2, 3)}
    assert entries == {2: {"a": _tid([2, 4]), "b": _tid([3])}, 3: {"c": _tid([5, 1]), "b": _tid([3])}}
    assert _layout(engine) == {_tid(c): [_hex(x) for x in c] for c in ([1, 2], [3], [2, 4], [5, 1])}
    assert three.chunk_lists == {_tid([5, 1]): [_hex(5), _hex(1)], _tid([3]): [_hex(3)]}
    with session_factory(engine)() as s:
        stored = dict(s.execute(select(Tensor.id, Tensor.key)).all())
        chunk_keys = dict(s.execute(select(Chunk.id, Chunk.key)).all())
    assert three.tensor_keys == {t: stored[t] for t in (_tid([5, 1]), _tid([3]))}
    assert three.chunk_keys == {_hex(x): chunk_keys[_hex(x)] for x in (5, 1, 3)}
    # Stored tensors met again without a parent's layout are found by (first chunk's key, id),
    # a tensor without chunks by (0, id): no second row for either.
    four = _record(engine, 4, {"x": [1, 2], "e": []}, [])
    five = _record(engine, 5, {"y": [1, 2], "e": []}, [])
    with session_factory(engine)() as s:
        rows = s.execute(select(Tensor.id, Tensor.key, Tensor.lead_key)).all()
    assert len(rows) == 5 and {tid: lead for tid, _, lead in rows}[_tid([])] == 0
    assert {tid: lead for tid, _, lead in rows}[_tid([1, 2])] == chunk_keys[_hex(1)]
    assert four.tensor_keys == five.tensor_keys == {tid: key for tid, key, _ in rows if tid in (_tid([1, 2]), _tid([]))}


def test_record_commit_refuses_rows_gone_since_looked_up(engine: Engine) -> None:
    """Sharing a tensor or chunk that is no longer stored (a gc elsewhere removed it) is refused
    as a concurrent change, and nothing of the commit is stored."""
    _record(engine, 1, {"a": [1]}, [1])
    with write_transaction(session_factory(engine)) as s:
        s.execute(delete(Entry))
        s.execute(delete(TensorChunk))
        s.execute(delete(Tensor))
        s.execute(delete(Chunk))
    with pytest.raises(ConcurrentChange):
        _record(engine, 2, {"b": [1, 7]}, [7])
    with pytest.raises(ConcurrentChange):
        _record(engine, 3, {"a": [1]}, [])
    with session_factory(engine)() as s:
        assert list(s.scalars(select(Chunk.id))) == []


def test_tensor_keys_of_matches_pairs_through_the_lead_key_index(engine: Engine) -> None:
    """Tensors are found by (lead key, id): another version of a tensor with the same first chunk
    is not taken for it, an id under the wrong lead key is not found, and on SQLite the lookup
    reads an index range per lead key, never the whole index (a row-value IN of the pairs did)."""
    _record(engine, 1, {"a": [1, 2], "b": [1, 3], "c": [4]}, [1, 2, 3, 4])
    with session_factory(engine)() as s:
        keys = dict(s.execute(select(Chunk.id, Chunk.key)).all())
        stored = dict(s.execute(select(Tensor.id, Tensor.key)).all())
        lead = keys[_hex(1)]
        found = catalog.tensor_keys_of(s, {_tid([1, 3]): lead, _tid([4]): lead, _tid([9]): keys[_hex(4)]})
        assert found == {_tid([1, 3]): stored[_tid([1, 3])]}
        assert catalog.tensor_keys_of(s, {}) == {}
        if engine.dialect.name == "sqlite":
            query = catalog._TENSORS_BY_LEAD.params(leads=[lead, keys[_hex(4)]])
            sql = str(query.compile(engine, compile_kwargs={"literal_binds": True}))
            plan = s.connection().exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}").fetchall()
            steps = " ".join(str(row[-1]) for row in plan)
            assert "SEARCH" in steps and "SCAN" not in steps, steps


def test_tensors_of_gives_back_the_rows_recorded_with_their_chunk_locations(engine: Engine) -> None:
    """``tensors_of``: each entry's row as it was recorded and its chunks' locations in order; two
    entries of one tensor share one row; only the names asked for; a tensor whose chunk list gc
    dropped comes without chunk ids."""
    _record(engine, 1, {"a": [2, 1], "b": [3], "c": [3]}, [1, 2, 3])
    with session_factory(engine)() as s:
        items = catalog.tensors_of(s, _hex(1))
        assert list(items) == ["a", "b", "c"]
        row, chunks = items["a"]
        assert row == TensorRow(tensor_id=_tid([2, 1]), dtype="uint8", shape=[2], nbytes=2, chunk_size=1,
                                chunk_ids=[_hex(2), _hex(1)], stats=STATS)
        assert [(c.chunk_id, c.pack_id, c.offset) for c in chunks] == [(_hex(x), _hex(9001), x) for x in (2, 1)]
        assert items["b"] is items["c"]
        assert list(catalog.tensors_of(s, _hex(1), ["c", "none"])) == ["c"]
    with write_transaction(session_factory(engine)) as s:
        catalog.drop_chunk_lists(s, [s.scalar(select(Tensor.key).where(Tensor.id == _tid([3])))])
    with session_factory(engine)() as s:
        row, chunks = catalog.tensors_of(s, _hex(1))["b"]
    assert (row.tensor_id, row.nbytes, row.chunk_ids, chunks) == (_tid([3]), 1, [], [])
