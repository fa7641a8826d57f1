"""``verify``'s checks of what the store keeps besides packs: the identity, every commit's
manifest and the journal, against the database (``maintenance.verify`` runs them in its read
snapshot, after the packs).

- **identity** (``ledger.identity``): the store names this repository (error when it names
  another or is damaged; a warning when it names none: the next write claims it).
- **manifests**: every commit of the database that is not a damaged node has a manifest
  (``missing_manifest``, an error: a database rebuilt from the store would lose the commit's
  record; the commit itself still restores, so it is not among the problem's ``commits``).
  With ``full``, each is read and put through the manifest chain (``ledger.manifest.decode``)
  and compared with the database's record of the commit: row,
  edges, metrics, entries, and every tensor's dtype, shape, size, chunk size, boxes, statistics
  and chunk ids (``damaged_manifest`` for either); a format-1 one is a warning
  (``outdated_manifest``). ``ckpt db manifests`` rewrites all of these from the database.
- **journal**: every entry the database recorded (``journal_keys``) is in the store
  (``missing_journal_entry``). With ``full``, every entry is read and checked
  (``damaged_journal_entry``), and one the database did not record, written after it started
  recording (``repo_meta.journal_keys_from``), is a warning (``unrecorded_journal_entry``: a
  change interrupted between its entry and its transaction; a rebuild would apply it).
- **damaged commits**: every commit a rebuild marked damaged (``commits.damage``) and that is
  not pruned is an error (``damaged_commit``).

Something found missing is looked up again in a fresh session before it is reported, so that
a commit or ref change that ``gc`` removed while verify ran is not reported as lost.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ckptrepo.db.models import Commit, JournalKey, RepoMeta
from ckptrepo.errors import CkptError
from ckptrepo.ids import short
from ckptrepo.ledger import identity, journal, manifest
from ckptrepo.maintenance import backfill
from ckptrepo.rows import STAT_KEYS
from ckptrepo.storage.base import Backend
from ckptrepo.types import Problem

_FIX_MANIFESTS = "`ckpt db manifests` writes it again from the database"


class LedgerCheck:
    """One verify's checks of identity, manifests and journal (module docstring); ``problems``
    and ``counts`` collect what it found; owned by the verifying thread."""

    def __init__(self, backend: Backend, full: bool) -> None:
        self.backend = backend
        self.full = full
        self.problems: list[Problem] = []
        self.counts: dict[str, int] = {"manifests": 0, "journal_entries": 0}

    def _add(self, kind: str, subject: str, detail: str, commits: Iterable[str] = ()) -> None:
        self.problems.append(Problem(kind, subject, detail, commits=tuple(commits)))

    # -- in the verify snapshot ---------------------------------------------------------------

    def check(self, s: Session) -> None:
        """Run every check; ``s`` is the verify's read snapshot (it sees no pending layout)."""
        self._identity(s)
        self._commits(s)
        self._journal(s)

    def _identity(self, s: Session) -> None:
        meta = {k: v for k, v in s.execute(select(RepoMeta.key, RepoMeta.value).where(
            RepoMeta.key.in_(("repo_id", identity.CLAIMED))))}
        repo_id = meta.get("repo_id")
        try:
            owner = identity.read(self.backend)
        except CkptError as exc:
            self._add("store_identity", identity.KEY, exc.message)
            return
        if owner is None and identity.CLAIMED in meta:
            self._add("store_identity", identity.KEY, f"{identity.KEY} is gone from the store, which named this "
                      "repository; this repository's next commit, prune or gc writes it again")
        elif owner is None:
            self._add("unclaimed_store", identity.KEY, "the store names no repository; this repository's next "
                      "commit, prune or gc claims it")
        elif owner != repo_id:
            self._add("store_identity", identity.KEY, f"the store belongs to repository {owner}, not to this one "
                      f"({repo_id}): its objects are not this repository's")

    def _commits(self, s: Session) -> None:
        stored: dict[str, str] = {}
        for cid, key in manifest.stored(self.backend):
            stored.setdefault(cid, key)  # a commit's format-2 key sorts before its format-1 key
        self.missing: list[str] = []
        rows = s.execute(select(Commit.id, Commit.damage, Commit.pruned).order_by(Commit.id)).all()
        for cid, damage, pruned in rows:
            if damage is not None:
                if not pruned:
                    self._add("damaged_commit", cid, f"commit {short(cid)} is damaged: {damage}", (cid,))
                continue  # a damaged node has no manifest to check
            found = stored.get(cid)
            if found is None:
                self.missing.append(cid)
            elif self.full:
                self._manifest(s, cid, found)

    def _manifest(self, s: Session, cid: str, key: str) -> None:
        self.counts["manifests"] += 1
        try:
            body = manifest.read_bytes(self.backend.get(key), cid, key=key)
        except CkptError as exc:
            self._add("damaged_manifest", key, f"{exc.message}; {_FIX_MANIFESTS}")
            return
        difference = _differs(body, backfill.manifest_of(s, cid))
        if difference is not None:
            self._add("damaged_manifest", key, f"manifest {key} disagrees with the database on {difference}; "
                      f"{_FIX_MANIFESTS}")
        elif body["format"] != manifest.FORMAT:
            self._add("outdated_manifest", key, f"manifest {key} is of format {body['format']} (no checksum); "
                      f"{_FIX_MANIFESTS}")

    def _journal(self, s: Session) -> None:
        recorded = set(s.scalars(select(JournalKey.key)))
        since = int(s.scalar(select(RepoMeta.value).where(RepoMeta.key == "journal_keys_from")) or 0)
        keys = [k for k in self.backend.list(journal.PREFIX) if k.endswith(".json")]
        self.gone_entries = sorted(recorded - set(keys))
        if not self.full:
            return
        for key in keys:
            self.counts["journal_entries"] += 1
            try:
                journal.decode(self.backend.get(key), key)
            except CkptError as exc:
                self._add("damaged_journal_entry", key, exc.message)
                continue
            written = journal.time_of(key)
            if key not in recorded and (written is None or written >= since):
                self._add("unrecorded_journal_entry", key, f"{key}: a change the database does not hold (interrupted "
                          "before its transaction committed, or running now); a rebuild would apply it")

    # -- after the snapshot -------------------------------------------------------------------

    def confirm_missing(self, fresh: Callable[[], AbstractContextManager[Session]]) -> None:
        """Report what the snapshot expected in the store and did not find, if a fresh session
        still expects it (a concurrent gc may have removed the commit and its manifest)."""
        if not self.missing and not self.gone_entries:
            return
        with fresh() as s:
            live = set(s.scalars(select(Commit.id).where(Commit.id.in_(self.missing[:10_000]))))
            if len(self.missing) > 10_000:
                live |= set(self.missing[10_000:])
            still = set(s.scalars(select(JournalKey.key).where(JournalKey.key.in_(self.gone_entries))))
        for cid in self.missing:
            if cid in live and not any(self.backend.exists(manifest.key_of(cid, legacy=old)) for old in (False, True)):
                self._add("missing_manifest", cid, f"commit {short(cid)} has no manifest in the store: a database "
                          f"rebuilt from the store would lose its record (it still restores); {_FIX_MANIFESTS}")
        for key in self.gone_entries:
            if key in still and not self.backend.exists(key):
                self._add("missing_journal_entry", key, f"{key}: the database recorded this ref change, prune, "
                          "setting or annotation, but the store lost it: a rebuild would not replay it "
                          "(`ckpt db manifests` writes entries that pin today's refs)")


def _differs(stored: Mapping[str, Any], rebuilt: Mapping[str, Any]) -> str | None:
    """The first field on which a stored manifest and the one the database makes differ, or None.
    The move is left out (the database does not know which head a commit expected), and so are
    chunk ids the database no longer has (gc dropped a pruned commit's chunk lists)."""
    a, b = stored["commit"], rebuilt["commit"]
    for name in manifest.COMMIT_FIELDS:
        x, y = a[name], b[name]
        if name == "created_at":
            x, y = datetime.fromisoformat(x), datetime.fromisoformat(y)
        if _canonical(x) != _canonical(y):
            return name
    for name in ("edges", "metrics", "entries"):
        if _canonical(stored[name]) != _canonical(rebuilt[name]):
            return name
    others = manifest.tensor_rows(rebuilt)
    for tid, row in manifest.tensor_rows(stored).items():
        other = others.get(tid)
        if other is None:
            return f"tensor {short(tid)}"
        for what in ("dtype", "shape", "nbytes", "chunk_size", "boxes"):
            if _canonical(getattr(row, what)) != _canonical(getattr(other, what)):
                return f"the {what.replace('_', ' ')} of tensor {short(tid)}"
        if not _close_stats(row.stats, other.stats):
            return f"the statistics of tensor {short(tid)}"
        if other.chunk_ids and row.chunk_ids != other.chunk_ids:
            return f"the chunks of tensor {short(tid)}"
    return None


def _close_stats(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two tensors' statistics agree to float rounding: a tensor stored once keeps the
    statistics its first commit took, and a later commit of the same bytes may have summed them in
    another order (its manifest holds its own)."""
    for name in STAT_KEYS:
        x, y = a.get(name), b.get(name)
        if x is None or y is None:
            if x is not y:
                return False
        elif not (math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(x) and math.isnan(y))):
            return False
    return True


def _canonical(value: Any) -> str:
    """``value`` as canonical JSON, every number as a float (a database column may give back 9.0
    for the 9 a commit recorded), NaN as itself."""
    if isinstance(value, datetime):
        return value.isoformat()
    return json.dumps(_floats(value), sort_keys=True, separators=(",", ":"), allow_nan=True)


def _floats(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, dict):
        return {k: _floats(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_floats(v) for v in value]
    return value
