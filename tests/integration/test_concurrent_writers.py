"""Several processes committing to one repository at once: every commit lands.

Four writer processes, two on each of two branches, commit without naming parents, so each
commit lands on its branch's head as of its transaction (``CommitWriter.record`` retries the
compare-and-swap), while a fifth runs ``gc`` (default grace period) and ``verify`` in a loop
(or ``prune(keep_last=2)``, ``gc`` and ``verify``); on SQLite and PostgreSQL. Every commit comes
back, each branch is one first-parent line holding all its commits, and every commit restores
bit-exactly (but those pruned, which refuse with CommitPruned).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptrepo

WRITERS = 4
COMMITS = 8


def tensor_of(writer: int, i: int) -> torch.Tensor:
    return torch.full((256,), float(writer * 100 + i))


def writer_main(path: str, writer: int, out: str) -> None:
    torch.set_num_threads(1)
    branch = f"b{writer % 2}"
    with ckptrepo.Repo.open(path) as repo:
        handles = [repo.commit({"w": tensor_of(writer, i)}, branch=branch, step=writer * 100 + i,
                               message=f"writer {writer} commit {i}") for i in range(COMMITS)]
        ids = [h.wait().id for h in handles]  # raises if any failed
    Path(out).write_text("\n".join(ids))


def upkeep_main(path: str, stop: str, out: str) -> None:
    runs = 0
    with ckptrepo.Repo.open(path) as repo:
        while not Path(stop).exists():
            repo.gc()
            assert repo.verify().ok
            runs += 1
    Path(out).write_text(str(runs))


def pruning_main(path: str, stop: str, out: str) -> None:
    runs = pruned = 0
    with ckptrepo.Repo.open(path) as repo:
        while not Path(stop).exists():
            pruned += len(repo.prune(keep_last=2).pruned)
            repo.gc()
            assert repo.verify().ok
            runs += 1
    Path(out).write_text(f"{runs} {pruned}")


def _run_beside(path: Path, db_url: str, upkeep_main: Any, runs: Path) -> ckptrepo.Commit:
    """A repository at ``path`` with a root commit and branches b0, b1 at it; the writers
    (ids in ``ids-W.txt`` beside ``path``) run to their end beside ``upkeep_main`` (which
    writes ``runs``). Returns the root commit."""
    with ckptrepo.Repo.init(path, db_url=db_url) as repo:
        root = repo.commit({"w": torch.zeros(256)}, blocking=True).wait()
        repo.branch("b0", root.id)
        repo.branch("b1", root.id)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=writer_main, args=(str(path), w, str(path.parent / f"ids-{w}.txt")))
             for w in range(WRITERS)]
    stop = path.parent / "stop"
    upkeep = ctx.Process(target=upkeep_main, args=(str(path), str(stop), str(runs)))
    upkeep.start()
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0, f"writer exited with {p.exitcode}"
    stop.touch()
    upkeep.join(timeout=120)
    assert upkeep.exitcode == 0
    return root


def _lines_hold_every_commit(repo: ckptrepo.Repo, root: str) -> dict[int, list[ckptrepo.Commit]]:
    """Each branch's first-parent line (by branch number), checked to hold all its writers'
    commits and the root."""
    lines = {}
    for b in range(2):
        line = [repo.get_commit(f"b{b}")]  # its first-parent line, walked from the head
        while line[-1].parent_ids:
            assert len(line[-1].parent_ids) == 1
            line.append(repo.get_commit(line[-1].parent_ids[0]))
        ours = [w for w in range(WRITERS) if w % 2 == b]
        assert line[-1].id == root and len(line) == 1 + COMMITS * len(ours)  # all of them, and the root
        lines[b] = line
    return lines


def test_four_writers_beside_a_process_that_prunes_all_land(tmp_path: Path, db_url: str) -> None:
    path = tmp_path / "repo"
    root = _run_beside(path, db_url, pruning_main, tmp_path / "runs")
    runs, pruned = (int(x) for x in (tmp_path / "runs").read_text().split())
    print(f"prune + gc + verify runs beside the writers: {runs}, commits pruned by them: {pruned}")
    assert runs >= 1
    with ckptrepo.Repo.open(path) as repo:
        repo.prune(keep_last=2)  # once more, after the last commit
        repo.gc(grace=0)
        line = {c.id: c for commits in _lines_hold_every_commit(repo, root.id).values() for c in commits}
        heads = {repo.get_commit(f"b{b}").id for b in range(2)}
        # All but each branch's 2 newest (the root, where both branches leave, is kept too).
        assert sum(c.pruned for c in line.values()) == 2 * (2 * COMMITS - 2)
        for w in range(WRITERS):
            ids = (tmp_path / f"ids-{w}.txt").read_text().split()
            assert len(ids) == COMMITS and set(ids) <= set(line)
            for i, cid in enumerate(ids):
                if line[cid].pruned:
                    assert cid not in heads
                    with pytest.raises(ckptrepo.errors.CommitPruned):
                        repo.checkout(cid)
                else:
                    assert torch.equal(repo.checkout(cid)["w"], tensor_of(w, i))
        assert not [r for r in repo.branches() if r.name.startswith("conflicts/")]
        report = repo.verify(full=True)
        assert report.ok and not report.warnings, report.to_json()
        before = _lineage(repo)
    # The store alone gives the same repository back: the writers' branch moves, made by
    # compare-and-swap with retries, replay to the same lines; the prunes to the same marks.
    _lose_database(path, db_url)
    rebuilt = ckptrepo.Repo.rebuild_database(path)
    assert not rebuilt.skipped and rebuilt.conflicts == 0
    with ckptrepo.Repo.open(path) as repo:
        assert _lineage(repo) == before
        assert repo.verify(full=True).ok


def _lineage(repo: ckptrepo.Repo) -> tuple[Any, ...]:
    return ([(c.id, c.parent_ids, c.pruned, sorted(c.refs)) for c in repo.log()],
            [(b.name, b.commit_id) for b in repo.branches()])


def _lose_database(path: Path, db_url: str) -> None:
    from ckptrepo.db import migrate
    from ckptrepo.db.engine import make_engine

    engine = make_engine(db_url)
    with engine.begin() as conn:
        migrate.drop_schema(conn)
    engine.dispose()


def test_four_writers_on_two_branches_all_land(tmp_path: Path, db_url: str) -> None:
    path = tmp_path / "repo"
    root = _run_beside(path, db_url, upkeep_main, tmp_path / "gc-runs")
    assert int((tmp_path / "gc-runs").read_text()) >= 1
    with ckptrepo.Repo.open(path) as repo:
        for b, line in _lines_hold_every_commit(repo, root.id).items():
            for w in (w for w in range(WRITERS) if w % 2 == b):
                ids = (tmp_path / f"ids-{w}.txt").read_text().split()
                assert len(ids) == COMMITS and set(ids) <= {c.id for c in line}
                for i, cid in enumerate(ids):
                    assert torch.equal(repo.checkout(cid)["w"], tensor_of(w, i))
        assert not [r for r in repo.branches() if r.name.startswith("conflicts/")]
        assert repo.verify(full=True).ok


def init_main(path: str, out: str, start: Any, db_url: str | None = None) -> None:
    start.wait()  # every process imported and ready: the creates race
    try:
        ckptrepo.Repo.init(path, db_url=db_url).close()
        Path(out).write_text("created")
    except ckptrepo.errors.RepositoryExists:
        Path(out).write_text("exists")


def test_processes_creating_one_repository_at_once_make_one(tmp_path: Path) -> None:
    """Six processes run Repo.init on one path at once: one creates it, the others get
    RepositoryExists, and what is there is a whole repository (no half-built folder left)."""
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(6)
    procs = [ctx.Process(target=init_main, args=(str(tmp_path / "run"), str(tmp_path / f"init-{i}.txt"), start))
             for i in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    outcomes = sorted((tmp_path / f"init-{i}.txt").read_text() for i in range(6))
    assert outcomes == ["created"] + ["exists"] * 5
    assert [p.name for p in (tmp_path / "run").iterdir()] == [".ckpt"]
    with ckptrepo.Repo.open(tmp_path / "run") as repo:
        repo.commit({"w": torch.ones(3)}, blocking=True).wait()
        assert repo.verify(full=True).ok


@pytest.mark.postgres
def test_processes_creating_repositories_in_one_database_at_once_make_one(tmp_path: Path, db_url: str) -> None:
    """Six processes run Repo.init at once, each for its own folder, all on one PostgreSQL
    database: one creates a repository there, the others get RepositoryExists and leave no
    repository folder behind."""
    if db_url.startswith("sqlite"):
        pytest.skip("one shared database: PostgreSQL")
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(6)
    procs = [ctx.Process(target=init_main, args=(str(tmp_path / f"run{i}"), str(tmp_path / f"init-{i}.txt"), start,
                                                 db_url)) for i in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    outcomes = [(tmp_path / f"init-{i}.txt").read_text() for i in range(6)]
    assert sorted(outcomes) == ["created"] + ["exists"] * 5
    made = outcomes.index("created")
    # Each loser's folder holds nothing (not even a half-built .ckpt); the winner's a repository.
    assert [i for i in range(6) if any((tmp_path / f"run{i}").iterdir())] == [made]
    with ckptrepo.Repo.open(tmp_path / f"run{made}") as repo:
        repo.commit({"w": torch.ones(3)}, blocking=True).wait()
        assert repo.verify(full=True).ok



def big_tensor_of(writer: int, i: int) -> torch.Tensor:
    """64 KiB of float32 whose first 16 KiB change with each commit: four 16 KiB chunks, one a
    delta of the writer's previous commit's, three shared with it."""
    t = torch.arange(16384, dtype=torch.float32) * (writer + 1)
    t[:4096] += i
    return t


def delta_writer_main(path: str, writer: int, out: str) -> None:
    os.environ["CKPT_IDLE_REPACK"] = "1"  # as outside the tests: raw chunks re-encoded between commits
    torch.set_num_threads(1)
    with ckptrepo.Repo.open(path) as repo:
        handles = [repo.commit({"w": big_tensor_of(writer, i)}, branch=f"b{writer % 2}", step=writer * 100 + i)
                   for i in range(COMMITS)]
        ids = [h.wait().id for h in handles]
    Path(out).write_text("\n".join(ids))


def grace_0_main(path: str, stop: str, out: str) -> None:
    runs = 0
    with ckptrepo.Repo.open(path) as repo:
        while not Path(stop).exists():
            repo.prune(keep_last=3)
            repo.gc(grace=0 if runs % 2 == 0 else 20)
            runs += 1
    Path(out).write_text(str(runs))


@pytest.mark.slow(only="postgres")  # crash/test_gc_concurrent.py runs gc at grace 0 on both
def test_writers_beside_prune_and_gc_at_grace_0_lose_nothing_and_the_store_rebuilds(tmp_path: Path,
                                                                                     db_url: str) -> None:
    """The probe's run: four committing processes (delta-coded chunks, idle repack on) beside one
    looping prune(keep_last=3) and gc at grace 0 and 20 s; then the database is dropped and rebuilt
    from the store. The rebuild succeeds, and every acknowledged commit restores bit-exactly (or,
    pruned, refuses with CommitPruned)."""
    path = tmp_path / "repo"
    with ckptrepo.Repo.init(path, db_url=db_url, chunk_size=16 * 1024, pack_target=64 * 1024) as repo:
        root = repo.commit({"w": big_tensor_of(9, 0)}, blocking=True).wait()
        repo.branch("b0", root.id)
        repo.branch("b1", root.id)
    ctx = mp.get_context("spawn")
    stop = tmp_path / "stop"
    upkeep = ctx.Process(target=grace_0_main, args=(str(path), str(stop), str(tmp_path / "runs")))
    writers = [ctx.Process(target=delta_writer_main, args=(str(path), w, str(tmp_path / f"ids-{w}.txt")))
               for w in range(WRITERS)]
    upkeep.start()
    try:
        for p in writers:
            p.start()
        for p in writers:
            p.join(timeout=300)
        codes = [p.exitcode for p in writers]
    finally:
        stop.touch()  # whatever happened: the upkeep loop must end
        upkeep.join(timeout=120)
        for p in (*writers, upkeep):
            if p.is_alive():
                p.kill()
    assert codes == [0] * WRITERS, f"writers exited with {codes}"
    assert upkeep.exitcode == 0 and int((tmp_path / "runs").read_text()) >= 1

    def check(repo: ckptrepo.Repo) -> int:
        exact = 0
        for w in range(WRITERS):
            for i, cid in enumerate((tmp_path / f"ids-{w}.txt").read_text().split()):
                commit = repo.get_commit(cid)
                if commit.pruned:
                    with pytest.raises(ckptrepo.errors.CommitPruned):
                        repo.checkout(cid)
                    continue
                assert torch.equal(repo.checkout(cid)["w"], big_tensor_of(w, i)), (w, i)
                exact += 1
        report = repo.verify(full=True)
        assert report.ok, report.to_json()
        return exact

    with ckptrepo.Repo.open(path) as repo:
        exact = check(repo)
        before = _lineage(repo)
    assert exact >= 2 * 3  # each branch's newest commits at least
    _lose_database(path, db_url)
    rebuilt = ckptrepo.Repo.rebuild_database(path)
    assert rebuilt.ok and rebuilt.conflicts == 0, rebuilt
    with ckptrepo.Repo.open(path) as repo:
        assert _lineage(repo) == before
        assert check(repo) == exact
