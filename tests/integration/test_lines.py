"""First-parent lines (``ckptrepo.db.lines``): placement, the migration that fills them in,
and concurrent children of one parent, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest
import torch
from sqlalchemy import delete, select

import ckptrepo
from ckptrepo.db import lines, migrate
from ckptrepo.db.engine import fetch_tuples, make_engine, session_factory, write_transaction
from ckptrepo.db.models import Commit, Edge, Entry, EntryRun, Ref, Tensor
from ckptrepo.lineage import graph
from ckptrepo.testing import parts

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_assign_all_continues_the_first_child() -> None:
    #   r - a - b - c        (main)
    #        \- x - y        (fork of a, after b)
    #            \- z        (fork of x, after y; merges c)
    #   q                    (a second root)
    commits = [("r", None, False), ("a", "r", False), ("b", "a", False), ("x", "a", False), ("c", "b", False),
               ("y", "x", False), ("z", "x", True), ("q", None, False)]
    placed = {cid: tuple(p) for cid, p in lines.assign_all(commits).items()}
    assert placed == {"r": ("r", 0, True), "a": ("r", 1, True), "b": ("r", 2, True), "c": ("r", 3, True),
                      "x": ("x", 2, True), "y": ("x", 3, True), "z": ("z", 3, False), "q": ("q", 0, True)}
    # Commits placed earlier count: a new child of ``b`` starts a line, one of ``c`` continues;
    # below a merge nothing is linear, nor below a parent that is not known.
    known = lines.assign_all(commits)
    more = lines.assign_all([("d", "b", False), ("e", "c", False), ("f", "z", False), ("g", "missing", False),
                             ("h", None, True)], known=known)
    assert {cid: tuple(p) for cid, p in more.items()} == {
        "d": ("d", 3, True), "e": ("r", 4, True), "f": ("z", 4, False), "g": ("g", 0, False), "h": ("h", 0, False)}


def _first_parents(repo: ckptrepo.Repo, head: str) -> list[str]:
    chain = [head]
    while (up := repo.get_commit(chain[-1]).parents) and up[0].kind == "parent":
        chain.append(up[0].id)
    return chain


def _placements(repo: ckptrepo.Repo) -> dict[str, tuple[str, int, bool]]:
    with parts(repo).sessions() as s:
        rows = s.execute(select(Commit.id, Commit.line_id, Commit.fp_depth, Commit.linear))
        return {cid: (line, depth, linear) for cid, line, depth, linear in rows}


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
        assert placed[main] == (repo.resolve("main~3"), 3, True)
        assert placed[fork] == (repo.resolve("fork~2"), 4, True)  # forked at depth 1: its first commit is at 2
        assert placed[fork2] == (fork2, 4, True) and placed[other] == (other, 0, True)
        merged = repo.commit({"w": torch.zeros(4)}, branch="main", parents=[main, fork], blocking=True).wait().id
        after = repo.commit({"w": torch.ones(4)}, branch="main", blocking=True).wait().id
        moved = repo.commit({"w": torch.ones(4)}, branch="moved", transfer_from=fork2, blocking=True).wait().id
        placed = _placements(repo)
        assert placed[merged] == (placed[main][0], 4, False) and placed[after] == (placed[main][0], 5, False)
        assert placed[moved] == (moved, 0, False)
        chains = {b: _first_parents(repo, repo.resolve(b)) for b in ("main", "fork", "fork2", "moved")}
        with parts(repo).sessions() as s:
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
            with write_transaction(parts(repo).sessions) as s:
                results[cid] = lines.place(s, cid, root, False)
                s.add(Commit(id=cid, created_at=T0, generation=2, first_parent_id=root, skeleton={},
                             **results[cid]._asdict()))
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
        assert results == {a: (root, 1, True), b: (b, 1, True)}


@pytest.mark.parametrize("limit", [None, 1, 3, 6, 50])
def test_chain_commits_cut_short(tmp_path: Path, limit: int | None) -> None:
    with ckptrepo.Repo.init(tmp_path / "repo") as repo:
        for i in range(4):
            repo.commit({"w": torch.full((4,), float(i))}, branch="main", step=i, blocking=True).wait()
        repo.branch("fork", "main~2")
        for i in range(3):
            repo.commit({"w": torch.full((4,), 10.0 + i)}, branch="fork", step=10 + i, blocking=True).wait()
        expected = _first_parents(repo, repo.resolve("fork"))
        with parts(repo).sessions() as s:
            rows = sorted(fetch_tuples(s.connection(), lines.chain_commits(repo.resolve("fork"), limit, Commit.id)))
        assert rows == list(enumerate(expected[:limit]))


def test_linear_commits_answer_ancestors_and_log_from_the_chain(tmp_path: Path, db_url: str) -> None:
    with ckptrepo.Repo.init(tmp_path / "repo", db_url=db_url) as repo:
        for i in range(6):
            repo.commit({"w": torch.full((4,), float(i))}, branch="main", step=i, metrics={"loss": 6.0 - i},
                        blocking=True).wait()
        repo.branch("fork", "main~3")
        for i in range(2):
            repo.commit({"w": torch.full((4,), 10.0 + i)}, branch="fork", step=10 + i, blocking=True).wait()
        merged = repo.commit({"w": torch.zeros(4)}, branch="main", parents=[repo.resolve("main"),
                             repo.resolve("fork")], step=20, blocking=True).wait().id
        with parts(repo).sessions() as s:
            for rev in ("fork", "main~1", merged):
                start = repo.resolve(rev)
                assert graph._is_linear(s, start) == (start != merged)
                walked = graph._nearest_first(s, start, graph.EDGE_KINDS, None, down=True)  # the edge walk
                assert graph.ancestor_ids(s, start) == walked
                for depth in (1, 2, 50):
                    assert graph.ancestor_ids(s, start, max_depth=depth) == graph._nearest_first(
                        s, start, graph.EDGE_KINDS, depth, down=True)
                assert graph.ancestor_ids(s, start, ("merge", "transfer")) == graph._nearest_first(
                    s, start, ("merge", "transfer"), None, down=True)
        for rev in ("fork", "main~1", merged):
            full = [c.id for c in repo.log(rev)]
            assert len(full) == len(set(full)) and full[0] == repo.resolve(rev)
            assert set(full[1:]) == set(repo.ancestors(rev))
            times = [repo.get_commit(cid).created_at for cid in full]
            assert times == sorted(times, reverse=True)
            for limit, offset in ((1, 0), (3, 2), (50, 0)):
                assert [c.id for c in repo.log(rev, limit=limit, offset=offset)] == full[offset : offset + limit]
            low = [c.id for c in repo.log(rev, where="loss < 3.5")]
            assert low == [cid for cid in full if (repo.get_commit(cid).metrics or {}).get("loss", 9) < 3.5]
            assert [c.id for c in repo.log(rev, where="loss < 3.5", limit=1, offset=1)] == low[1:2]


_Forks = set[tuple[str, str, str | None, int | None]]
_Runs = set[tuple[str, str, int, str | None, int]]


def _line_rows(repo: ckptrepo.Repo) -> tuple[_Forks, _Runs]:
    """Every edge's fork mark ``(child, parent, fork_line_id, fork_depth)`` and every ``entry_runs`` row,
    its tensor by id (keys are renumbered when a migration rebuilds the tables)."""
    with parts(repo).sessions() as s:
        conn = s.connection()
        forks = set(fetch_tuples(conn, select(Edge.child_id, Edge.parent_id, Edge.fork_line_id, Edge.fork_depth)))
        runs = set(fetch_tuples(conn, select(EntryRun.name, EntryRun.line_id, EntryRun.fp_depth, Tensor.id,
                                             EntryRun.changed_chunks)
                                .outerjoin(Tensor, Tensor.key == EntryRun.tensor_key)))
    return forks, runs


def test_rows_kept_by_line_are_written_with_commits_and_by_the_migration_alike(tmp_path: Path, db_url: str) -> None:
    """``edges.fork_line_id``/``fork_depth`` and ``entry_runs``: as ``catalog.record_commit`` writes
    them, as migration 0008 derives them, what they say (each commit's tensors, read back from the
    runs of its line), and the runs going with their commits."""
    path = tmp_path / "repo"
    with ckptrepo.Repo.init(path, db_url=db_url, chunk_size=4096) as repo:
        for i in range(4):  # "b" appears at 1, changes at 2; "a" goes away at 3; "w" (4 chunks) changes at 2
            w = torch.zeros(4096)
            w[:1024] = float(i // 2)
            state = {"w": w}
            if i < 3:
                state["a"] = torch.ones(2)
            if i:
                state["b"] = torch.full((3,), float(i))
            repo.commit(state, branch="main", step=i, blocking=True).wait()
        repo.branch("fork", "main~2")
        for i in range(2):
            repo.commit({"w": torch.full((4096,), 10.0 + i), "a": torch.ones(2)}, branch="fork", blocking=True).wait()
        main, fork = repo.resolve("main"), repo.resolve("fork")
        repo.commit({"w": torch.zeros(4)}, branch="main", parents=[main, fork], blocking=True).wait()
        repo.commit({"w": torch.ones(4)}, branch="moved", transfer_from=fork, blocking=True).wait()
        forks, runs = _line_rows(repo)
        with parts(repo).sessions() as s:
            places = {cid: (line, depth) for cid, line, depth in s.execute(select(Commit.id, Commit.line_id,
                                                                                  Commit.fp_depth))}
            kinds = {(c, p): (k, pos) for c, p, k, pos in s.execute(select(Edge.child_id, Edge.parent_id, Edge.kind,
                                                                             Edge.position))}
            entries = {cid: dict(s.execute(select(Entry.name, Tensor.id).join(Tensor, Tensor.key == Entry.tensor_key)
                                           .where(Entry.commit_id == cid)).all())
                       for cid in places}
        # An edge along which its child continues the parent's line has no mark; every other
        # edge carries the parent's place. Here: the fork's first commit, the merge's second
        # parent, and the transfer.
        assert {(c, p): (line, depth) for c, p, line, depth in forks} == {
            (c, p): (None, None) if lines.fork_of(*kinds[c, p], places[c], places[p]) is None else places[p]
            for c, p, _, _ in forks}
        assert sum(1 for *_, line, _ in forks if line is not None) == 3
        # Each commit's tensors are the newest run at or below its depth on its line.
        for cid, (line, depth) in places.items():
            newest: dict[str, tuple[int, str | None]] = {}
            for name, run_line, run_depth, tid, _ in runs:
                if run_line == line and run_depth <= depth and run_depth >= newest.get(name, (-1, None))[0]:
                    newest[name] = (run_depth, tid)
            assert {n: t for n, (_, t) in newest.items() if t is not None} == entries[cid], cid
        assert any(tid is None for *_, tid, _ in runs)  # "a" went away on main
        # Chunk positions that differ from the first parent's tensor: "w" at 2 (its first chunk
        # only), "b" at 2 (one chunk), the fork's first commit (every chunk of "w").
        with parts(repo).sessions() as s:
            head_w = s.scalar(select(Tensor.id).join(Entry, Entry.tensor_key == Tensor.key)
                              .where(Entry.commit_id == main, Entry.name == "w"))
        assert {(n, c) for n, _, _, tid, c in runs if c} == {("w", 1), ("b", 1), ("w", 4)}
        assert ("w", places[main][0], 2, head_w, 1) in runs
    engine = make_engine(db_url)
    try:
        migrate.downgrade(engine, "0009")
        with session_factory(engine)() as s:
            columns = s.connection().dialect.get_columns(s.connection(), "edges")
            assert "fork_line_id" not in {c["name"] for c in columns}
        migrate.upgrade(engine)
    finally:
        engine.dispose()
    with ckptrepo.Repo.open(path) as repo:
        assert _line_rows(repo) == (forks, runs)
        # Runs go with their commit: delete the fork's head (as gc would) and its runs are gone.
        with write_transaction(parts(repo).sessions) as s:
            s.execute(delete(Edge).where(Edge.child_id.in_([repo.resolve("moved"), fork, repo.resolve("main")])))
            s.execute(delete(Entry).where(Entry.commit_id == fork))
            s.execute(delete(Ref).where(Ref.commit_id == fork))
            s.execute(delete(Commit).where(Commit.id == fork))
        left = _line_rows(repo)[1]
        assert left == {r for r in runs if (r[1], r[2]) != places[fork]} != runs
