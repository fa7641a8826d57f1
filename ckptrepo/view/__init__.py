"""Commits read in place, as files: an fsspec filesystem and a FUSE mount over ``Repo.view``.

``CkptrepoFileSystem`` (protocol ``ckptrepo``, URLs ``ckptrepo://PATH@REV/FILE``: ``urls``)
serves each commit as the folder its export would write, through fsspec; ``mount`` (and
``ckpt mount``) presents one commit read-only at a local folder through FUSE (``fuse_mount``), so
programs that read plain files (``from_pretrained``, ``safe_open``'s memory map, DCP's
``HuggingFaceStorageReader``) load it in place. Both read through ``Repo.view``: only the
chunks a read touches, each verified against its id. Uses the public API only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ckptrepo.view.urls import parse, url

if TYPE_CHECKING:
    from ckptrepo.view.fs import CkptrepoFileSystem
    from ckptrepo.view.fuse_mount import mount

__all__ = ["CkptrepoFileSystem", "mount", "parse", "url"]


def __getattr__(name: str) -> Any:  # fsspec and fusepy are imported by what needs them
    if name == "CkptrepoFileSystem":
        from ckptrepo.view.fs import CkptrepoFileSystem

        return CkptrepoFileSystem
    if name == "mount":
        from ckptrepo.view.fuse_mount import mount

        return mount
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
