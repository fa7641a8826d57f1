"""The store's identity: which repository a store belongs to.

Object ``repository.json`` at the root of the store: ``{"format": 1, "repo_id", "created_at",
"checksum"}``, written when the repository is created (``claim``). A store holds one
repository: packs, manifests and journal entries carry no owner of their own, so a second
repository on the same store would read the first one's manifests as its own commits and its
``gc`` would delete the other's packs. Hence:

- ``claim`` (at ``init``) refuses a store that names another repository, or that holds objects
  but no identity (a store in use by a repository made before identities), with ``StoreInUse``;
- ``check`` (before ``gc``, ``prune``, a rebuild and a process's first commit) refuses a store
  that names another repository; a store with no identity (made before identities) is claimed
  by the repository that uses it, and a damaged identity is an ``IntegrityError``.

Two processes creating repositories on one empty store at the same instant can both find it
free; the one whose write lands second owns it, and the other's first ``check`` refuses it.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ckptrepo.errors import IntegrityError, StoreInUse, storage_failure
from ckptrepo.ledger import fields as f
from ckptrepo.storage.base import Backend

KEY = "repository.json"
FORMAT = 1
CLAIMED = "store_identity"  # the ``repo_meta`` key a database holds once its store names it: its loss is damage
_OWNED_PREFIXES = ("packs/", "manifests/", "journal/")


def read(backend: Backend) -> str | None:
    """The id of the repository the store belongs to, or None when it has no identity;
    IntegrityError when the identity object is damaged."""
    if not backend.exists(KEY):
        return None
    data = backend.get(KEY)
    try:
        value = f.need_dict(json.loads(data) if len(data) < 1 << 16 else None, "it")
        f.check_sum(value, required=True)
        if value.get("format") != FORMAT:
            raise f.Invalid(f"it is not of format {FORMAT}")
        repo_id = f.need_str(f.need(value, "repo_id"), "its repo_id")
    except (ValueError, f.Invalid) as exc:
        raise IntegrityError(f"the store's identity {KEY} is damaged: {exc}",
                             hint="Restore it from a backup, or delete it if you know which repository the "
                             "store is: that repository's next commit, prune or gc writes it again.") from exc
    assert repo_id is not None
    return repo_id


def _write(backend: Backend, repo_id: str) -> None:
    value: dict[str, Any] = {"format": FORMAT, "repo_id": repo_id, "created_at": time.time()}
    value[f.CHECKSUM] = f.checksum(value)
    try:
        backend.put_bytes(KEY, json.dumps(value, sort_keys=True, separators=(",", ":")).encode())
    except OSError as exc:
        raise storage_failure(exc) from exc


def _refuse(backend: Backend, found: str, repo_id: str) -> StoreInUse:
    return StoreInUse(url=backend.url, found=found, expected=repo_id)


def claim(backend: Backend, repo_id: str) -> None:
    """Make the store repository ``repo_id``'s (``init``); StoreInUse when it is another's, or
    holds objects without an identity. Nothing is written then."""
    found = read(backend)
    if found is not None and found != repo_id:
        raise _refuse(backend, found, repo_id)
    if found is None:
        for prefix in _OWNED_PREFIXES:
            if next(iter(backend.list(prefix)), None) is not None:
                raise _refuse(backend, "unknown (the store holds a repository's objects but no identity)", repo_id)
        _write(backend, repo_id)
    _confirm(backend, repo_id)


def check(backend: Backend, repo_id: str) -> None:
    """Refuse (StoreInUse) a store that belongs to another repository; claim one with no identity
    (made before identities existed) for ``repo_id``."""
    found = read(backend)
    if found is None:
        _write(backend, repo_id)
        _confirm(backend, repo_id)
    elif found != repo_id:
        raise _refuse(backend, found, repo_id)


def _confirm(backend: Backend, repo_id: str) -> None:
    # Read back: of two repositories claiming one store at once, the later write wins, and the
    # earlier claimant learns it here rather than at its first gc.
    found = read(backend)
    if found != repo_id:
        raise _refuse(backend, str(found), repo_id)
