"""Schema 0010 (integer keys of chunks and tensors): its upgrade and downgrade keep every
row's meaning, on SQLite and PostgreSQL, and a repository committed to before it works after."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import ckptrepo
from ckptrepo.db import migrate
from ckptrepo.db.engine import make_engine

# The catalog's content by ids, in the schema before 0010 and at 0010.
_BEFORE = {
    "chunks": "SELECT id, pack_id, \"offset\", length, raw_length, encoding, depth, base_id, alone_length FROM chunks",
    "tensors": "SELECT id, dtype, nbytes, chunk_size, n_chunks, numel, mean, nan_count FROM tensors",
    "tensor_chunks": "SELECT tensor_id, seq, chunk_id FROM tensor_chunks",
    "entries": "SELECT commit_id, name, tensor_id FROM entries",
    "entry_runs": "SELECT name, line_id, fp_depth, tensor_id, changed_chunks FROM entry_runs",
}
_AFTER = {
    "chunks": "SELECT c.id, c.pack_id, c.\"offset\", c.length, c.raw_length, c.encoding, c.depth, b.id, "
              "c.alone_length FROM chunks c LEFT JOIN chunks b ON b.key = c.base_key",
    "tensors": "SELECT id, dtype, nbytes, chunk_size, n_chunks, numel, mean, nan_count FROM tensors",
    "tensor_chunks": "SELECT t.id, tc.seq, c.id FROM tensor_chunks tc JOIN tensors t ON t.key = tc.tensor_key "
                     "JOIN chunks c ON c.key = tc.chunk_key",
    "entries": "SELECT e.commit_id, e.name, t.id FROM entries e JOIN tensors t ON t.key = e.tensor_key",
    "entry_runs": "SELECT r.name, r.line_id, r.fp_depth, t.id, r.changed_chunks FROM entry_runs r "
                  "LEFT JOIN tensors t ON t.key = r.tensor_key",
}


def _content(db_url: str, queries: dict[str, str]) -> dict[str, set[tuple[Any, ...]]]:
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            return {table: {tuple(row) for row in conn.exec_driver_sql(q)} for table, q in queries.items()}
    finally:
        engine.dispose()


def _migrate(db_url: str, revision: str) -> None:
    engine = make_engine(db_url)
    try:
        if revision == "head":
            migrate.upgrade(engine)
        else:
            migrate.downgrade(engine, revision)
    finally:
        engine.dispose()


def test_integer_keys_migration_keeps_the_catalog(tmp_path: Path, db_url: str) -> None:
    path = tmp_path / "repo"
    torch.manual_seed(0)
    w = torch.randn(6000)
    states = []
    with ckptrepo.Repo.init(path, db_url=db_url, chunk_size=4096) as repo:
        for i in range(4):  # delta chunks against the previous commit's; "b" added, "a" removed
            w = w + 1e-3 * torch.randn(6000)
            state = {"w": w.clone(), "step": torch.tensor(i)}
            if i < 3:
                state["a"] = torch.ones(3)
            if i:
                state["b"] = torch.full((5,), float(i))
            states.append(state)
            repo.commit(state, branch="main", step=i, blocking=True).wait()
        repo.branch("fork", "main~2")
        repo.commit({"w": w * 2, "a": torch.ones(3)}, branch="fork", blocking=True).wait()
        ids = [c.id for c in reversed(repo.log("main"))]
    after = _content(db_url, _AFTER)
    assert any(row[7] is not None for row in after["chunks"])  # deltas, whose bases the keys name
    assert any(row[3] is None for row in after["entry_runs"])  # a removed name
    _migrate(db_url, "0008")
    assert _content(db_url, _BEFORE) == after
    _migrate(db_url, "head")
    assert _content(db_url, _AFTER) == after
    with ckptrepo.Repo.open(path) as repo:
        assert repo.verify(full=True).ok
        for cid, state in zip(ids, states, strict=True):
            back = repo.checkout(cid)
            assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)
        # New rows take keys above the copied ones; a new delta names a base copied by the migration.
        head = repo.commit({"w": w + 1e-3, "step": torch.tensor(9)}, branch="main", blocking=True).wait()
        assert torch.equal(repo.checkout(head.id)["w"], w + 1e-3)
        assert repo.verify(full=True).ok
        assert len(repo.history("w", along="main")) == 5
