"""``prune``: mark the commits retention rules do not keep as pruned, in one transaction.

What it reads (``lineage_of``): every branch's first-parent line, tags, fork points and the
parents of merge and transfer edges; ``retention.select`` decides. What it writes: only
``commits.pruned = true`` of the commits it drops, in one write transaction
(``engine.write_transaction``) that first indexes the pending layouts (``db.pending``). Nothing
is deleted here: each pruned commit stays a lineage node, its data goes at the next ``gc``
(``maintenance.liveness``), and from the moment the transaction commits its state can no longer
be read (``CommitPruned``, ``restore.layout``).

Journal (``ledger.journal``): right before that transaction, ``{"op": "prune", "commits":
[ids]}`` is stored durably, and taken back if the transaction fails. The selection is made in a
read snapshot first (the journal entry must name the commits), then again inside the
transaction, which marks exactly the commits the entry names: commits that became prunable in
between (newer commits pushed them out) wait for the next run; when one the entry names is to
be kept now (a branch or tag was put on it, a child made it a fork point), the transaction is
rolled back, the entry discarded and the whole tried again (``_ATTEMPTS``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import datetime, timezone
from typing import cast

from sqlalchemy import Table, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from ckptrepo import faults
from ckptrepo.db import catalog, lines, pending, tiers
from ckptrepo.db.engine import write_transaction
from ckptrepo.db.models import Commit, Edge, Metric, Ref
from ckptrepo.errors import ConcurrentChange
from ckptrepo.ledger import journal
from ckptrepo.maintenance import liveness, retention
from ckptrepo.storage import Backend
from ckptrepo.types import PruneReport, RetentionRules

_ATTEMPTS = 5
_BATCH = 500
_COMMITS = cast(Table, Commit.__table__)


def lineage_of(s: Session, metric: str | None) -> retention.Lineage:
    """The records ``retention.select`` needs, read in the caller's session; ``metric``: the
    ``keep_best`` metric whose values the nodes carry."""
    branches: dict[str, str] = {}
    tags: dict[str, str] = {}
    for kind, name, cid in s.execute(select(Ref.kind, Ref.name, Ref.commit_id)):
        (branches if kind == "branch" else tags)[name] = cid
    values: dict[str, float] = {}
    if metric is not None:
        values = {cid: float(v) for cid, v in s.execute(select(Metric.commit_id, Metric.value)
                                                        .where(Metric.name == metric))}
    made: dict[str, retention.Node] = {}
    by_branch: dict[str, list[retention.Node]] = {}
    for name, head in sorted(branches.items()):
        q = lines.chain_commits(head, None, Commit.id, Commit.step, Commit.created_at, Commit.pruned)
        line = []
        for _, cid, step, created, pruned in sorted(s.execute(q), key=lambda row: row[0]):
            node = made.get(cid)
            if node is None:
                node = made[cid] = retention.Node(cid, step, created, values.get(cid), bool(pruned))
            line.append(node)
        by_branch[name] = line
    forks = set(s.scalars(select(Edge.parent_id).group_by(Edge.parent_id).having(func.count() > 1)))
    merged = set(s.scalars(select(Edge.parent_id).where(Edge.kind == "merge").distinct()))
    transferred = set(s.scalars(select(Edge.parent_id).where(Edge.kind == "transfer").distinct()))
    return retention.Lineage(by_branch, tags, forks, merged, transferred)


def _select(s: Session, rules: RetentionRules, now: datetime) -> retention.Selection:
    found = retention.select(lineage_of(s, rules.keep_best[0] if rules.keep_best else None), rules, now)
    # With a replica remote: never the only copy of a commit, never the durable tier's recovery point.
    keep = tiers.protected(s)
    if not keep or not keep.keys() & set(found.pruned):
        return found
    kept = dict(found.kept)
    for cid in found.pruned:
        if cid in keep:
            kept[cid] = (keep[cid],)
    return replace(found, kept=kept, pruned=tuple(c for c in found.pruned if c not in keep))


def _mark(s: Session, ids: tuple[str, ...]) -> None:
    for start in range(0, len(ids), _BATCH):
        s.execute(update(_COMMITS).where(_COMMITS.c.id.in_(ids[start : start + _BATCH])).values(pruned=True))


class _Rollback(Exception):
    """Raised inside the transaction to roll it back (a dry run, or a selection that changed)."""

    def __init__(self, found: retention.Selection, freeable: liveness.Freeable) -> None:
        super().__init__("rolled back")
        self.found, self.freeable = found, freeable


def prune(sessions: sessionmaker[Session], reading: Callable[[], AbstractContextManager[Session]],
          backend: Backend, rules: RetentionRules, *, dry_run: bool = False,
          now: datetime | None = None) -> PruneReport:
    """Mark as pruned the commits ``rules`` (validated: ``retention.rules``) do not keep; see
    the module docstring. ``reading``: sessions without pending layouts (``db.pending.reading``),
    for the estimate when nothing is to be marked. ``dry_run``: the same report, nothing
    changed (the marks are made and the estimate taken in a transaction that is rolled back).
    UsageError for a branch of ``rules.branches`` that does not exist; ConcurrentChange when
    commits kept changing the selection over several attempts."""
    started = time.perf_counter()
    now = now or datetime.now(timezone.utc)
    for _ in range(_ATTEMPTS):
        if dry_run:
            found, freeable = _in_transaction(sessions, rules, now, None)
            return _report(rules, found, freeable, True, started)
        with sessions() as s:
            planned = _select(s, rules, now)
        if not planned.pruned:
            with reading() as s:
                return _report(rules, planned, liveness.freeable(s), False, started)
        try:
            with journal.entry(backend, {"op": "prune", "commits": list(planned.pruned)}, purpose="prune") as key:
                found, freeable = _in_transaction(sessions, rules, now, planned.pruned, key)
        except _Rollback:  # the entry was taken back
            continue
        faults.point("prune.after_commit")
        return _report(rules, found, freeable, False, started)
    raise ConcurrentChange(what="prune", other="commit",
                           detail=f"the commits to prune changed during each of {_ATTEMPTS} attempts")


def _in_transaction(sessions: sessionmaker[Session], rules: RetentionRules, now: datetime,
                    planned: tuple[str, ...] | None, journal_key: str | None = None
                    ) -> tuple[retention.Selection, liveness.Freeable]:
    """Select and mark in one write transaction (recording ``journal_key``, the prune's journal
    entry); commit it when the selection is ``planned``, roll it back when ``planned`` is None
    (a dry run: returns what it found) or when one of ``planned`` is to be kept now (_Rollback)."""
    try:
        with write_transaction(sessions) as s:
            pending.index_in(s)  # a commit's tensor-level rows, before what is live is read
            found = _select(s, rules, now)
            if planned is not None:
                if not set(planned) <= set(found.pruned):
                    raise _Rollback(found, liveness.Freeable())
                found = replace(found, pruned=planned)  # the others wait for the next run
            _mark(s, found.pruned)
            if journal_key is not None:
                catalog.record_journal_key(s, journal_key)
            faults.point("prune.before_commit")
            freeable = liveness.freeable(s)  # with the marks made: what the next gc frees
            if planned is None:
                raise _Rollback(found, freeable)
    except _Rollback as back:
        if planned is None:
            return back.found, back.freeable
        raise
    return found, freeable


def _report(rules: RetentionRules, found: retention.Selection, freeable: liveness.Freeable, dry_run: bool,
            started: float) -> PruneReport:
    return PruneReport(
        dry_run=dry_run, rules=rules, considered=len(found.considered), kept=len(found.kept), pruned=found.pruned,
        already_pruned=len(found.already), kept_by=found.kept_by, freeable_chunks=freeable.chunks,
        freeable_bytes=freeable.bytes, freeable_packs=freeable.packs, freeable_pack_bytes=freeable.pack_bytes,
        seconds=time.perf_counter() - started)


def prune_damaged(sessions: sessionmaker[Session], reading: Callable[[], AbstractContextManager[Session]],
                  backend: Backend, *, dry_run: bool = False) -> PruneReport:
    """Accept the loss of every damaged commit (``commits.damage``, left by a rebuild that found
    its data or manifest gone): mark them pruned, journalled like any prune, so that they stay in
    the lineage and ``gc`` may run again. ``dry_run``: which would be marked."""
    started = time.perf_counter()
    with sessions() as s:
        ids = tuple(s.scalars(select(Commit.id).where(Commit.damage.is_not(None), Commit.pruned.is_(False))
                              .order_by(Commit.id)))
    if ids and not dry_run:
        with journal.entry(backend, {"op": "prune", "commits": list(ids)}) as key, \
                write_transaction(sessions) as s:
            _mark(s, ids)
            catalog.record_journal_key(s, key)
    with reading() as s:
        freeable = liveness.freeable(s)
    return PruneReport(dry_run=dry_run, rules=RetentionRules(), considered=len(ids), kept=0, pruned=ids,
                       already_pruned=0, kept_by={}, freeable_chunks=freeable.chunks, freeable_bytes=freeable.bytes,
                       freeable_packs=freeable.packs, freeable_pack_bytes=freeable.pack_bytes,
                       seconds=time.perf_counter() - started)
