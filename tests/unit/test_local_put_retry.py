"""A put whose staged file vanishes before its rename is written again.

``gc --grace 0`` deletes temporary files of the staging folder that no live lease covers, and a
lease's own put has no lease yet: a writer's lease put failed with StorageError (a concurrent gc,
tests/crash/test_gc_concurrent.py under load). ``LocalBackend.put_bytes`` now stages the bytes
again; a staged file that is still there when the rename fails is an error as before.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptrepo.errors import StorageError
from ckptrepo.storage import LocalBackend, local


def _vanishing(monkeypatch: pytest.MonkeyPatch, times: int) -> list[Path]:
    """Make the first ``times`` staged files disappear just before ``put_file`` fsyncs them, as a
    concurrent gc would delete them; returns the files removed."""
    removed: list[Path] = []
    real = local.fsync_file

    def fsync(path: Path) -> None:
        if len(removed) < times and Path(path).name.startswith("put-"):
            Path(path).unlink()
            removed.append(Path(path))
        real(path)

    monkeypatch.setattr(local, "fsync_file", fsync)
    return removed


def test_a_staged_file_removed_by_gc_is_written_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = LocalBackend(tmp_path / "store")
    removed = _vanishing(monkeypatch, 2)
    backend.put_bytes("leases/a.json", b"{}")
    assert len(removed) == 2 and backend.get("leases/a.json") == b"{}"
    assert [p.name for p in (tmp_path / "store" / ".staging").iterdir()] == []


def test_a_put_gives_up_after_its_attempts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = LocalBackend(tmp_path / "store")
    removed = _vanishing(monkeypatch, 100)
    with pytest.raises(StorageError, match=r"cannot store 'leases/a\.json'"):
        backend.put_bytes("leases/a.json", b"{}")
    assert len(removed) == local._PUT_ATTEMPTS
    assert not backend.exists("leases/a.json")
