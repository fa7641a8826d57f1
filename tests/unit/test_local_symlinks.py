"""The local store never lists, enters or deletes through a symbolic link below its root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckptrepo.errors import StorageError
from ckptrepo.storage import LocalBackend


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside the store holding a file and a sub-folder with a file."""
    out = tmp_path / "outside"
    (out / "ab").mkdir(parents=True)
    (out / "victim.pack").write_bytes(b"not the store's")
    (out / "ab" / "victim.pack").write_bytes(b"not the store's either")
    return out


def test_list_neither_lists_a_link_nor_enters_a_linked_folder(tmp_path: Path, outside: Path) -> None:
    store = LocalBackend(tmp_path / "store")
    store.put_bytes("packs/cd/real.pack", b"mine")
    (store.root / "packs" / "ab").symlink_to(outside / "ab", target_is_directory=True)
    (store.root / "packs" / "cd" / "link.pack").symlink_to(outside / "victim.pack")
    (store.root / "manifests").symlink_to(outside, target_is_directory=True)
    assert list(store.list("")) == ["packs/cd/real.pack"]
    assert list(store.list("packs/")) == ["packs/cd/real.pack"]
    assert list(store.list("packs/ab/")) == []  # the prefix's own folder is a link
    assert list(store.list("manifests/ab/")) == []
    assert list(store.list("pac")) == ["packs/cd/real.pack"]


def test_delete_never_removes_anything_outside_the_store(tmp_path: Path, outside: Path) -> None:
    store = LocalBackend(tmp_path / "store")
    store.put_bytes("packs/cd/real.pack", b"mine")
    (store.root / "packs" / "ab").symlink_to(outside / "ab", target_is_directory=True)
    (store.root / "packs" / "cd" / "link.pack").symlink_to(outside / "victim.pack")
    with pytest.raises(StorageError, match="symbolic link"):
        store.delete("packs/ab/victim.pack")
    assert (outside / "ab" / "victim.pack").exists()
    store.delete("packs/cd/link.pack")  # a key that is a link: the link goes, not its target
    assert not os.path.lexists(store.root / "packs" / "cd" / "link.pack")
    assert (outside / "victim.pack").read_bytes() == b"not the store's"
    store.delete("packs/cd/real.pack")
    store.delete("packs/cd/real.pack")  # missing: no error
    store.delete("packs/zz/never.pack")
    assert not (store.root / "packs" / "cd" / "real.pack").exists()


def test_a_store_whose_root_is_a_link_works_as_usual(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "root").symlink_to(real, target_is_directory=True)
    store = LocalBackend(tmp_path / "root")
    store.put_bytes("packs/ab/x.pack", b"x")
    assert list(store.list("packs/")) == ["packs/ab/x.pack"]
    store.delete("packs/ab/x.pack")
    assert list(store.list("")) == []
