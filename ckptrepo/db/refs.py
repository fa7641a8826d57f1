"""Refs: branches and tags in the catalog, and the current branch (HEAD) of a repository folder.

Branches move by compare-and-swap (``move_branch``) inside the transaction that records a
commit, so two writers can never both move a branch from the same head; tags never move.
Functions take a ``Session`` owned by the caller, who owns the transaction; ``create``,
``delete`` and ``move_branch`` belong in a write transaction (``engine.write_transaction``).

HEAD is per repository folder, like git's: ``.ckpt/HEAD`` holds one branch name, ``main``
when the file is absent; two folders sharing one PostgreSQL database each have their own.
It is written atomically (``atomic``), so a reader sees the old name or the new one.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path
from typing import cast

from sqlalchemy import CTE, Table, bindparam, delete, func, select, update
from sqlalchemy.orm import Session

from ckptrepo.atomic import write_atomic
from ckptrepo.db.engine import insert_tuples
from ckptrepo.db.models import Commit, Edge, Ref
from ckptrepo.errors import (
    ConcurrentChange,
    InvalidRefName,
    RefExists,
    UnknownRef,
    UnknownRevision,
    UnreachableCommits,
    UsageError,
)
from ckptrepo.ids import is_hex
from ckptrepo.types import RefInfo

DEFAULT_BRANCH = "main"
HEAD_FILE = "HEAD"
KINDS = ("branch", "tag")
MIN_PREFIX = 4  # the shortest id prefix a revision may name
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._/-]*$")

_REFS = cast(Table, Ref.__table__)
_BRANCH_AT = select(_REFS.c.commit_id).where(_REFS.c.kind == "branch", _REFS.c.name == bindparam("ref_name"))
_MOVE_BRANCH = (update(_REFS)
                .where(_REFS.c.kind == "branch", _REFS.c.name == bindparam("ref_name"),
                       _REFS.c.commit_id == bindparam("expected"))
                .values(commit_id=bindparam("new_id"), updated_at=bindparam("now")))


def _now() -> datetime:
    return datetime.now(timezone.utc)


def check_ref_name(name: str, kind: str) -> None:
    """Refuse names that could not be told apart from revision expressions or paths."""
    reason = None
    if not _NAME_RE.match(name):
        reason = "use letters, digits and . _ - / and start with a letter or digit"
    elif ".." in name or name.endswith(("/", ".")) or "//" in name:
        reason = "no '..', '//' or trailing '/' or '.'"
    elif len(name) > 255:
        reason = "longer than 255 characters"
    elif is_hex(name) and len(name) >= MIN_PREFIX:
        reason = "it looks like a commit id"
    elif name == HEAD_FILE:
        reason = "HEAD names the current branch (.ckpt/HEAD), not a ref"
    if reason:
        raise InvalidRefName(kind=kind, name=name, reason=reason)


def branch_head(session: Session, name: str) -> str | None:
    """The commit id branch ``name`` points at, or None when there is no such branch."""
    return session.connection().execute(_BRANCH_AT, {"ref_name": name}).scalar()


def move_branch(session: Session, name: str, new_id: str, expected: str | None, now: datetime) -> str | None:
    """Compare-and-swap a branch: point ``name`` at ``new_id`` if it is at ``expected``
    (``None``: the branch must not exist). Returns None on success, else where it is
    (``""``: the branch is gone)."""
    conn = session.connection()
    if expected is None:
        current = branch_head(session, name)
        if current is not None:
            return current
        # Insert-or-ignore, then read back: a concurrent creator of the same branch wins cleanly.
        insert_tuples(conn, Ref, ("kind", "name", "commit_id", "updated_at"), [("branch", name, new_id, now)],
                      ignore=True)
        current = branch_head(session, name)
        assert current is not None
        return None if current == new_id else current
    moved = conn.execute(_MOVE_BRANCH, {"ref_name": name, "expected": expected, "new_id": new_id, "now": now})
    if moved.rowcount == 1:
        return None
    return branch_head(session, name) or ""


def listing(session: Session, kind: str) -> list[RefInfo]:
    """Every ref of ``kind`` (``branch`` or ``tag``), by name."""
    rows = session.scalars(select(Ref).where(Ref.kind == kind).order_by(Ref.name))
    return [RefInfo(name=r.name, kind=r.kind, commit_id=r.commit_id) for r in rows]


def default_target(session: Session) -> str:
    """Where a new ref points when no revision is named: the head of ``main``, else the newest
    commit; UnknownRevision in an empty repository."""
    head = branch_head(session, DEFAULT_BRANCH)
    if head is not None:
        return head
    newest = session.scalars(select(Commit.id).order_by(Commit.created_at.desc()).limit(1)).first()
    if newest is None:
        raise UnknownRevision(rev="HEAD", hint="The repository has no commits yet; commit first.")
    return newest


def create(session: Session, kind: str, name: str, target: str, *, force: bool = False) -> RefInfo:
    """Point ref ``(kind, name)`` at commit ``target`` (a full id). An existing ref is moved only
    with ``force`` (RefExists otherwise)."""
    existing = session.get(Ref, (kind, name))
    if existing is not None:
        if not force:
            raise RefExists(kind=kind.capitalize(), name=name)
        existing.commit_id = target
        existing.updated_at = _now()
    else:
        session.add(Ref(kind=kind, name=name, commit_id=target, updated_at=_now()))
    session.flush()
    return RefInfo(name=name, kind=kind, commit_id=target)


def delete_ref(session: Session, kind: str, name: str, *, force: bool = False) -> RefInfo:
    """Delete ref ``(kind, name)`` and return what it named. UnknownRef when there is none;
    UnreachableCommits when no other ref reaches some of its commits, unless ``force``."""
    ref = session.get(Ref, (kind, name))
    if ref is None:
        raise UnknownRef(kind=kind, name=name)
    info = RefInfo(name=name, kind=kind, commit_id=ref.commit_id)
    if not force:
        count = orphaned_by_removing(session, kind, name)
        if count:
            raise UnreachableCommits(kind=kind, name=name, count=count)
    session.execute(delete(Ref).where(Ref.kind == kind, Ref.name == name))
    return info


def rename(session: Session, kind: str, old: str, new: str, target: str, *, force: bool = False) -> RefInfo:
    """Rename ref ``(kind, old)``, which must still point at ``target`` (ConcurrentChange when it
    moved or went since the caller read it), to ``new``. An existing ``new`` is replaced only with
    ``force`` (RefExists otherwise); UnknownRef when ``old`` is gone."""
    existing = session.get(Ref, (kind, new))
    if existing is not None:
        if not force:
            raise RefExists(kind=kind.capitalize(), name=new)
        session.execute(delete(Ref).where(Ref.kind == kind, Ref.name == new))
    renamed = session.execute(update(Ref).where(Ref.kind == kind, Ref.name == old, Ref.commit_id == target)
                              .values(name=new, updated_at=_now()))
    if getattr(renamed, "rowcount", 0) != 1:  # a DML result's count of rows matched
        if session.get(Ref, (kind, old)) is None:
            raise UnknownRef(kind=kind, name=old)
        raise ConcurrentChange(what=f"rename of {kind} {old!r}", other="commit",
                               detail=f"{old!r} moved from {target[:10]} meanwhile")
    return RefInfo(name=new, kind=kind, commit_id=target)


def live_commits(exclude_ref: tuple[str, str] | None = None) -> CTE:
    """Ids of every commit some ref reaches (all edge kinds), as a recursive CTE with column ``id``.
    ``exclude_ref`` = ``(kind, name)`` leaves that ref out of the roots."""
    roots = select(Ref.commit_id.label("id"))
    if exclude_ref is not None:
        roots = roots.where((Ref.kind != exclude_ref[0]) | (Ref.name != exclude_ref[1]))
    live = roots.cte("live_commits", recursive=True)
    return live.union(select(Edge.parent_id.label("id")).where(Edge.child_id == live.c.id))


def reachable_from(commit_id: str) -> CTE:
    """``commit_id`` and all its ancestors (all edge kinds), as a recursive CTE with column ``id``."""
    start = select(Commit.id.label("id")).where(Commit.id == commit_id).cte("reach", recursive=True)
    return start.union(select(Edge.parent_id.label("id")).where(Edge.child_id == start.c.id))


def orphaned_by_removing(session: Session, kind: str, name: str) -> int:
    """How many commits no ref would reach any more if ref ``(kind, name)`` were deleted."""
    ref = session.get(Ref, (kind, name))
    if ref is None:
        return 0
    mine = reachable_from(ref.commit_id)
    others = live_commits(exclude_ref=(kind, name))
    return int(session.scalar(select(func.count()).select_from(mine).where(mine.c.id.not_in(select(others.c.id))))
               or 0)


# -- HEAD ------------------------------------------------------------------------------------


def read_head(repo_dir: Path) -> str:
    """The branch ``repo_dir/HEAD`` names (``main`` when there is no such file). The branch may
    not exist yet: the next commit on it creates it. UsageError when the file holds something
    that is not a branch name."""
    path = repo_dir / HEAD_FILE
    try:
        name = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return DEFAULT_BRANCH
    try:
        check_ref_name(name, "branch")
    except InvalidRefName as exc:
        raise UsageError(f"{path} holds {name[:80]!r}, which is not a branch name",
                         hint="Switch to a branch with `ckpt checkout BRANCH` (it rewrites the file).") from exc
    return name


def write_head(repo_dir: Path, name: str) -> None:
    """Make ``name`` the current branch of the folder (InvalidRefName for a bad name)."""
    check_ref_name(name, "branch")
    write_atomic(repo_dir / HEAD_FILE, (name + "\n").encode("utf-8"))
