"""What a remote holds, cached in the catalog (``remote_packs``, ``remote_chunks``,
``remote_commits``; schema 0015) and refreshed from the remote itself.

``refresh`` lists the remote's packs and reads the footer of each one not seen before (header,
trailer and index, checked against the pack's name: ``chunks.pack.read_index``); a pack whose
footer fails is reported and not used. The cache is never trusted beyond that: a chunk recorded
here is one a checked footer names, and every byte read back is verified against its chunk id.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session, sessionmaker

from ckptrepo.db.engine import insert_tuples, write_transaction
from ckptrepo.db.models import RemoteBundle, RemoteChunk, RemoteCommit, RemotePack
from ckptrepo.errors import CkptError
from ckptrepo.locations import ChunkLocation
from ckptrepo.storage.base import Backend

PACK_KEY = re.compile(r"packs/([0-9a-f]{2})/([0-9a-f]{64})\.pack")
_READERS = 8  # footers in flight: a remote's latency bounds them, not the CPU
_BATCH = 500


def _batches(items: list[str]) -> Iterable[list[str]]:
    for start in range(0, len(items), _BATCH):
        yield items[start : start + _BATCH]


def refresh(sessions: sessionmaker[Session], backend: Backend, remote: str) -> tuple[int, list[str]]:
    """Read the footers of the remote's packs not read before and record them; returns how many
    packs were read and what could not be used (a damaged or foreign footer), each with why."""
    listed = [(m.group(2), key, size) for key, size in backend.list_sized("packs/")
              if (m := PACK_KEY.fullmatch(key)) is not None and m.group(2).startswith(m.group(1))]
    with sessions() as s:
        known = set(s.scalars(select(RemotePack.pack_id).where(RemotePack.remote == remote)))
    todo = [item for item in listed if item[0] not in known]
    packs, problems = _read_footers(backend, remote, todo)
    read = len(packs)
    if packs:
        with write_transaction(sessions) as s:
            _record_read(s, remote, packs)
    return read, problems


def held(s: Session, remote: str, chunk_ids: Collection[str]) -> set[str]:
    """Which of ``chunk_ids`` the remote holds (as last refreshed or pushed)."""
    ids = sorted(set(chunk_ids))
    found: set[str] = set()
    for batch in _batches(ids):
        found.update(s.scalars(select(RemoteChunk.chunk_id).where(RemoteChunk.remote == remote,
                                                                  RemoteChunk.chunk_id.in_(batch))))
    return found


def locations(s: Session, remote: str, chunk_ids: Collection[str]) -> dict[str, ChunkLocation]:
    """Where the remote holds each of ``chunk_ids`` it holds, by id."""
    ids = sorted(set(chunk_ids))
    found: dict[str, ChunkLocation] = {}
    for batch in _batches(ids):
        for r in s.execute(select(RemoteChunk).where(RemoteChunk.remote == remote, RemoteChunk.chunk_id.in_(batch))
                           ).scalars():
            found[r.chunk_id] = ChunkLocation(r.chunk_id, r.pack_id, r.offset, r.length, r.raw_length, r.encoding,
                                              r.depth, r.base_id)
    return found


def record_pushed(s: Session, remote: str, packs: Iterable[tuple[str, int, list[ChunkLocation]]]) -> None:
    """Record packs a push stored on the remote (``(pack id, size, entries)``), in ``s``'s
    transaction."""
    conn = s.connection()
    packs = list(packs)
    insert_tuples(conn, RemotePack, ("remote", "pack_id", "size", "n_chunks"),
                  sorted((remote, pid, size, len(entries)) for pid, size, entries in packs), ignore=True)
    rows = sorted({c.chunk_id: (remote, c.chunk_id, c.pack_id, c.offset, c.length, c.raw_length, c.encoding,
                                c.depth, c.base_id) for _, _, entries in packs for c in entries}.values())
    insert_tuples(conn, RemoteChunk, ("remote", "chunk_id", "pack_id", "offset", "length", "raw_length", "encoding",
                                      "depth", "base_id"), rows, ignore=True)
    _prefer_shallower(s, remote, rows)


def _prefer_shallower(s: Session, remote: str, rows: list[tuple[Any, ...]]) -> None:
    """Point the cached copies of ``rows``' chunks (``(remote, chunk id, pack, offset, length, raw
    length, encoding, depth, base id)``) at these when shallower than the one recorded: a chunk
    the remote holds twice (a base sent again standalone) is read at its shallowest."""
    deeper: set[str] = set()
    for batch in _batches(sorted({r[1] for r in rows})):
        stored = {str(cid): int(d) for cid, d in s.execute(select(RemoteChunk.chunk_id, RemoteChunk.depth).where(
            RemoteChunk.remote == remote, RemoteChunk.chunk_id.in_(batch)))}
        deeper.update(r[1] for r in rows if r[1] in stored and stored[r[1]] > r[7])
    for r in rows:
        if r[1] not in deeper:
            continue
        s.execute(update(RemoteChunk)
                  .where(RemoteChunk.remote == remote, RemoteChunk.chunk_id == r[1], RemoteChunk.depth > r[7])
                  .values(pack_id=r[2], offset=r[3], length=r[4], raw_length=r[5], encoding=r[6], depth=r[7],
                          base_id=r[8]))


def record_commits(s: Session, remote: str, commit_ids: Iterable[str]) -> None:
    """Record that the remote holds these commits' manifests, in ``s``'s transaction."""
    insert_tuples(s.connection(), RemoteCommit, ("remote", "commit_id"),
                  sorted((remote, cid) for cid in set(commit_ids)), ignore=True)


def commits_held(s: Session, remote: str) -> set[str]:
    """The commits the remote is known to hold."""
    return set(s.scalars(select(RemoteCommit.commit_id).where(RemoteCommit.remote == remote)))


def forget(s: Session, remote: str) -> None:
    """Drop everything cached about ``remote`` (it was removed), in ``s``'s transaction."""
    for model in (RemoteChunk, RemotePack, RemoteCommit, RemoteBundle):
        s.execute(delete(model).where(model.remote == remote))


def read_bundles(sessions: sessionmaker[Session], backend: Backend, remote: str
                 ) -> tuple[dict[str, Any], int, list[str]]:
    """Read the remote's bundles this repository has not seen (newest first; one a read bundle
    covers is skipped), record their packs as read footers are, and mark them seen; returns the
    manifests they hold (checked) by commit id, how many packs they described, and what in them
    failed its checks."""
    with sessions() as s:
        seen = {key: covered for key, covered in s.execute(
            select(RemoteBundle.key, RemoteBundle.covered).where(RemoteBundle.remote == remote))}
    skip = set(seen)
    found, problems = _read_bundles(backend, skip)
    manifests: dict[str, Any] = {}
    for _, got in found:
        for cid, body in got.manifests.items():
            manifests.setdefault(cid, body)
    packs = {pid: item for _, got in found for pid, item in got.packs.items()}
    with write_transaction(sessions) as s:
        _record_read(s, remote, packs)
        covers = {c for _, got in found for c in got.covers}
        rows = sorted({(remote, key, False) for key, _ in found if key not in covers}
                      | {(remote, key, True) for key in covers if not seen.get(key)})
        if rows:
            insert_tuples(s.connection(), RemoteBundle, ("remote", "key", "covered"), rows, ignore=True)
            covered = sorted({key for _, key, c in rows if c})
            for start in range(0, len(covered), _BATCH):
                s.execute(update(RemoteBundle).where(RemoteBundle.remote == remote, RemoteBundle.key.in_(
                    covered[start : start + _BATCH])).values(covered=True))
    return manifests, len(packs), problems


def _record_read(s: Session, remote: str, packs: dict[str, tuple[int, list[ChunkLocation]]]) -> None:
    """Record packs whose index was read (``(size, entries)`` by id), in ``s``'s transaction."""
    if not packs:
        return
    conn = s.connection()
    insert_tuples(conn, RemotePack, ("remote", "pack_id", "size", "n_chunks"),
                  sorted((remote, pid, size, len(entries)) for pid, (size, entries) in packs.items()), ignore=True)
    chunks: dict[str, ChunkLocation] = {}
    for _, entries in packs.values():
        for loc in entries:
            have = chunks.get(loc.chunk_id)
            if have is None or loc.depth < have.depth:
                chunks[loc.chunk_id] = loc
    rows = sorted((remote, c.chunk_id, c.pack_id, c.offset, c.length, c.raw_length, c.encoding, c.depth, c.base_id)
                  for c in chunks.values())
    insert_tuples(conn, RemoteChunk, ("remote", "chunk_id", "pack_id", "offset", "length", "raw_length", "encoding",
                                      "depth", "base_id"), rows, ignore=True)
    _prefer_shallower(s, remote, rows)


def bundles_to_fold(s: Session, remote: str, listed: list[str]) -> list[str]:
    """Of the remote's bundles ``listed``, those no bundle covers (as far as this repository
    knows), when there are enough to fold into the next one (``bundles.FOLD_AT``); else none."""
    from ckptrepo.remote import bundles

    covered = set(s.scalars(select(RemoteBundle.key).where(RemoteBundle.remote == remote,
                                                            RemoteBundle.covered.is_(True))))
    open_ = [key for key in listed if key not in covered]
    return open_ if len(open_) >= bundles.FOLD_AT else []


def record_bundle(s: Session, remote: str, key: str, covers: list[str]) -> None:
    """Record a bundle this repository wrote and those it covers, in ``s``'s transaction."""
    insert_tuples(s.connection(), RemoteBundle, ("remote", "key", "covered"),
                  sorted({(remote, key, False), *((remote, c, True) for c in covers)}), ignore=True)
    for start in range(0, len(covers), _BATCH):
        s.execute(update(RemoteBundle).where(RemoteBundle.remote == remote, RemoteBundle.key.in_(
            covers[start : start + _BATCH])).values(covered=True))


def scan_remote(backend: Backend, remote: str) -> tuple[list[tuple[str, str, int, list[ChunkLocation]]], list[str]]:
    """Every pack of a remote with its index entries (from its bundles, else its footer), without
    a database (a rebuild); returns ``(remote, pack id, size, entries)`` and what could not be read."""
    found, problems = _read_bundles(backend, set())
    packs = {pid: item for _, got in found for pid, item in got.packs.items()}
    listed = [(m.group(2), key, size) for key, size in backend.list_sized("packs/")
              if (m := PACK_KEY.fullmatch(key)) is not None and m.group(2) not in packs]
    more, why = _read_footers(backend, remote, listed)
    packs.update(more)
    return [(remote, pid, size, entries) for pid, (size, entries) in sorted(packs.items())], problems + why


def _read_bundles(backend: Backend, skip: set[str]) -> tuple[list[tuple[str, Any]], list[str]]:
    """The remote's bundles but ``skip``, newest first, each read and checked (``remote.bundles``),
    with what they cover added to ``skip`` as they are read; and what could not be used."""
    from ckptrepo.remote import bundles

    found: list[tuple[str, bundles.Bundle]] = []
    problems: list[str] = []
    for key in sorted((k for k in backend.list(bundles.PREFIX) if bundles.is_key(k)), reverse=True):
        if key in skip:
            continue
        try:
            got = bundles.read(backend.get(key), key)
        except CkptError as exc:
            problems.append(str(exc))
            continue
        found.append((key, got))
        skip.update(got.covers)
        problems.extend(got.problems)
    return found, problems


def _read_footers(backend: Backend, remote: str, items: list[tuple[str, str, int]]
                  ) -> tuple[dict[str, tuple[int, list[ChunkLocation]]], list[str]]:
    """The index entries of packs ``(id, key, size)``, one ranged read each (the sizes are a
    listing's), by id; and the packs whose footer fails its checks, with why."""
    from ckptrepo.chunks.pack import read_index  # numpy: loaded when a remote is read

    def one(item: tuple[str, str, int]) -> tuple[str, int, list[ChunkLocation]] | str:
        pid, key, size = item
        try:
            return pid, size, read_index(backend, key, pack_id=pid, named=True, size=size)
        except CkptError as exc:
            return f"pack {pid} of remote {remote}: {exc}"

    packs: dict[str, tuple[int, list[ChunkLocation]]] = {}
    problems: list[str] = []
    with ThreadPoolExecutor(_READERS, thread_name_prefix="ckpt-remote") as pool:
        for got in pool.map(one, items):
            if isinstance(got, str):
                problems.append(got)
            else:
                packs[got[0]] = (got[1], got[2])
    return packs, problems
