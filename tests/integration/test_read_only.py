"""Read-only repositories (issue 44, item 8): a repository on a read-only filesystem, or opened
with ``read_only=True`` / ``ckpt --read-only``, reads as a writable one does and writes nothing;
every call that writes fails with ReadOnlyRepository (exit 7) before it changes anything.

The read-only filesystem is a real one: a read-only bind mount of the repository's folder (root
only, skipped otherwise; under ``CI``, running as root, a mount that fails fails the test). The
repository has commits whose layouts are pending (asynchronous commits on SQLite), pruned
commits, a tag and two branches, and no staging folder; a writable twin copied from it says what
every read must show (its first read indexes its pending layouts, as any writable one does).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from starlette.testclient import TestClient
from typer.testing import CliRunner, Result

import ckptrepo
from ckptrepo import Repo, errors
from ckptrepo.cli.app import app
from ckptrepo.db import pending
from ckptrepo.testing import parts
from ckptrepo.ui import create_app

CHUNK = 64 * 1024
Listing = dict[str, tuple[int, int] | None]


# -- the repository -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Built:
    path: Path  # the folder holding .ckpt
    main: list[str]
    exp: list[str]
    pruned: tuple[str, ...]
    pending: int  # commits whose layout is pending when it was closed


def _state(w: torch.Tensor, step: int) -> dict[str, Any]:
    return {"model": {"w": w.clone(), "b": torch.full((7,), float(step))}, "step": step}


def build(path: Path) -> Built:
    """Main of nine commits (the third and fourth pruned, the last three pending: each follows the
    commit this process recorded last), ``exp`` of two commits forking from main's second, tag
    ``v1`` on the first; then the store's staging folder removed, so that a read needing it would
    fail on read-only media."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(3 * CHUNK // 4, generator=g)
    main: list[str] = []
    exp: list[str] = []

    def on_main(step: int) -> None:
        w[(step % 3) * (CHUNK // 4)] += 1.0  # one chunk of three changes per commit
        main.append(repo.commit(_state(w, step), step=step, metrics={"loss": 1.0 / (step + 1)}).wait().id)

    with ckptrepo.Repo.init(path, chunk_size=CHUNK, idle_repack=False) as repo:
        for step in range(5):
            on_main(step)
        repo.branch("exp", at=main[1])
        exp.append(repo.commit(_state(w * 2, 10), branch="exp", step=10, metrics={"loss": 0.3}).wait().id)
        exp.append(repo.commit(_state(w * 3, 11), branch="exp", step=11, metrics={"loss": 0.25}).wait().id)
        repo.tag("v1", at=main[0])
        pruned = repo.prune(keep_last=1, branches=["main"]).pruned  # indexes what is pending so far
        for step in range(5, 9):
            on_main(step)
    shutil.rmtree(path / ".ckpt" / "store" / ".staging")
    built = Built(path, main, exp, tuple(pruned), pending_layouts(path))
    assert set(built.pruned) == {main[2], main[3]} and built.pending == 3
    return built


def pending_layouts(path: Path) -> int:
    """How many pending layouts the repository's database holds (no process writes it now), read
    without making any file: ``mode=ro`` alone would leave SQLite's -wal and -shm files behind."""
    uri = f"file:{path / '.ckpt' / 'db.sqlite'}?mode=ro&immutable=1"
    with closing(sqlite3.connect(uri, uri=True)) as db:
        return int(db.execute("SELECT count(*) FROM pending_layouts").fetchone()[0])


def listing(root: Path, *, folder_times: bool = True) -> Listing:
    """Every file under ``root`` with its size and mtime (ns); every folder, with its mtime too
    unless ``folder_times`` is False (None then)."""
    out: Listing = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        rel = path.relative_to(root).as_posix()
        if path.is_dir():
            out[rel + "/"] = (0, st.st_mtime_ns) if folder_times else None
        else:
            out[rel] = (st.st_size, st.st_mtime_ns)
    return out


@contextmanager
def read_only_mount(src: Path, dst: Path) -> Iterator[Path]:
    """``src`` bind-mounted read-only at ``dst``, unmounted afterwards."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a read-only bind mount needs root and mount(8)")
    dst.mkdir(parents=True)
    done = subprocess.run(["mount", "--bind", str(src), str(dst)], capture_output=True, text=True)
    if done.returncode == 0:
        done = subprocess.run(["mount", "-o", "remount,bind,ro", str(dst)], capture_output=True, text=True)
        if done.returncode != 0:
            subprocess.run(["umount", str(dst)], check=False)
    if done.returncode != 0:
        why = f"cannot make a read-only bind mount here: {done.stderr.strip()}"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    try:
        assert os.statvfs(dst).f_flag & os.ST_RDONLY
        yield dst
    finally:
        subprocess.run(["umount", str(dst)], check=False, capture_output=True)
        if os.path.ismount(dst):  # something still holds a file open: detach it anyway
            subprocess.run(["umount", "-l", str(dst)], check=False)


@dataclass(frozen=True)
class Mounted:
    built: Built
    ro: Path  # the read-only mount of built.path
    twin: Path  # a writable copy of built.path, made before anything read it
    before: Listing  # built.path before the mount


@pytest.fixture(scope="module")
def mounted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mounted]:
    root = tmp_path_factory.mktemp("read-only")
    built = build(root / "src" / "repo")
    twin = root / "twin" / "repo"  # one folder name for all three: the UI's titles show it
    shutil.copytree(built.path, twin, symlinks=True)
    before = listing(built.path)
    with read_only_mount(built.path, root / "ro" / "repo") as ro:
        yield Mounted(built, ro, twin, before)


@pytest.fixture
def ro_repo(mounted: Mounted) -> Iterator[Repo]:
    with Repo.open(mounted.ro) as repo:
        yield repo


@pytest.fixture
def twin_repo(mounted: Mounted) -> Iterator[Repo]:
    with Repo.open(mounted.twin) as repo:
        yield repo


# -- the API ----------------------------------------------------------------------------------------


def test_a_repository_on_a_read_only_filesystem_opens_read_only_and_reads_everything(
        mounted: Mounted, ro_repo: Repo, twin_repo: Repo, tmp_path: Path) -> None:
    built = mounted.built
    assert ro_repo.read_only and not twin_repo.read_only
    assert [c.id for c in ro_repo.log()] == [c.id for c in twin_repo.log()]
    every = [c.id for c in twin_repo.log()]
    assert {*built.main, *built.exp} == set(every)
    for cid in every:
        assert ro_repo.get_commit(cid) == twin_repo.get_commit(cid)
        assert ro_repo.tensors(cid) == twin_repo.tensors(cid)  # pending ones too: read from the indexed copy
    for cid in (c for c in every if c not in built.pruned):
        restored, expected = ro_repo.checkout(cid), twin_repo.checkout(cid)
        assert restored.keys() == expected.keys() and restored["step"] == expected["step"]
        assert all(torch.equal(restored["model"][k], expected["model"][k]) for k in expected["model"])
        assert torch.equal(ro_repo.load_tensor(cid, "model/w"), expected["model"]["w"])
    for cid in built.pruned:
        with pytest.raises(errors.CommitPruned):
            ro_repo.checkout(cid)
    assert ro_repo.export("main", tmp_path / "ro.safetensors") == twin_repo.export("main", tmp_path / "tw.safetensors")
    assert _same_file(tmp_path / "ro.safetensors", tmp_path / "tw.safetensors")
    assert ro_repo.diff("exp", "main", exact=True) == twin_repo.diff("exp", "main", exact=True)
    assert ro_repo.history("model/w") == twin_repo.history("model/w")
    assert ro_repo.history("model/b", along="exp") == twin_repo.history("model/b", along="exp")
    assert ro_repo.best("loss", limit=3) == twin_repo.best("loss", limit=3)
    assert ro_repo.ancestors("main") == twin_repo.ancestors("main")
    assert ro_repo.merge_base("exp", "main") == twin_repo.merge_base("exp", "main")
    assert ro_repo.stats() == twin_repo.stats()
    assert ro_repo.branches() == twin_repo.branches() and ro_repo.tags() == twin_repo.tags()
    assert ro_repo.head == twin_repo.head and ro_repo.retention() is None
    for full in (False, True):
        got, want = ro_repo.verify(full=full), twin_repo.verify(full=full)
        assert got.ok
        assert _without_time(got.to_json()) == _without_time(want.to_json())
    assert parts(ro_repo).writer is None  # no commit engine, so no idle repack thread either


def _same_file(a: Path, b: Path) -> bool:
    """Two safetensors files hold the same metadata and tensors (their headers' key order may differ)."""
    with safe_open(str(a), "pt") as fa, safe_open(str(b), "pt") as fb:
        names = list(fa.keys())
        return bool(fa.metadata() == fb.metadata() and set(names) == set(fb.keys())
                    and all(torch.equal(fa.get_tensor(k), fb.get_tensor(k)) for k in names))


def _without_time(report: dict[str, Any]) -> dict[str, Any]:
    return {**report, "checked": {k: v for k, v in report["checked"].items() if k != "seconds"}}


def _writes(source: Path) -> list[tuple[str, Callable[[Repo], Any]]]:
    """Every writing call of ``Repo``, with the action its ReadOnlyRepository names."""
    return [
        ("commit", lambda r: r.commit({"w": torch.zeros(4)})),
        ("commit", lambda r: r.commit({"w": torch.zeros(4)}, blocking=True)),
        ("commit", lambda r: r.reserve({"w": torch.zeros(4)})),
        ("commit", lambda r: r.commit_file(source)),
        ("commit", lambda r: r.dcp_writer()),
        ("create a branch", lambda r: r.branch("new")),
        ("create a branch", lambda r: r.branch("exp", at="main", force=True)),
        ("create a tag", lambda r: r.tag("v2")),
        ("delete a branch", lambda r: r.delete_branch("exp", force=True)),
        ("delete a tag", lambda r: r.delete_tag("v1")),
        ("prune", lambda r: r.prune(keep_last=1)),
        ("gc", lambda r: r.gc(grace=0)),
        ("repack", lambda r: r.repack()),
        ("store a retention setting", lambda r: r.set_retention({"keep_last": 2})),
        ("store a retention setting", lambda r: r.set_retention(None)),
        ("switch branches", lambda r: r.switch("exp")),
        ("write manifests", lambda r: r.write_missing_manifests()),
    ]


def _refuses_every_write(repo: Repo, why: str, source: Path) -> None:
    for what, call in _writes(source):
        with pytest.raises(errors.ReadOnlyRepository) as exc:
            call(repo)
        assert exc.value.exit_code == 7 and "Nothing was changed" in exc.value.hint
        assert str(exc.value) == f"Cannot {what}: the repository {repo.repo_dir} is read-only ({why})."


def test_every_write_is_refused_with_one_error(mounted: Mounted, tmp_path: Path) -> None:
    source = tmp_path / "state.safetensors"
    save_file({"w": torch.zeros(4)}, str(source))
    with Repo.open(mounted.ro, idle_repack=False, max_inflight=2) as repo:  # writer options: unused, accepted
        _refuses_every_write(repo, "its folder is on a read-only filesystem", source)
        assert parts(repo).writer is None
    for call in (lambda: Repo.rebuild_database(mounted.ro, replace=True),
                 lambda: ckptrepo.upgrade_database(mounted.ro)):
        with pytest.raises(errors.ReadOnlyRepository, match=r"the database: the repository .* is read-only"):
            call()
    _assert_unchanged(mounted)


def _assert_unchanged(mounted: Mounted) -> None:
    """Every file and folder of the mounted repository, with sizes and times, as before the
    mount; its layouts still pending; still no staging folder."""
    assert listing(mounted.built.path) == mounted.before
    assert pending_layouts(mounted.built.path) == mounted.built.pending
    assert not (mounted.built.path / ".ckpt" / "store" / ".staging").exists()


# -- the CLI ------------------------------------------------------------------------------------------


def _ckpt(repo: Path, *args: str) -> Result:
    return CliRunner().invoke(app, ["--repo", str(repo), *args], catch_exceptions=False)


def _read_commands(built: Built) -> list[list[str]]:
    return [
        ["log", "--all", "--json"], ["log", "--json"], ["log", "--all", "--graph"],
        *(["show", cid, "--json"] for cid in (*built.main, *built.exp)), ["show", "main"],
        ["diff", "main~1", "main", "--json"], ["diff", "--exact", "main~1", "main", "--json"],
        ["diff", "--exact", "exp", "main"], ["diff", built.pruned[0], "main"],
        ["history", "model/w", "--json"], ["history", "model/b", "--along", "exp"],
        ["best", "-m", "loss", "--json"], ["best", "-m", "loss", "-n", "3", "--branch", "exp"],
        ["lineage", "ancestors", "main", "--json"], ["lineage", "descendants", "v1"],
        ["lineage", "path", "exp", "main", "--json"], ["lineage", "merge-base", "exp", "main"],
        ["stats", "--json"], ["stats"], ["branch", "--json"], ["tag"],
    ]


def test_every_read_command_shows_what_the_writable_twin_shows(mounted: Mounted, tmp_path: Path) -> None:
    for command in _read_commands(mounted.built):
        got, want = _ckpt(mounted.ro, *command), _ckpt(mounted.twin, *command)
        assert (got.exit_code, got.stdout, got.stderr) == (want.exit_code, want.stdout, want.stderr), command
        assert got.exit_code == 0, (command, got.stderr)
    for full in ([], ["--full"]):
        got, want = _ckpt(mounted.ro, "verify", "--json", *full), _ckpt(mounted.twin, "verify", "--json", *full)
        assert got.exit_code == want.exit_code == 0, got.stderr
        assert _without_time(json.loads(got.stdout)) == _without_time(json.loads(want.stdout))
    for rev, name in (("main", "a.safetensors"), (mounted.built.exp[-1], "b.safetensors")):
        got = _ckpt(mounted.ro, "checkout", rev, "-o", str(tmp_path / f"ro-{name}"))
        want = _ckpt(mounted.twin, "checkout", rev, "-o", str(tmp_path / f"twin-{name}"))
        assert got.exit_code == want.exit_code == 0, got.stderr
        assert _same_file(tmp_path / f"ro-{name}", tmp_path / f"twin-{name}")
    refused = _ckpt(mounted.ro, "checkout", mounted.built.pruned[0], "-o", str(tmp_path / "pruned.safetensors"))
    assert refused.exit_code == 3 and "pruned" in refused.stderr


def _write_commands(source: Path) -> list[list[str]]:
    return [
        ["commit", str(source)], ["branch", "new"], ["branch", "-f", "exp", "main"], ["branch", "-d", "-f", "exp"],
        ["tag", "v2"], ["tag", "-d", "v1"], ["prune", "--keep-last", "1"], ["prune", "--keep-last", "1", "--save"],
        ["prune", "--forget"], ["gc"], ["repack"], ["db", "upgrade"], ["db", "rebuild", "--replace"],
        ["db", "manifests"], ["checkout", "exp"], ["checkout", "-b", "new"],
    ]


def _assert_refused(result: Result, path: Path, why: str) -> None:
    assert result.exit_code == 7, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[1].startswith("hint: Nothing was changed."), lines
    assert lines[0].startswith("error: Cannot ") and lines[0].endswith(f"is read-only ({why}).")
    assert str(path) in lines[0] and result.stdout == ""


def test_every_write_command_exits_7_with_one_error(mounted: Mounted, tmp_path: Path) -> None:
    source = tmp_path / "state.safetensors"
    save_file({"w": torch.zeros(4)}, str(source))
    for command in _write_commands(source):
        _assert_refused(_ckpt(mounted.ro, *command), mounted.ro, "its folder is on a read-only filesystem")
    _assert_unchanged(mounted)


def test_the_ui_serves_the_same_pages_and_data(mounted: Mounted, ro_repo: Repo, twin_repo: Repo) -> None:
    built = mounted.built
    urls = ["/", "/?branch=exp", "/commit/main", f"/commit/{built.main[-2]}", f"/commit/{built.pruned[0]}",
            "/metrics?branch=main&name=loss", "/tensor/model/w?along=main", "/diff/main~1/main",
            f"/diff/exp/{built.main[-1]}", "/api/graph", "/api/commits", "/api/commits/main",
            f"/api/commits/{built.main[-2]}", "/api/history/model/w", "/api/diff/main~1/main",
            "/api/metrics?branch=main&name=loss", "/api/branches", "/api/metric-names"]
    with TestClient(create_app(ro_repo)) as ro, TestClient(create_app(twin_repo)) as twin:
        for url in urls:
            got, want = ro.get(url), twin.get(url)
            assert got.status_code == want.status_code == 200, (url, got.text[:300])
            assert got.text == want.text, url


# -- a log left without a checkpoint --------------------------------------------------------------

_COMMIT_AND_DIE = """
import os, sys, torch, ckptrepo
repo = ckptrepo.Repo.open(sys.argv[1])
print(repo.commit({"w": torch.arange(1000.0)}, step=99, blocking=True).wait().id, flush=True)
os._exit(0)  # no close: SQLite's log is neither copied into the database nor removed
"""


def test_a_log_a_writer_left_is_read_or_the_repository_refused(tmp_path: Path) -> None:
    """The last commit of a writer killed before SQLite copied its log into the database is
    only in the log (``db.sqlite-wal``); read-only, it is read through the log's index
    (``-shm``). Without that index, SQLite cannot read the log on read-only media, and reading
    the database alone would silently lose that commit: the repository is refused instead."""
    built = build(tmp_path / "src")
    done = subprocess.run([sys.executable, "-c", _COMMIT_AND_DIE, str(built.path)], capture_output=True, text=True,
                          env={**os.environ, "CKPT_IDLE_REPACK": "0"})
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip()
    db = built.path / ".ckpt" / "db.sqlite"
    log, index = Path(f"{db}-wal"), Path(f"{db}-shm")
    assert log.stat().st_size > 0 and index.exists()
    before = listing(built.path)
    with read_only_mount(built.path, tmp_path / "ro") as ro, Repo.open(ro) as repo:
        assert repo.log()[0].id == last and repo.log()[0].step == 99
        assert torch.equal(repo.checkout(last)["w"], torch.arange(1000.0))
        assert len(repo.log()) == len(built.main) + len(built.exp) + 1 and repo.verify().ok
    assert listing(built.path) == before

    index.unlink()
    with read_only_mount(built.path, tmp_path / "ro2") as ro:
        with pytest.raises(errors.UnreadableLog) as exc:
            Repo.open(ro)
        assert exc.value.exit_code == 7 and "db.sqlite-wal" in str(exc.value) and "db.sqlite-shm" in str(exc.value)
        result = _ckpt(ro, "log")
        assert result.exit_code == 7 and result.stderr.startswith("error: Cannot read ") and "hint: " in result.stderr


# -- read_only=True on a writable repository --------------------------------------------------------


def test_an_explicit_read_only_open_of_a_writable_repository_writes_nothing(tmp_path: Path) -> None:
    """Everything of the repository as it was: its files with sizes and times, its folders (their
    times aside: SQLite makes its -wal and -shm files beside the database while it is open and
    removes them at close), its pending layouts; the exported file is outside it."""
    built = build(tmp_path / "work")
    source = tmp_path / "state.safetensors"
    save_file({"w": torch.zeros(4)}, str(source))
    before = listing(built.path, folder_times=False)
    with Repo.open(built.path, read_only=True) as repo:
        assert repo.read_only
        assert {c.id for c in repo.log()} == {*built.main, *built.exp}
        assert len(repo.tensors("main")) == 2 and repo.history("model/w")[0].commit_id == built.main[-1]
        assert repo.checkout(built.exp[-1])["step"] == 11
        repo.export("main", tmp_path / "main.safetensors")
        assert repo.diff("exp", "main", exact=True).tensors and repo.stats().commits == len(built.main) + len(built.exp)
        assert repo.verify(full=True).ok
        with TestClient(create_app(repo)) as client:
            assert client.get(f"/commit/{built.main[-1]}").status_code == 200
            assert client.get("/api/history/model/w").status_code == 200
        _refuses_every_write(repo, "opened read-only", source)
    for command in (["log"], ["show", "main"], ["diff", "--exact", "main~1", "main"], ["verify", "--full"]):
        assert _ckpt(built.path, "--read-only", *command).exit_code == 0, command
    assert listing(built.path, folder_times=False) == before
    assert pending_layouts(built.path) == built.pending


def test_the_read_only_flag_refuses_every_write_command(tmp_path: Path) -> None:
    path = tmp_path / "work"
    with Repo.init(path) as repo:
        repo.commit({"w": torch.ones(3)}, blocking=True)
        repo.tag("v1")
        repo.branch("exp")
    source = tmp_path / "state.safetensors"
    save_file({"w": torch.zeros(4)}, str(source))
    before = listing(path, folder_times=False)
    runner = CliRunner()
    for command in _write_commands(source):
        result = runner.invoke(app, ["--read-only", "--repo", str(path), *command], catch_exceptions=False)
        _assert_refused(result, path, "opened read-only")
    assert listing(path, folder_times=False) == before


def test_a_read_only_reader_follows_a_writer_of_the_same_repository(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The private copy of a database with pending layouts is made again once another process
    (here another ``Repo``) committed; copies go once replaced and unused, the last at close."""
    copies = tmp_path / "tmp"
    copies.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(copies))
    with Repo.init(tmp_path / "work", chunk_size=CHUNK, idle_repack=False) as writer, \
            Repo.open(tmp_path / "work", read_only=True) as reader:
        for step in range(3):
            state = {"w": torch.full((CHUNK // 4,), float(step))}
            cid = writer.commit(state, step=step).wait().id  # asynchronous: its layout stays pending
            assert [t.name for t in reader.tensors(cid)] == ["w"]
            assert torch.equal(reader.checkout(cid)["w"], state["w"])
            assert len(list(copies.iterdir())) == 1
        with parts(writer).sessions() as s:
            assert pending.count(s) == 3  # the reader indexed none of them
    assert list(copies.iterdir()) == []


def test_read_only_databases_refuse_writes_themselves(tmp_path: Path, db_url: str) -> None:
    """Below the facade's refusal, the engine of a read-only repository cannot write either
    (SQLite: ``query_only``; PostgreSQL: READ ONLY transactions)."""
    with Repo.init(tmp_path / "work", db_url=db_url) as repo:
        repo.commit({"w": torch.ones(3)}, blocking=True)
    with Repo.open(tmp_path / "work", read_only=True) as repo:
        assert len(repo.log()) == 1 and repo.verify().ok
        with pytest.raises(DBAPIError, match=r"(?i)read.?only"), parts(repo).sessions() as s:
            s.execute(text("DELETE FROM metrics"))
        with pytest.raises(errors.ReadOnlyRepository):
            repo.tag("v1")
    with Repo.open(tmp_path / "work") as repo:
        assert repo.tags() == [] and len(repo.log()) == 1
