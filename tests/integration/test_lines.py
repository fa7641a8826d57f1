"""First-parent lines (``ckptrepo.db.lines``): placement, the migration that fills them in,
and concurrent children of one parent, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest
import torch
from sqlalchemy import select

import ckptrepo
from ckptrepo.db import lines, migrate
from ckptrepo.db.engine import fetch_tuples, make_engine, session_factory, write_transaction
from ckptrepo.db.models import Commit

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_assign_all_continues_the_first_child() -> None:
    #   r - a - b - c        (main)
    #        \- x - y        (fork of a, after b)
    #            \- z        (fork of x, after y)
    #   q                    (a second root)
    commits = [("r", None), ("a", "r"), ("b", "a"), ("x", "a"), ("c", "b"), ("y", "x"), ("z", "x"), ("q", None)]
    placed = lines.assign_all(commits)
    assert placed == {"r": ("r", 0), "a": ("r", 1), "b": ("r", 2), "c": ("r", 3), "x": ("x", 2), "y": ("x", 3),
                      "z": ("z", 3), "q": ("q", 0)}
    # Commits placed earlier count: a new child of ``b`` starts a line, one of ``c`` continues.
    more = lines.assign_all([("d", "b"), ("e", "c"), ("f", "missing")], known=placed)
    assert more == {"d": ("d", 3), "e": ("r", 4), "f": ("f", 0)}


def _placements(repo: ckptrepo.Repo) -> dict[str, tuple[str, int]]:
    with repo._sessions() as s:
        rows = s.execute(select(Commit.id, Commit.line_id, Commit.fp_depth))
        return {cid: (line, depth) for cid, line, depth in rows}


def test_commits_are_placed_and_the_migration_places_them_alike(tmp_path: Path, db_url: str) -> None:
    path = tmp_path / "repo"
    with ckptrepo.Repo.init(path, db_url=db_url) as repo:
        for i in range(4):
            repo.commit({"w": torch.full((4,), float(i))}, branch="main", step=i, blocking=True).wait()
        repo.branch("fork", "main~2")
        for i in range(3):
            repo.commit({"w": torch.full((4,), 10.0 + i)}, branch="fork", step=10 + i, blocking=True).wait()
        repo.branch("fork2", "fork~1")
        repo.commit({"w": torch.full((4,), 20.0)}, branch="fork2", step=20, blocking=True).wait()
        repo.commit({"v": torch.ones(2)}, branch="other", step=0, blocking=True).wait()  # a second root
        placed = _placements(repo)
        main, fork, fork2, other = (repo.resolve(b) for b in ("main", "fork", "fork2", "other"))
        assert placed[main] == (repo.resolve("main~3"), 3)
        assert placed[fork] == (repo.resolve("fork~2"), 4)  # forked at depth 1: its first commit is at 2
        assert placed[fork2] == (fork2, 4) and placed[other] == (other, 0)
        chains = {b: [c.id for c in repo.log(b)] for b in ("main", "fork", "fork2")}
        with repo._sessions() as s:
            for b, expected in chains.items():
                rows = sorted(fetch_tuples(s.connection(), lines.chain_commits(repo.resolve(b), None, Commit.id)))
                assert [cid for _, cid in rows] == expected, b
    engine = make_engine(db_url)
    try:
        migrate.downgrade(engine, "0006")
        with session_factory(engine)() as s:
            assert "line_id" not in {c["name"] for c in s.connection().dialect.get_columns(s.connection(), "commits")}
        migrate.upgrade(engine)
    finally:
        engine.dispose()
    with ckptrepo.Repo.open(path) as repo:
        assert _placements(repo) == placed


def test_children_of_one_parent_committed_at_once_take_turns(tmp_path: Path, db_url: str) -> None:
    """Two transactions each place a child of the same parent: the second waits for the first
    (PostgreSQL's row lock; SQLite's single writer) and starts a line of its own."""
    with ckptrepo.Repo.init(tmp_path / "repo", db_url=db_url) as repo:
        root = repo.commit({"w": torch.zeros(2)}, branch="main", blocking=True).wait().id
        first_placed, release = threading.Event(), threading.Event()
        results: dict[str, tuple[str, int]] = {}

        def child(cid: str, hold: bool) -> None:
            with write_transaction(repo._sessions) as s:
                results[cid] = lines.place(s, cid, root)
                s.add(Commit(id=cid, created_at=T0, generation=2, first_parent_id=root, skeleton={},
                             line_id=results[cid][0], fp_depth=results[cid][1]))
                s.flush()
                if hold:
                    first_placed.set()
                    assert release.wait(30)

        a, b = "a" * 64, "b" * 64
        holder = threading.Thread(target=child, args=(a, True))
        holder.start()
        assert first_placed.wait(30)
        second = threading.Thread(target=child, args=(b, False))
        second.start()
        second.join(0.5)
        assert second.is_alive()  # waiting for the first transaction
        release.set()
        holder.join(30)
        second.join(30)
        assert results == {a: (root, 1), b: (b, 1)}


@pytest.mark.parametrize("limit", [None, 1, 3, 6, 50])
def test_chain_commits_cut_short(tmp_path: Path, limit: int | None) -> None:
    with ckptrepo.Repo.init(tmp_path / "repo") as repo:
        for i in range(4):
            repo.commit({"w": torch.full((4,), float(i))}, branch="main", step=i, blocking=True).wait()
        repo.branch("fork", "main~2")
        for i in range(3):
            repo.commit({"w": torch.full((4,), 10.0 + i)}, branch="fork", step=10 + i, blocking=True).wait()
        expected = [c.id for c in repo.log("fork")]
        with repo._sessions() as s:
            rows = sorted(fetch_tuples(s.connection(), lines.chain_commits(repo.resolve("fork"), limit, Commit.id)))
        assert rows == list(enumerate(expected[:limit]))
