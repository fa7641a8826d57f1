"""Write what the store lacks for a rebuild: manifests of commits made before commits wrote
them, manifests that are damaged or of format 1 (``ledger.manifest``), and journal entries that
pin today's refs and pruned marks.

Each such manifest is built from the database (which this repair trusts), checked through the
manifest chain before it is written (a commit whose rows do not hash to its id is left as it
is, and counted), and the format-1 object of the commit, if any, removed after it: the
commit's row, edges, metrics, entries and tensors with their chunk lists (a tensor whose chunk
list gc dropped gets none: its commit is pruned). Such a commit's branch move is not known; its
manifest says it moved its recorded branch from its first parent, and one journal entry per ref
(and one prune entry) written after them make a rebuild end where the database is now, whatever
those moves replay to.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from ckptrepo.db import catalog
from ckptrepo.db.engine import write_transaction
from ckptrepo.db.models import Commit, JournalKey, Ref, RepoMeta
from ckptrepo.errors import CkptError
from ckptrepo.ledger import journal, leases, manifest
from ckptrepo.storage.base import Backend


@dataclass(frozen=True)
class Backfill:
    """``written``: manifests written (missing, damaged or of format 1 before); ``unusable``:
    commits whose database rows do not make a manifest that passes its checks (``verify`` reports
    them); ``journal_entries``: entries written to pin refs and pruned marks."""

    written: int
    unusable: int
    journal_entries: int


def write_missing(reading: Callable[[], AbstractContextManager[Session]], sessions: sessionmaker[Session],
                  backend: Backend) -> Backfill:
    """Write a manifest for every commit whose manifest is missing, damaged or of format 1; then,
    if any was written or a journal entry the database recorded is gone from the store, journal
    entries that pin every ref, the pruned marks and the retention setting, recorded in one write
    transaction that also forgets the lost entries' keys. ``reading``: sessions that see no
    pending layout."""
    stored = dict(manifest.stored(backend))
    written = unusable = 0
    with reading() as s:
        ids = list(s.scalars(select(Commit.id).where(Commit.damage.is_(None)).order_by(Commit.generation, Commit.id)))
        for cid in ids:
            if cid in stored and _usable(backend, cid):
                continue
            body = manifest_of(s, cid)
            try:
                manifest.read_bytes(manifest.encode(body), cid)
            except CkptError:
                unusable += 1
                continue
            manifest.write(backend, body)
            with contextlib.suppress(CkptError, OSError):  # format 1's object: replaced by the one just written
                backend.delete(manifest.key_of(cid, legacy=True))
            written += 1
        in_store = set(backend.list(journal.PREFIX))
        gone = sorted(k for k in s.scalars(select(JournalKey.key)) if k not in in_store)
        if not written and not gone:
            return Backfill(0, unusable, 0)
        refs = list(s.execute(select(Ref.kind, Ref.name, Ref.commit_id).order_by(Ref.kind, Ref.name)))
        pruned = sorted(s.scalars(select(Commit.id).where(Commit.pruned.is_(True))))
        rules = s.scalar(select(RepoMeta.value).where(RepoMeta.key == "retention"))
    lease = leases.Lease(backend, "backfill")  # the entries are leftovers to gc until recorded
    lease.take()
    try:
        keys = [journal.append(backend, {"op": "ref", "kind": kind, "name": name, "to": target})
                for kind, name, target in refs]
        if pruned:
            keys.append(journal.append(backend, {"op": "prune", "commits": pruned}))
        if rules is not None:
            keys.append(journal.append(backend, {"op": "retention", "rules": json.loads(rules)}))
        with write_transaction(sessions) as w:
            for key in keys:
                catalog.record_journal_key(w, key)
            for start in range(0, len(gone), 500):
                w.execute(delete(JournalKey).where(JournalKey.key.in_(gone[start : start + 500])))
    finally:
        lease.release()
    return Backfill(written, unusable, len(keys))


def _usable(backend: Backend, cid: str) -> bool:
    """Whether commit ``cid``'s stored manifest is of the current format and passes its checks."""
    try:
        return bool(manifest.read(backend, cid)["format"] == manifest.FORMAT)
    except CkptError:
        return False


def manifest_of(s: Session, cid: str) -> dict[str, Any]:
    """Commit ``cid``'s manifest built from the database (``s`` sees no pending layout); its move
    says it moved its recorded branch from its first parent."""
    commit = s.get(Commit, cid)
    assert commit is not None
    row = {name: getattr(commit, name) for name in ("id", *manifest.COMMIT_FIELDS)}
    edges = [[e.parent_id, e.kind, e.position, e.mapping] for e in catalog.parents_of(s, cid)]
    metrics = catalog.metrics_of(s, [cid]).get(cid, {})
    items = catalog.tensors_of(s, cid)
    entries = {name: tensor.tensor_id for name, (tensor, _) in items.items()}
    tensors = {tensor.tensor_id: tensor for tensor, _ in items.values()}
    return manifest.build(row, edges, metrics, entries, tensors.values(), branch=commit.branch or "main",
                          expected=commit.first_parent_id, at=commit.created_at.timestamp())
