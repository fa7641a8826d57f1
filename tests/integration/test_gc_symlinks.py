"""gc and verify never follow a symbolic link out of the store's staging folder.

A ``.staging`` that is a link to a folder of old files, or links inside it to files and folders
elsewhere: ``gc --grace 0`` deletes nothing through them and leaves them (``links_skipped``),
``verify`` reports each (``store_links``, a warning), and every commit still restores.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import ckptrepo

OLD = time.time() - 30 * 86400


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder of month-old files (one in a sub-folder) outside the repository."""
    out = tmp_path / "precious"
    (out / "deeper").mkdir(parents=True)
    for name in ("a.txt", "pack-x.tmp", "deeper/b.txt"):
        (out / name).write_bytes(name.encode())
        os.utime(out / name, (OLD, OLD))
    return out


@pytest.fixture
def repo(tmp_path: Path, db_url: str) -> Iterator[ckptrepo.Repo]:
    with ckptrepo.Repo.init(tmp_path / "work", db_url=db_url, chunk_size=4096) as r:
        yield r


def _state() -> dict[str, torch.Tensor]:
    return {"w": torch.randn(5000, generator=torch.Generator().manual_seed(3))}


def test_a_staging_folder_that_is_a_link_is_neither_followed_nor_removed(repo: ckptrepo.Repo, outside: Path) -> None:
    cid = repo.commit(_state(), blocking=True).wait().id
    staging = repo.repo_dir / "store" / ".staging"
    if staging.exists():
        staging.rmdir()
    staging.symlink_to(outside, target_is_directory=True)
    before = _files(outside)
    report = repo.gc(grace=0)
    assert _files(outside) == before and staging.is_symlink()
    assert report.links_skipped == 1 and report.temporary_files_removed == 0, report
    found = repo.verify()
    assert found.ok and [p.subject for p in found.store_links] == [str(staging)], found.to_json()
    assert not found.temporary_files  # the files behind the link are not the store's
    assert torch.equal(repo.checkout(cid)["w"], _state()["w"])


def test_links_inside_the_staging_folder_are_left_and_real_leftovers_go(repo: ckptrepo.Repo, outside: Path) -> None:
    repo.commit(_state(), blocking=True).wait()
    staging = repo.repo_dir / "store" / ".staging"
    staging.mkdir(exist_ok=True)
    (staging / "to-folder").symlink_to(outside / "deeper", target_is_directory=True)
    (staging / "pack-link.tmp").symlink_to(outside / "pack-x.tmp")
    (staging / "pack-left.tmp").write_bytes(b"left by a killed writer")
    os.utime(staging / "pack-left.tmp", (OLD, OLD))
    before = _files(outside)
    found = repo.verify()
    assert [p.subject for p in found.temporary_files] == [str(staging / "pack-left.tmp")]
    assert sorted(p.subject for p in found.store_links) == [str(staging / "pack-link.tmp"), str(staging / "to-folder")]
    report = repo.gc(grace=0)
    assert report.temporary_files_removed == 1 and report.links_skipped == 2, report
    assert _files(outside) == before
    assert sorted(p.name for p in staging.iterdir()) == ["pack-link.tmp", "to-folder"]
    assert (staging / "to-folder").is_symlink() and (staging / "pack-link.tmp").is_symlink()
