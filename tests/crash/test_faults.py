"""Error paths of the write path, in-process: a failure at any step leaves the repository as it was.

``faults.inject(point, "raise")`` makes each named step fail once; a wrapped backend fails
``put_file`` with ENOSPC. After the failure the commit's caller has seen the error, log,
refs and stats are unchanged (a failure after the transaction committed is the one
exception: the commit is then complete and visible, reported as CommitReadFailed),
``verify()`` finds no error (packs already put are unreferenced: warnings), and the next
commit succeeds (``wait()`` already re-raised the failure, so ``commit()`` does not).
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptrepo
from ckptrepo import errors, faults
from ckptrepo.storage import Backend
from ckptrepo.testing import assert_states_equal, parts

CHUNK = 64 * 1024


def _state(n: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(n)
    return {"w": torch.randn(16 * CHUNK // 4, generator=g), "b": torch.randn(100, generator=g), "n": n}


@pytest.fixture
def repo(tmp_path: Path, db_url: str) -> Iterator[ckptrepo.Repo]:
    with ckptrepo.Repo.init(tmp_path / "work", db_url=db_url, chunk_size=CHUNK, pack_target=4 * CHUNK) as r:
        r.commit(_state(0), metrics={"counter": 0}).wait()
        yield r


def _commit_next(repo: ckptrepo.Repo, n: int) -> ckptrepo.Commit:
    """The next commit after a failed one whose error ``wait()`` already re-raised: it commits
    (a failure the caller has seen is not reported again)."""
    return repo.commit(_state(n), metrics={"counter": n}).wait()


def _snapshot(repo: ckptrepo.Repo) -> tuple[Any, ...]:
    return repo.stats(), [c.id for c in repo.log()], repo.branches(), repo.tags()


@pytest.mark.parametrize("point", faults.POINTS)
def test_a_failure_at_any_step_changes_nothing(repo: ckptrepo.Repo, point: str) -> None:
    before = _snapshot(repo)
    expected = errors.CommitReadFailed if point == "db.after_commit" else faults.InjectedFault
    with faults.inject(point, "raise"), pytest.raises(expected):
        repo.commit(_state(1), metrics={"counter": 1}).wait()
    if point == "db.after_commit":
        # The transaction had committed: the commit is complete and visible, as after a crash there.
        stats, log, _, _ = _snapshot(repo)
        assert log[1:] == before[1] and stats.commits == before[0].commits + 1
        assert_states_equal(repo.checkout(log[0]), _state(1))
    else:
        assert _snapshot(repo) == before
    report = repo.verify(full=True)
    assert report.ok, report.to_json()
    assert not report.temporary_files  # a failed pack write removes its temporary file
    if point in ("pack.after_put", "db.before_commit"):
        assert report.unreferenced_packs  # packs put before the failure stay for gc
    commit = _commit_next(repo, 2)
    assert repo.log()[0].id == commit.id
    assert_states_equal(repo.checkout("main"), _state(2))
    assert repo.verify().ok


class _FullDisk:
    """A backend whose ``put_file`` fails with ENOSPC from the ``fail_from``-th call on."""

    def __init__(self, inner: Backend, fail_from: int) -> None:
        self._inner = inner
        self._fail_from = fail_from
        self.calls = 0

    def put_file(self, key: str, local_path: Path) -> None:
        self.calls += 1
        if self.calls >= self._fail_from:
            raise OSError(errno.ENOSPC, "No space left on device", str(local_path))
        self._inner.put_file(key, local_path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.mark.parametrize("fail_from", [1, 3])
def test_full_disk_surfaces_as_an_error_and_changes_nothing(repo: ckptrepo.Repo, fail_from: int) -> None:
    before = _snapshot(repo)
    real = parts(repo).backend
    full = _FullDisk(real, fail_from)
    writer = parts(repo).writer
    writer._backend = writer.snapshots()._backend = full  # where the commit engine writes packs
    try:
        with pytest.raises((OSError, errors.CkptError)) as caught:
            repo.commit(_state(1), metrics={"counter": 1}).wait()
    finally:
        writer._backend = writer.snapshots()._backend = real
    assert full.calls == fail_from
    text = f"{caught.value} {caught.value.__cause__}"
    assert "No space left" in text or "ENOSPC" in text or str(errno.ENOSPC) in text
    assert _snapshot(repo) == before
    report = repo.verify(full=True)
    assert report.ok and not report.temporary_files, report.to_json()
    assert len(report.unreferenced_packs) == fail_from - 1
    commit = _commit_next(repo, 2)
    assert repo.log()[0].id == commit.id
    assert_states_equal(repo.checkout(commit.id), _state(2))
