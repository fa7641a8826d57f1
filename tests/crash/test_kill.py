"""Crash consistency: SIGKILL a committing child process, at random moments and at every fault point.

The child (``child_commit.py``) commits states derived from a counter. After each kill the
parent opens the repository and checks the write-ordering invariant from the outside:

- every visible commit restores bit-exactly to the state its ``counter`` metric names, and
  every commit the child saw acknowledged is visible (durable);
- main is a chain of consecutive counters from 0, each commit's parent the previous one,
  and no ref names a missing commit;
- ``verify()`` finds no error (a kill leaves at most temporary files and unreferenced packs,
  which are warnings; across the fault-point runs both must have been seen);
- the next child run continues committing in the same repository.

Runs go through a fork server (one ``sys.executable`` process that imported ckptrepo once)
so that ~35 kills fit in well under a minute; one run per test is a plain ``sys.executable``
process reading ``CKPT_FAULTS`` from its environment, as a user's would.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import blake3
import pytest
import torch

import ckptrepo
from ckptrepo import faults
from ckptrepo.db import pending
from ckptrepo.testing import parts

CHILD = Path(__file__).with_name("child_commit.py")
RUN_TIMEOUT = 30.0

# Fault point -> the hit counts (per child process) to kill at. A commit reaches stage.copy
# 4 times (tensors), ingest.chunk 129 times, pack.write 34-129 times (new chunks),
# pack.before_put/after_put ~7-17 times (packs), db.* once; so these kill in the first and
# in later commits of a run.
SCHEDULE: dict[str, tuple[int, ...]] = {
    "db.after_commit": (1, 2, 3),  # the first of these runs as a plain process
    "stage.copy": (1, 6),
    "ingest.chunk": (1, 100, 200, 400),
    "pack.write": (1, 30, 90, 160),
    "pack.before_put": (1, 4, 12, 25),
    "pack.after_put": (1, 5, 13, 24),
    "db.before_commit": (1, 2, 3),
}
RANDOM_KILLS = 10
RANDOM_SEED = 20240611


def _load_child() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ckpt_crash_child", CHILD)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


child = _load_child()


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop(faults.ENV, None)
    # One BLAS/OpenMP thread: the fork server then holds no helper thread when it forks.
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    # The background repack on, as by default: kills also land in repacks between commits.
    env["CKPT_IDLE_REPACK"] = "1"
    return env


class ForkServer:
    """The ``child_commit.py serve`` process: starts runs, reports how they ended."""

    def __init__(self, stderr_path: Path) -> None:
        self._stderr = open(stderr_path, "wb")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._stderr, text=True, env=_child_env(),
        )
        self._lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(json.loads(line))

    def _next(self, timeout: float) -> dict[str, Any]:
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"fork server silent for {timeout} s") from None

    def start(self, repo: Path, log: Path, *, commits: int | None = None, spec: str = "", mode: str = "run") -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"repo": str(repo), "log": str(log), "commits": commits,
                                          "faults": spec, "mode": mode}) + "\n")
        self.proc.stdin.flush()
        return int(self._next(RUN_TIMEOUT)["pid"])

    def wait(self, pid: int, timeout: float = RUN_TIMEOUT) -> dict[str, Any]:
        """How run ``pid`` ended; a run still going after ``timeout`` is killed and fails the test."""
        try:
            end = self._next(timeout)
        except AssertionError:
            os.kill(pid, signal.SIGKILL)
            self._next(RUN_TIMEOUT)
            raise AssertionError(f"run {pid} did not end within {timeout} s") from None
        assert end["pid"] == pid
        return end

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._stderr.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ForkServer]:
    fs = ForkServer(tmp_path / "children.stderr")
    try:
        yield fs
    finally:
        fs.close()
    errors_text = (tmp_path / "children.stderr").read_text()
    assert "failed:" not in errors_text, errors_text


def _acknowledged(log: Path) -> dict[int, str]:
    out: dict[int, str] = {}
    if log.exists():
        for line in log.read_text().splitlines():
            _, n, cid = line.split()
            out[int(n)] = cid
    return out


_fingerprints: dict[int, dict[str, Any]] = {}


def _fingerprint(state: dict[str, Any]) -> dict[str, Any]:
    """Dtype, shape and BLAKE3 of the bytes of every tensor; other values as they are."""
    out: dict[str, Any] = {}
    for name, value in state.items():
        if isinstance(value, torch.Tensor):
            raw = value.contiguous().reshape(-1).view(torch.uint8).numpy()
            out[name] = (value.dtype, tuple(value.shape), blake3.blake3(raw.data).hexdigest())
        else:
            out[name] = value
    return out


def _expected(n: int) -> dict[str, Any]:
    if n not in _fingerprints:
        _fingerprints[n] = _fingerprint(child.expected_state(n))
    return _fingerprints[n]


class Checker:
    """Checks a repository after each kill and remembers what it found."""

    def __init__(self, repo: Path, log: Path) -> None:
        self.repo, self.log = repo, log
        self.top = -1  # highest counter visible at the last check
        self.kills: Counter[str] = Counter()
        self.temporary: Counter[str] = Counter()
        self.unreferenced: Counter[str] = Counter()

    def check(self, label: str) -> ckptrepo.VerifyReport:
        with ckptrepo.Repo.open(self.repo) as repo:
            commits = repo.log()
            by_counter = {int(c.metrics["counter"]): c for c in commits}
            assert len(by_counter) == len(commits), f"{label}: a counter was committed twice"
            assert sorted(by_counter) == list(range(len(commits))), f"{label}: counters {sorted(by_counter)}"
            assert len(commits) - 1 >= self.top, f"{label}: visible commits disappeared"
            for n, c in by_counter.items():
                assert c.step == n and c.parent_ids == ([by_counter[n - 1].id] if n else []), f"{label}: {n}"
            ids = {c.id for c in commits}
            branches = repo.branches()
            assert all(b.commit_id in ids for b in branches), f"{label}: a ref names a missing commit"
            if commits:
                assert [(b.name, b.commit_id) for b in branches] == [("main", by_counter[len(commits) - 1].id)]
            for n, cid in _acknowledged(self.log).items():
                assert n in by_counter and by_counter[n].id == cid, f"{label}: acknowledged commit {n} lost"
            for n, c in by_counter.items():
                assert _fingerprint(repo.checkout(c.id)) == _expected(n), f"{label}: commit {n} restores wrong"
            report = repo.verify()
        assert report.ok, (label, report.to_json())
        self.top = len(commits) - 1
        self.temporary[label] += bool(report.temporary_files)
        self.unreferenced[label] += bool(report.unreferenced_packs)
        return report

    def continues(self, server: ForkServer, label: str) -> None:
        """A clean run commits the next counter on top of what the kill left."""
        end = server.wait(server.start(self.repo, self.log, commits=1))
        assert end.get("exit") == 0, f"after {label}: {end}"
        assert max(_acknowledged(self.log)) == self.top + 1, f"after {label}: the next run did not continue"


def _killed(end: dict[str, Any], label: str) -> None:
    assert end.get("signal") == signal.SIGKILL, f"{label}: run ended with {end}, not by SIGKILL"


def test_kill_at_every_fault_point(server: ForkServer, tmp_path: Path) -> None:
    started = time.monotonic()
    checkers: list[Checker] = []
    for point in faults.POINTS:
        nths = SCHEDULE.get(point, (1, 3))  # a point added later still gets killed at
        chk = Checker(tmp_path / point, tmp_path / f"{point}.log")
        checkers.append(chk)
        for nth in nths:
            spec = f"{point}=kill@{nth}"
            if point == "db.after_commit" and nth == 1:  # a real process, armed by its environment
                proc = subprocess.run([sys.executable, str(CHILD), "run", str(chk.repo), str(chk.log)],
                                      env={**_child_env(), faults.ENV: spec}, timeout=120, capture_output=True)
                _killed({"signal": -proc.returncode}, spec)
            else:
                _killed(server.wait(server.start(chk.repo, chk.log, spec=spec)), spec)
            chk.kills[point] += 1
            chk.check(spec.split("@")[0])
            chk.continues(server, spec)
        chk.check(f"{point} end")
        with ckptrepo.Repo.open(chk.repo) as repo:
            assert repo.verify(full=True).ok
    kills = sum((c.kills for c in checkers), Counter())
    temporary = sum((c.temporary for c in checkers), Counter())
    unreferenced = sum((c.unreferenced for c in checkers), Counter())
    print(f"fault-point kills: {dict(kills)} = {sum(kills.values())} in {time.monotonic() - started:.1f} s; "
          f"checks that saw temporary files: {dict(temporary)}; unreferenced packs: {dict(unreferenced)}")
    assert sum(kills.values()) >= 24
    # A kill between writing a pack and its transaction leaves leftovers that verify lists.
    assert sum(temporary.values()) > 0 and sum(unreferenced.values()) > 0


def test_kill_at_random_moments(server: ForkServer, tmp_path: Path) -> None:
    started = time.monotonic()
    rng = random.Random(RANDOM_SEED)
    chk = Checker(tmp_path / "random", tmp_path / "random.log")
    chk.continues(server, "start")  # creates the repository and commits counter 0
    for k in range(RANDOM_KILLS):
        pid = server.start(chk.repo, chk.log)
        time.sleep(rng.uniform(0.0, 0.25))
        os.kill(pid, signal.SIGKILL)
        _killed(server.wait(pid), f"random kill {k}")
        chk.kills["random"] += 1
        chk.check(f"random kill {k}")
        chk.continues(server, f"random kill {k}")
    chk.check("random end")
    with ckptrepo.Repo.open(chk.repo) as repo:
        assert repo.verify(full=True).ok
    print(f"random kills: {RANDOM_KILLS} in {time.monotonic() - started:.1f} s, {chk.top + 1} commits; "
          f"checks that saw temporary files: {chk.temporary.total()}, unreferenced packs: {chk.unreferenced.total()}")


# Repack of 6 commits (~300 raw chunks in ~80 deferred packs of 256 KiB): fault point -> hit
# counts to kill at, in the first and in later batches.
REPACK_SCHEDULE: dict[str, tuple[int, ...]] = {
    "repack.chunk": (1, 50, 200),
    "pack.write": (1, 60, 180),
    "pack.before_put": (1, 5, 20),
    "pack.after_put": (1, 6, 21),
    "repack.before_commit": (1, 7),
    "repack.after_commit": (1, 8),
}


def test_kill_repack_at_every_fault_point(server: ForkServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL a repacking process at each of its fault points: every commit still restores
    bit-exactly, verify finds no error, and a later repack and gc finish the job."""
    monkeypatch.setenv("CKPT_IDLE_REPACK", "0")  # commits in this process leave their raw packs to the repack
    for point, nths in REPACK_SCHEDULE.items():
        chk = Checker(tmp_path / point, tmp_path / f"{point}.log")
        child.run(chk.repo, chk.log, 6)
        chk.check(f"{point} before")
        for nth in nths:
            spec = f"{point}=kill@{nth}"
            _killed(server.wait(server.start(chk.repo, chk.log, spec=spec, mode="repack")), spec)
            chk.kills[point] += 1
            chk.check(spec)
        end = server.wait(server.start(chk.repo, chk.log, mode="repack"))
        assert end.get("exit") == 0, f"{point}: the repack after the kills failed: {end}"
        with ckptrepo.Repo.open(chk.repo) as repo:
            assert repo.repack(dry_run=True).deferred_packs == 0
            repo.gc(grace=0)
        chk.check(f"{point} end")
        chk.continues(server, point)
        with ckptrepo.Repo.open(chk.repo) as repo:
            report = repo.verify(full=True)
            assert report.ok and not report.unreferenced_packs and not report.temporary_files, report.to_json()


def _fresh_state(seed: int) -> dict[str, torch.Tensor]:
    """A state whose 40 chunks of 64 KiB are all new: its commit shares none with earlier ones."""
    return {"w": torch.randn(40 * 16384, generator=torch.Generator().manual_seed(seed)),
            "step": torch.tensor(seed)}


def test_kill_while_indexing_pending_layouts(server: ForkServer, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL a process indexing pending layouts (``db.pending``, two per transaction) in its
    first, second and third transaction: each layout stays pending or is indexed whole, every
    commit restores bit-exactly, verify finds no error, and reading afterwards indexes the rest."""
    monkeypatch.setenv("CKPT_IDLE_REPACK", "0")  # no idle job indexes the commits' layouts meanwhile
    path, log = tmp_path / "index", tmp_path / "index.log"
    committed: dict[str, dict[str, Any]] = {}
    for round_, nth in enumerate((1, 3, 5)):
        with ckptrepo.Repo.init(path, chunk_size=child.CHUNK, pack_target=child.PACK_TARGET) if round_ == 0 \
                else ckptrepo.Repo.open(path) as repo:
            for i in range(6):
                state = _fresh_state(100 * round_ + i)
                committed[repo.commit(state, step=100 * round_ + i).wait().id] = _fingerprint(state)
            with parts(repo).sessions() as s:
                before = pending.count(s)
        assert before >= 5  # all but a reopened repository's first commit
        spec = f"db.index_pending=kill@{nth}"
        _killed(server.wait(server.start(path, log, spec=spec, mode="index")), spec)
        with ckptrepo.Repo.open(path) as repo:
            with parts(repo).sessions() as s:
                assert pending.count(s) == before - 2 * ((nth - 1) // 2), spec
            for cid, fingerprint in committed.items():
                assert _fingerprint(repo.checkout(cid)) == fingerprint, f"{spec}: {cid} restores wrong"
            with parts(repo).sessions() as s:
                assert pending.count(s) == 0
            report = repo.verify(full=True)
            assert report.ok, (spec, report.to_json())
