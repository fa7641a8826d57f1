"""Lineage queries on a synthetic 100,000-commit lineage, on SQLite and (optionally) PostgreSQL.

The lineage: a ``main`` chain 10,000 commits deep; branches of 50..150 commits forking from
random commits (none deeper than 10,000), about one in ten ending in a merge into another
line and one in fifty starting with a transfer edge; 20 tensors per commit (5 of them new
in each commit, the others shared with the first parent), two metrics and a step each;
plus ``wide``, two commits of 500 tensors each for ``diff``. Rows go in through SQLAlchemy
Core inserts into the repository's own tables (the ingest pipeline is not what is measured
here); after loading, the tables are analysed as autovacuum would (PostgreSQL: VACUUM
ANALYZE, which also sets the visibility map that index-only scans rely on; SQLite: ANALYZE),
and a repository kept from an older schema (``--keep``) is upgraded, then analysed. Every
timed call is the product's own query function, on a warm database, as the median of
``--repeat`` calls.

    python benchmarks/bench_lineage.py [--commits 100000] [--repeat 7] [--pg URL] [--no-sqlite]

``--pg`` (or CKPT_TEST_POSTGRES_URL) adds a run on PostgreSQL, in a temporary schema that
is dropped afterwards.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, insert
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ForeignLoad, report, timed

import ckptrepo
from ckptrepo.db import lines
from ckptrepo.db.engine import database_url, write_connection
from ckptrepo.db.models import Chunk, Commit, Edge, Entry, EntryRun, Metric, Pack, Ref, Tensor, TensorChunk
from ckptrepo.lineage import analysis
from ckptrepo.testing import parts

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
NAMES = [f"layers.{i}.weight" for i in range(20)]
CHANGED_PER_COMMIT = 5
WIDE = 500
BATCH = 5000


def _hex(*parts: object) -> str:
    return hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()


@dataclass
class Lineage:
    """The synthetic graph, as rows per table plus the commits the timings start from."""

    commits: list[dict[str, Any]] = field(default_factory=list)
    edges: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)  # entry_runs rows, by tensor id (``lines.runs_of``)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    refs: dict[str, str] = field(default_factory=dict)
    tensors: dict[str, dict[str, str]] = field(default_factory=dict)  # commit id -> {name: tensor id}
    new_tensors: list[str] = field(default_factory=list)
    gen: dict[str, int] = field(default_factory=dict)
    step: dict[str, int] = field(default_factory=dict)
    deep_fork: tuple[str, str] = ("", "")  # (branch head, fork point) of the deepest fork
    wide: tuple[str, str] = ("", "")  # the two 500-tensor commits, parent first


def build(n_commits: int, depth: int, seed: int = 0) -> Lineage:
    rng = random.Random(seed)
    lin = Lineage()

    def add(branch: str, parents: list[tuple[str, str]], names: list[str] = NAMES,
            changed: int = CHANGED_PER_COMMIT) -> str:
        cid = _hex("commit", len(lin.commits))
        gen = 1 + max((lin.gen[p] for p, _ in parents), default=0)
        step = (lin.step[parents[0][0]] if parents else 0) + 10
        base = lin.tensors[parents[0][0]] if parents else {}
        tensors = {n: base[n] for n in names if n in base}
        fresh = [names[(gen * changed + i) % len(names)] for i in range(changed)] if tensors else names
        for name in fresh:
            tensors[name] = _hex("tensor", cid, name)
            lin.new_tensors.append(tensors[name])
        lin.tensors[cid] = tensors
        lin.gen[cid], lin.step[cid] = gen, step
        lin.commits.append({
            "id": cid, "message": f"{branch} step {step}",
            "created_at": T0 + timedelta(minutes=gen, microseconds=len(lin.commits)),
            "author": "bench", "host": "bench", "branch": branch, "step": step, "epoch": step // 1000,
            "generation": gen, "config": None, "code_version": None,
            "first_parent_id": parents[0][0] if parents and parents[0][1] == "parent" else None,
            "skeleton": {"d": [x for n in sorted(tensors) for x in (n, {"t": n})]},
            "n_tensors": len(tensors), "logical_bytes": 0, "new_bytes": 0, "stored_bytes": 0,
            "stall_s": 0.0, "wait_s": 0.0, "persist_s": 0.0, "nonfinite": 0,
        })
        lin.edges += [{"child_id": cid, "parent_id": p, "kind": k, "position": i, "mapping": None}
                      for i, (p, k) in enumerate(parents)]
        loss = 4.0 / (1 + step / 5000) + rng.random() * 0.05
        lin.metrics += [{"commit_id": cid, "name": "val_loss", "value": loss},
                        {"commit_id": cid, "name": "train_loss", "value": loss * 0.9}]
        lin.refs[branch] = cid
        return cid

    main = [add("main", [])]
    for _ in range(depth - 1):
        main.append(add("main", [(main[-1], "parent")]))
    pool = list(main)
    k = 0
    while len(lin.commits) < n_commits - 2:
        k += 1
        length = rng.randint(50, 150)
        fork = rng.choice(pool)
        while lin.gen[fork] + length > depth:
            fork = rng.choice(pool)
        name = f"b{k}"
        parents = [(fork, "parent")]
        if rng.random() < 0.02:
            parents.append((rng.choice(pool), "transfer"))
        head = add(name, parents)
        for _ in range(length - 1):
            head = add(name, [(head, "parent")])
        if rng.random() < 0.1:
            head = add(name, [(head, "parent"), (rng.choice(pool), "merge")])
        if len(parents) == 1 and (not lin.deep_fork[1] or lin.gen[fork] > lin.gen[lin.deep_fork[1]]):
            lin.deep_fork = (head, fork)
        pool.append(head)
    wide = [f"wide.{i}.weight" for i in range(WIDE)]
    first = add("wide", [(main[depth // 2], "parent")], wide)
    lin.wide = (first, add("wide", [(first, "parent")], wide, WIDE // 2))
    # Each commit's first-parent line, as ``catalog.record_commit`` would place it.
    extra = {e["child_id"] for e in lin.edges if lines.extra_parent(e["kind"], e["position"])}
    placed = lines.assign_all((c["id"], c["first_parent_id"], c["id"] in extra) for c in lin.commits)
    for c in lin.commits:
        c.update(placed[c["id"]]._asdict())
    # The rows kept by line that ``catalog.record_commit`` writes: fork marks on edges, and
    # where each tensor name changes along a line.
    lin.edges = lines.with_forks(lin.edges, {c["id"]: (c["line_id"], c["fp_depth"]) for c in lin.commits})
    for c in lin.commits:
        before = lin.tensors[c["first_parent_id"]] if c["first_parent_id"] is not None else {}
        continues = c["first_parent_id"] is not None and c["line_id"] != c["id"]
        for run in lines.runs_of(c["line_id"], c["fp_depth"], lin.tensors[c["id"]], before if continues else None):
            # Each tensor here is one chunk (its id): another tensor differs in that one position.
            run["changed_chunks"] = int(before.get(run["name"]) not in (None, run["tensor_id"])
                                        and run["tensor_id"] is not None)
            lin.runs.append(run)
    return lin


def _batches(rows: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    for i in range(0, len(rows), BATCH):
        yield rows[i : i + BATCH]


def load(engine: Engine, lin: Lineage) -> None:
    """Insert the lineage in foreign-key order, one transaction per table. Each tensor and its
    one chunk get the same key, increasing in id order (the rows refer to them by key)."""
    pack = _hex("pack")
    tensors = sorted(set(lin.new_tensors))
    keys = {t: k for k, t in enumerate(tensors, 1)}
    tables: list[tuple[Any, Callable[[], list[dict[str, Any]]]]] = [
        (Pack, lambda: [{"id": pack, "size": 0, "n_chunks": len(tensors), "created_at": T0}]),
        (Chunk, lambda: [{"key": keys[t], "id": t, "pack_id": pack, "offset": 0, "length": 4096, "raw_length": 4096,
                          "encoding": 0, "base_key": None, "depth": 0} for t in tensors]),
        (Tensor, lambda: [{"key": keys[t], "id": t, "lead_key": keys[t], "dtype": "float32", "shape": [32, 32],
                           "nbytes": 4096, "chunk_size": 4096, "n_chunks": 1, "numel": 1024,
                           "mean": (h := int(t[:8], 16) / 2**32) - 0.5, "std": 1 + h, "min": -3 - h, "max": 3 + h,
                           "l2_norm": 32 * (1 + h), "abs_max": 3 + h, "nan_count": 0, "inf_count": 0}
                          for t in tensors]),
        (TensorChunk, lambda: [{"tensor_key": keys[t], "seq": 0, "chunk_key": keys[t]} for t in tensors]),
        (Commit, lambda: lin.commits),
        (Entry, lambda: [{"commit_id": c, "name": n, "tensor_key": keys[t]}
                         for c, names in lin.tensors.items() for n, t in names.items()]),
        (EntryRun, lambda: [{"name": r["name"], "line_id": r["line_id"], "fp_depth": r["fp_depth"],
                             "tensor_key": None if r["tensor_id"] is None else keys[r["tensor_id"]],
                             "changed_chunks": r["changed_chunks"]} for r in lin.runs]),
        (Edge, lambda: lin.edges),
        (Metric, lambda: lin.metrics),
        (Ref, lambda: [{"kind": "branch", "name": n, "commit_id": c, "updated_at": T0} for n, c in lin.refs.items()]),
    ]
    for model, rows in tables:
        with write_connection(engine) as conn:
            for batch in _batches(rows()):
                conn.execute(insert(model), batch)
    if engine.dialect.name == "postgresql":  # the keys sequences hand out later come after these
        with write_connection(engine) as conn:
            for seq in ("chunks_key_seq", "tensors_key_seq"):
                conn.exec_driver_sql(f"SELECT setval('{seq}', {len(tensors) + 1}, false)")
    analyse(engine)


def analyse(engine: Engine) -> None:
    """Planner statistics and (PostgreSQL) the visibility map, as a long-lived repository has
    them (autovacuum's VACUUM ANALYZE after a bulk load or a migration; SQLite: ANALYZE)."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE" if conn.dialect.name == "postgresql" else "ANALYZE")


def reuse(label: str, path: Path) -> None:
    """A kept repository: its schema upgraded to this code's head (then analysed) if older."""
    before, after = ckptrepo.upgrade_database(path)
    if before != after:
        with ckptrepo.Repo.open(path) as repo:
            analyse(parts(repo).engine)
        print(f"{label}: upgraded the schema from {before} to {after}, then analysed")


# -- timing ------------------------------------------------------------------------------------


def _goal(ms: float, goal: float | None, what: str) -> str:
    if goal is None:
        return f"(no goal)  {what}"
    return f"goal <= {goal:g} ms  {'met' if ms <= goal else 'MISSED'}  {what}"


def measure(repo: ckptrepo.Repo, lin: Lineage, repeat: int) -> list[tuple[str, float, str]]:
    """Median milliseconds of each query (after one warm-up call), with its goal."""
    head, fork = lin.deep_fork
    rows: list[tuple[str, float, str]] = []

    def row(name: str, fn: Callable[[], Any], goal: float | None, what: Callable[[Any], str]) -> None:
        fn()  # warm-up: statement caches, page cache
        seconds, result = timed(fn, repeat)
        rows.append((name, seconds * 1e3, _goal(seconds * 1e3, goal, what(result))))

    n = lambda r: f"{len(r):,} commits"  # noqa: E731
    row("ancestors", lambda: repo.ancestors("main"), 50, lambda r: f"main, 10,000 deep: {n(r)}")
    # Resolved once: ``REV~N`` resolution is revparse's (one query per hop), not the walk measured here.
    mid = repo.resolve("main~1000")
    row("descendants", lambda: repo.descendants(mid), 50, lambda r: f"main~1000: {n(r)}")
    row("merge-base", lambda: repo.merge_base(head, "main"), 50,
        lambda r: f"deepest fork's head vs main: {'ok' if r == [fork] else f'WRONG {r}'}")
    row("path", lambda: repo.path(head, "main"), 50,
        lambda r: f"deepest fork's head to main: {n(r)}{'' if fork in r else ' WRONG'}")
    row("log page", lambda: repo.log("main", limit=50), 20, n)
    row("log page --where", lambda: repo.log("main", where="val_loss < 1.5 and step >= 20000", limit=50),
        None, lambda r: f"val_loss < 1.5 and step >= 20000: {n(r)}")
    row("best", lambda: repo.best("val_loss", branch="main", limit=5), None,
        lambda r: "5 lowest val_loss on main's history")
    diff_stat = getattr(analysis, "diff_stat", None)
    if diff_stat is not None:
        row("diff --stat", lambda: diff_stat(repo, *lin.wide), 50, lambda r: "two 500-tensor commits")
    elif hasattr(analysis, "diff"):
        row("diff --stat", lambda: repo.diff(*lin.wide), 50,
            lambda r: f"two 500-tensor commits, analysis.diff (no diff_stat): {len(r.tensors)} tensors")
    else:
        rows.append(("diff --stat", float("nan"), "TODO: ckptrepo.lineage.analysis.diff_stat does not exist yet"))
    if hasattr(analysis, "history"):
        row("history", lambda: repo.history(NAMES[3], along="main"), 200,
            lambda r: f"{NAMES[3]} along main: {len(r):,} commits")
    else:
        rows.append(("history", float("nan"), "TODO: ckptrepo.lineage.analysis.history does not exist yet"))
    return rows


@contextmanager
def pg_schema(base_url: str, keep: bool, n: int, repo_dir: Path) -> Iterator[tuple[str, bool]]:
    """A schema in the database at ``base_url``: its URL, and whether it holds the lineage already
    (``keep`` only, with the repository folder still there). Dropped afterwards unless ``keep``."""
    url = make_url(database_url(base_url, Path.cwd()))
    schema = f"ckptbench_lineage_{n}" if keep else f"ckptbench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(url, poolclass=NullPool)
    try:
        with admin.begin() as conn:
            exists = conn.exec_driver_sql(
                "SELECT 1 FROM information_schema.tables WHERE table_schema = %(s)s AND table_name = 'commits'",
                {"s": schema},
            ).first() is not None
            if exists and not (repo_dir / ".ckpt" / "config.json").exists():
                conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
                exists = False
            conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        try:
            yield url.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
                hide_password=False), exists
        finally:
            if not keep:
                with admin.begin() as conn:
                    conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        admin.dispose()


def prepare(label: str, path: Path, db_url: str | None, lin: Lineage) -> None:
    """A fresh repository at ``path`` holding ``lin``."""
    shutil.rmtree(path, ignore_errors=True)
    with ckptrepo.Repo.init(path, db_url=db_url) as repo:
        started = time.perf_counter()
        load(parts(repo).engine, lin)
        print(f"{label}: loaded {len(lin.commits):,} commits in {time.perf_counter() - started:.0f} s")


def run_on(label: str, path: Path, probes: Lineage, n_commits: int, repeat: int) -> None:
    with ckptrepo.Repo.open(path) as repo, ForeignLoad() as foreign:
        rows = measure(repo, probes, repeat)
    report(f"lineage queries on {label}, {n_commits:,} commits (ms, median of {repeat})", rows,
           {"database": label, "commits": n_commits, "foreign_cpu_share": round(foreign.share, 3)})
    if foreign.share > 0.2:
        print(f"  note: other processes used {foreign.share:.0%} of the machine's CPU during these timings")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", type=int, default=100_000)
    ap.add_argument("--depth", type=int, default=10_000, help="length of main (the deepest chain)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--pg", metavar="URL", default=os.environ.get("CKPT_TEST_POSTGRES_URL"),
                    help="also run on this PostgreSQL database (default: CKPT_TEST_POSTGRES_URL)")
    ap.add_argument("--no-sqlite", action="store_true", help="only run on PostgreSQL")
    ap.add_argument("--dir", type=Path, default=None, help="where to put the SQLite repository (default: under /work)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the SQLite repository (in --dir) and PostgreSQL schema, and reuse them next time")
    args = ap.parse_args()
    started = time.perf_counter()
    lin = build(args.commits, args.depth)
    print(f"built {len(lin.commits):,} commits, {sum(map(len, lin.tensors.values())):,} entries, "
          f"{len(set(lin.new_tensors)):,} tensors in {time.perf_counter() - started:.1f} s")
    root = args.dir or Path(tempfile.mkdtemp(prefix="ckptbench-lineage-",
                                             dir="/work" if Path("/work").is_dir() else None))
    try:
        with ExitStack() as stack:
            targets: list[tuple[str, Path, str | None, bool]] = []
            if not args.no_sqlite:
                path = root / f"sqlite-{args.commits}"
                targets.append(("sqlite", path, None, args.keep and (path / ".ckpt" / "config.json").exists()))
            if args.pg:
                path = root / f"pg-{args.commits}"
                url, exists = stack.enter_context(pg_schema(args.pg, args.keep, args.commits, path))
                targets.append(("postgresql", path, url, exists))
            for label, path, db_url, reused in targets:
                if reused:
                    print(f"{label}: reusing the lineage in {path}")
                    reuse(label, path)
                else:
                    prepare(label, path, db_url, lin)
            # The rows built for loading are millions of objects no user's process holds: left
            # alive, the garbage collector's full passes over them (~0.5 s) land in the timings.
            n_commits, probes = len(lin.commits), Lineage(deep_fork=lin.deep_fork, wide=lin.wide)
            del lin
            gc.collect()
            for label, path, _, _ in targets:
                run_on(label, path, probes, n_commits, args.repeat)
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
