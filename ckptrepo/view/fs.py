"""``CkptrepoFileSystem``: an fsspec filesystem over commits, read-only, protocol ``ckptrepo``.

``fsspec.open("ckptrepo:///data/runs@main/model.safetensors")``, ``fs.ls("ckptrepo:///data/runs@v1")``,
``fs.cat_file(url, start, end)``: every commit is a folder holding the files its export would
(``Repo.view``, layout ``auto`` unless the filesystem is made with another), served from its
chunks, every chunk verified. URLs: ``ckptrepo.view.urls``. Registered through the
``fsspec.specs`` entry point; ``fsspec.filesystem("ckptrepo", repo=PATH, rev=REV)`` also takes
plain file paths of that one view.

One instance opens each repository once (read-only) and pins each revision to the commit it
named at its first use, so the files of one view stay consistent while its branch moves on;
``invalidate_cache()`` forgets the pins (and the decoded chunks). Thread-safe. Every write
(``open(..., "wb")``, ``pipe``, ``put``, ``rm``, ``mkdir``, ``touch``, ``mv``) raises
``ReadOnlyView`` (a ``PermissionError``); a missing file or folder raises ``UnknownFile``
(a ``FileNotFoundError``).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

import ckptrepo
from ckptrepo.errors import ReadOnlyView, UnknownFile
from ckptrepo.view import urls

if TYPE_CHECKING:
    from ckptrepo.restore.view import CommitView


class CkptrepoFileSystem(AbstractFileSystem):  # type: ignore[misc]  # fsspec is untyped
    """Read-only files of commits (module docstring). ``layout``: the views' layout (``auto``,
    ``hf``, ``safetensors``); ``repo``/``rev``: the view that plain paths (no ``@``) name."""

    protocol = PROTOCOL = urls.PROTOCOL
    root_marker = ""

    def __init__(self, *args: Any, layout: str = "auto", max_shard_size: int | str = "5GB",
                 repo: str | None = None, rev: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.layout = layout
        self.max_shard_size = max_shard_size
        self.default = (str(repo), rev or "main") if repo is not None else None
        self._repos: dict[str, ckptrepo.Repo] = {}
        self._views: dict[tuple[str, str], CommitView] = {}
        self._lock = threading.RLock()

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]  # type: ignore[return-value]
        return urls.strip(str(path))

    # -- resolving a path ----------------------------------------------------------------------

    def _locate(self, path: str) -> tuple[urls.Location, CommitView]:
        path = self._strip_protocol(path)
        if "@" not in path and self.default is not None:
            where = urls.Location(self.default[0], self.default[1], path.strip("/"))
        else:
            where = urls.parse(path)
        return where, self.view(where.repo, where.rev)

    def repo(self, path: str) -> ckptrepo.Repo:
        """The repository at ``path``, opened read-only once per filesystem."""
        key = str(Path(path).absolute())
        with self._lock:
            found = self._repos.get(key)
            if found is None:
                found = self._repos[key] = ckptrepo.Repo.open(key, read_only=True)
            return found

    def view(self, repo: str, rev: str) -> CommitView:
        """The view of ``rev`` in the repository at ``repo``, pinned at its first use."""
        key = (str(Path(repo).absolute()), rev)
        with self._lock:
            found = self._views.get(key)
            if found is None:
                found = self.repo(repo).view(rev, layout=self.layout, max_shard_size=self.max_shard_size)
                self._views[key] = found
            return found

    def _name(self, where: urls.Location, file: str) -> str:
        if self.default is not None and where.repo == self.default[0] and where.rev == self.default[1]:
            return file
        return urls.url(where.repo, where.rev, file, protocol=False)

    # -- reading ------------------------------------------------------------------------------

    def _entry(self, where: urls.Location, view: CommitView, file: str) -> dict[str, Any]:
        name = self._name(where, file)
        if file in view.files:
            return {"name": name, "size": view.files[file].size, "type": "file", "commit": view.commit_id}
        if file in view.dirs:
            return {"name": name, "size": 0, "type": "directory", "commit": view.commit_id}
        raise UnknownFile(name=file, commit=view.commit_id[:10])

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        where, view = self._locate(path)
        if where.file in view.files:
            found = [self._entry(where, view, where.file)]
        else:
            prefix = where.file + "/" if where.file else ""
            found = [self._entry(where, view, prefix + n) for n in view.listdir(where.file)]
        return found if detail else [e["name"] for e in found]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        where, view = self._locate(path)
        return self._entry(where, view, where.file)

    def ukey(self, path: str) -> str:
        where, view = self._locate(path)
        return f"{view.commit_id}/{view.layout}/{where.file}"

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        where, view = self._locate(path)
        size = view.file(where.file).size
        lo = 0 if start is None else start + size if start < 0 else start
        hi = size if end is None else end + size if end < 0 else end
        return view.read(where.file, max(lo, 0), max(hi, 0))

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, autocommit: bool = True,
              cache_options: Any = None, **kwargs: Any) -> ViewFile:
        if mode != "rb":
            raise ReadOnlyView(what=f"open {path!r} in mode {mode!r}")
        where, view = self._locate(path)
        return ViewFile(self, path, view, where.file, block_size=block_size, cache_options=cache_options,
                        **kwargs)

    def invalidate_cache(self, path: str | None = None) -> None:
        """Forget the views' pinned commits and decoded chunks (the next use resolves revisions again)."""
        with self._lock:
            self._views.clear()
        super().invalidate_cache(path)

    # -- writing: refused ---------------------------------------------------------------------

    def _refuse(self, what: str, *args: Any, **kwargs: Any) -> Any:
        raise ReadOnlyView(what=what)

    def pipe_file(self, path: str, *args: Any, **kwargs: Any) -> Any:
        self._refuse(f"write {path!r}")

    def put_file(self, lpath: str, rpath: str, *args: Any, **kwargs: Any) -> Any:
        self._refuse(f"write {rpath!r}")

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> Any:
        self._refuse(f"copy to {path2!r}")

    def mv(self, path1: str, path2: str, *args: Any, **kwargs: Any) -> Any:
        self._refuse(f"move {path1!r}")

    def rm_file(self, path: str) -> Any:
        self._refuse(f"remove {path!r}")

    def rm(self, path: str, *args: Any, **kwargs: Any) -> Any:
        self._refuse(f"remove {path!r}")

    def rmdir(self, path: str) -> Any:
        self._refuse(f"remove {path!r}")

    def mkdir(self, path: str, *args: Any, **kwargs: Any) -> Any:
        self._refuse(f"make folder {path!r}")

    def makedirs(self, path: str, exist_ok: bool = False) -> Any:
        self._refuse(f"make folder {path!r}")

    def touch(self, path: str, *args: Any, **kwargs: Any) -> Any:
        self._refuse(f"write {path!r}")


class ViewFile(AbstractBufferedFile):  # type: ignore[misc]  # fsspec is untyped
    """A file of a view opened for reading: fsspec's buffered file over ``CommitView.read``."""

    def __init__(self, fs: CkptrepoFileSystem, path: str, view: CommitView, file: str, **kwargs: Any) -> None:
        self._view, self._file = view, file
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        super().__init__(fs, path, mode="rb", size=view.file(file).size, **kwargs)

    def _fetch_range(self, start: int, end: int) -> bytes:
        return self._view.read(self._file, start, end)
