"""Annotations between a repository and its remotes.

An annotation (``db.notes``) lives in its store as a journal entry (op ``annotate``) whose
key is its identity: a push copies the entries of the commits the remote holds that the remote
lacks, byte for byte under the same key; a fetch reads the remote's entries whose keys this
repository has not recorded (one listing, then only those), checks each (``journal.decode``:
checksum, own key, fields), stores it in the local store under its key (a rebuild replays it)
and records it in one transaction, for the commits this repository has. An entry that fails its
checks is reported, never applied; a result annotated on two clones keeps both values, the newer
one current (``db.notes.record``).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from ckptrepo.db import catalog
from ckptrepo.db import notes as rows
from ckptrepo.db.engine import Sessions, write_transaction
from ckptrepo.db.models import Annotation, Commit
from ckptrepo.errors import CkptError, IntegrityError
from ckptrepo.ledger import journal
from ckptrepo.ledger.leases import Lease
from ckptrepo.remote.transfer import Meter
from ckptrepo.storage.base import Backend

_BATCH = 500


def push(reading: Sessions, local: Backend, remote: Backend, held: Collection[str], meter: Meter) -> int:
    """Copy to ``remote`` the annotation entries of the commits in ``held`` (those the remote
    holds) that it lacks; returns how many. An entry this store lost is left out (``verify``
    reports it here)."""
    with reading() as s:
        found = sorted({(str(key), cid) for key, cid in s.execute(
            select(Annotation.journal_key, Annotation.commit_id).where(Annotation.journal_key.is_not(None)))})
    wanted = [(key, cid) for key, cid in found if cid in held]
    if not wanted:
        return 0
    there = set(remote.list(journal.PREFIX))
    sent = 0
    for key, _ in wanted:
        if key in there:
            continue
        try:
            data = local.get(key)
            journal.decode(data, key)
        except (CkptError, OSError):
            continue
        remote.put_bytes(key, data)
        meter.wrote(len(data))
        sent += 1
    return sent


def read_entries(reading: Sessions, remote: Backend, problems: list[str]) -> list[tuple[str, dict[str, Any], bytes]]:
    """The remote's journal entries, checked (``journal.decode``), oldest first, with their bytes,
    but for annotations this repository has recorded already (not read again). Damaged entries
    go to ``problems``."""
    with reading() as s:
        known = rows.journal_keys(s)
    found: list[tuple[str, dict[str, Any], bytes]] = []
    for key in remote.list(journal.PREFIX):
        if not key.endswith(".json") or key in known:
            continue
        try:
            if remote.size(key) > journal.MAX_BYTES:
                raise IntegrityError(f"journal entry {key} is damaged: larger than {journal.MAX_BYTES} bytes")
            data = remote.get(key)
            found.append((key, journal.decode(data, key), data))
        except IntegrityError as exc:
            problems.append(exc.message)
    return found


def fetch(sessions: sessionmaker[Session], reading: Sessions, local: Backend,
          entries: list[tuple[str, dict[str, Any], bytes]]) -> int:
    """Record the annotations among the remote's ``entries`` (``read_entries``) that this
    repository lacks, on the commits it has; returns how many entries were applied."""
    with reading() as s:
        known = rows.journal_keys(s)
    new = [(key, e, data) for key, e, data in entries if e["op"] == "annotate" and key not in known]
    if not new:
        return 0
    with reading() as s:
        ids = sorted({str(e["commit"]) for _, e, _ in new})
        present: set[str] = set()
        for start in range(0, len(ids), _BATCH):
            present.update(s.scalars(select(Commit.id).where(Commit.id.in_(ids[start : start + _BATCH]))))
    new = [n for n in new if n[1]["commit"] in present]
    if not new:
        return 0
    lease = Lease(local, "fetch annotations")  # the entries are unrecorded until the transaction
    lease.take()
    try:
        for key, _, data in new:
            if not local.exists(key):
                local.put_bytes(key, data)
        with write_transaction(sessions) as s:
            for key, e, _ in new:
                rows.record(s, e["commit"], e["metrics"], e.get("note"), e.get("source"),
                                   datetime.fromtimestamp(e["at"], timezone.utc), key, strict=False)
                catalog.record_journal_key(s, key)
    finally:
        lease.release()
    return len(new)
