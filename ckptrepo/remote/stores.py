"""Opening a remote's store from its URL.

A URL is an ``s3://BUCKET/PREFIX[?endpoint_url=...]`` prefix, a ``file://`` URL or a folder path
(``memory://NAME`` in tests). A folder that holds a repository (``PATH/.ckpt``, or a ``.ckpt``
folder itself) stands for that repository's store: it can be fetched and cloned from like a
remote made by ``push`` (its refs are replayed from its manifests and journal), but not pushed
to (``RemoteNotBare``), since its own database would not know what a push added.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from ckptrepo.config import CONFIG_NAME, REPO_DIRNAME, RepoConfig
from ckptrepo.errors import UsageError
from ckptrepo.storage import open_backend
from ckptrepo.storage.base import Backend


@dataclass
class RemoteStore:
    """An open remote: its store, and ``working``: the store of a repository someone works in
    (its ``.ckpt`` folder: ``repo_dir``), not one made by ``push``."""

    backend: Backend
    working: bool = False
    repo_dir: Path | None = None

    def close(self) -> None:
        self.backend.close()


def _folder(url: str) -> Path | None:
    """The local folder ``url`` names, or None for a URL of another scheme."""
    scheme, sep, _ = url.partition("://")
    if not sep:
        return Path(url).expanduser()
    if scheme.lower() == "file":
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise UsageError(f"remote URL {url!r} names host {parts.netloc!r}; file:// URLs are local")
        return Path(unquote(parts.path))
    return None


def normalize(url: str) -> str:
    """The URL as stored in ``remotes.json``: a folder as an absolute path, others as given."""
    if not isinstance(url, str) or not url.strip():
        raise UsageError("empty remote URL", hint="Give a folder path or s3://BUCKET/PREFIX.")
    folder = _folder(url)
    return str(folder.resolve()) if folder is not None else url


def open_remote(url: str) -> RemoteStore:
    """The store ``url`` names (module docstring). An ``s3://`` store is checked with one request
    (StorageError with a hint when unreachable) and stages uploads in a private temporary folder;
    a folder that does not exist yet is made by the first write."""
    folder = _folder(url)
    if folder is not None:
        folder = folder.resolve()
        repo_dir = folder if folder.name == REPO_DIRNAME and (folder / CONFIG_NAME).is_file() else (
            folder / REPO_DIRNAME if (folder / REPO_DIRNAME / CONFIG_NAME).is_file() else None)
        if repo_dir is not None:
            config = RepoConfig.load(repo_dir)
            return RemoteStore(open_backend(config.store_url, repo_dir / "store"), working=True, repo_dir=repo_dir)
        return RemoteStore(open_backend(str(folder), folder))
    if url.lower().startswith("s3://"):
        from ckptrepo.storage.s3 import S3Backend

        store = S3Backend.from_url(url)
        try:
            store.check()
        except BaseException:
            store.close()
            raise
        return RemoteStore(store)
    return RemoteStore(open_backend(url, Path(".")))
