"""Write what the store lacks for a rebuild: manifests of commits made before commits wrote
them (``ledger.manifest``), and journal entries that pin today's refs and pruned marks.

Each missing manifest is built from the database: the commit's row, edges, metrics, entries and
tensors with their chunk lists (a tensor whose chunk list gc dropped gets none: its commit is
pruned). Such a commit's branch move is not known; its manifest says it moved its recorded
branch from its first parent, and one journal entry per ref (and one prune entry) written after
them make a rebuild end where the database is now, whatever those moves replay to.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from ckptrepo.db import catalog
from ckptrepo.db.models import Commit, Ref
from ckptrepo.ledger import journal, manifest
from ckptrepo.storage.base import Backend


def write_missing(sessions: sessionmaker[Session], backend: Backend) -> int:
    """Write a manifest for every commit without one, then (if any was written) the journal
    entries that pin every ref and pruned mark; returns how many manifests were written."""
    stored = set(manifest.stored_ids(backend))
    with sessions() as s:
        missing = [cid for cid in s.scalars(select(Commit.id).order_by(Commit.generation, Commit.id))
                   if cid not in stored]
        for cid in missing:
            manifest.write(backend, _manifest_of(s, cid))
        if not missing:
            return 0
        for kind, name, target in s.execute(select(Ref.kind, Ref.name, Ref.commit_id).order_by(Ref.kind, Ref.name)):
            journal.append(backend, {"op": "ref", "kind": kind, "name": name, "to": target})
        pruned = sorted(s.scalars(select(Commit.id).where(Commit.pruned.is_(True))))
        if pruned:
            journal.append(backend, {"op": "prune", "commits": pruned})
    return len(missing)


def _manifest_of(s: Session, cid: str) -> dict[str, object]:
    commit = s.get(Commit, cid)
    assert commit is not None
    row = {name: getattr(commit, name) for name in ("id", *manifest.COMMIT_FIELDS)}
    edges = [[e.parent_id, e.kind, e.position, e.mapping] for e in catalog.parents_of(s, cid)]
    metrics = catalog.metrics_of(s, [cid]).get(cid, {})
    layout = catalog.tensor_layout(s, cid)
    lists = catalog.chunk_lists_of(s, [cid])
    entries = {entry.name: tensor.id for entry, tensor in layout}
    tensors = {tensor.id: (tensor.id, tensor.dtype, list(tensor.shape), tensor.nbytes, tensor.chunk_size,
                           tensor.boxes, {k: getattr(tensor, k) for k in manifest.STAT_FIELDS},
                           lists.get(tensor.id, []))
               for _, tensor in layout}
    return manifest.build(row, edges, metrics, entries, list(tensors.values()), branch=commit.branch or "main",
                          expected=commit.first_parent_id, at=commit.created_at.timestamp())
