"""What a clone takes from its remote before it exists: the repository id and the settings that
make its commits deduplicate against the remote's (``remote.refs.SHARED_SETTINGS``)."""

from __future__ import annotations

from typing import Any

from ckptrepo.config import RepoConfig
from ckptrepo.errors import IntegrityError, UsageError
from ckptrepo.ledger import identity
from ckptrepo.remote import refs
from ckptrepo.remote.stores import normalize, open_remote
from ckptrepo.types import RemoteInfo


def settings_of(url: str, name: str) -> tuple[RemoteInfo, dict[str, Any]]:
    """The remote a clone of ``url`` records (named ``name``, read through: ``lazy``) and the
    settings of the clone's ``RepoConfig`` (``repo_id`` included). UsageError when the store
    holds no repository; IntegrityError when its identity or marker is damaged."""
    store = open_remote(url)
    try:
        repo_id = identity.read(store.backend)
        if repo_id is None:
            raise UsageError(f"{url} holds no repository to clone",
                             hint="Give the folder or s3:// prefix a `ckpt push` wrote to, or a repository folder.")
        if store.working and store.repo_dir is not None:
            theirs = RepoConfig.load(store.repo_dir)
            shared = {k: getattr(theirs, k) for k in refs.SHARED_SETTINGS}
        else:
            marker = refs.read_marker(store.backend)
            shared = dict(marker["config"]) if marker is not None else {}
        settings = {k: v for k, v in shared.items() if k in refs.SHARED_SETTINGS}
        try:
            RepoConfig.of(**settings).validate()
        except (UsageError, TypeError) as exc:
            raise IntegrityError(f"the settings the remote {url} records are not usable: {exc}") from exc
        settings["repo_id"] = repo_id
        return RemoteInfo(name=name, url=normalize(url), lazy=True), settings
    finally:
        store.close()
