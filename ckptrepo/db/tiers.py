"""Tier states from the catalog: which remote replicates the repository, what it still lacks
(the backlog), how much of each branch would be lost if the local tier died now (the recovery
point), and which commits retention must keep until they are replicated (``protected``).

A commit is on the remote when the remote holds its manifest (``remote_commits``, recorded by
push and fetch: a push uploads a commit's data before its manifest), or when a commit the remote
holds descends from it (a remote ref's ancestors are all there).
"""

from __future__ import annotations

from sqlalchemy import CTE, case, func, select, union
from sqlalchemy.orm import Session

from ckptrepo.db.models import Commit, Edge, Ref, RemoteCommit, RepoMeta
from ckptrepo.types import RecoveryPoint

REPLICA = "replica"  # the ``repo_meta`` key naming the remote that replicates the repository


def replica(s: Session) -> str | None:
    """The remote commits replicate to (``repo_meta.replica``), or None."""
    row = s.get(RepoMeta, REPLICA)
    return row.value if row is not None else None


def set_replica(s: Session, remote: str | None) -> None:
    """Record (None: clear) the remote that replicates the repository, in ``s``'s transaction."""
    row = s.get(RepoMeta, REPLICA)
    if remote is None:
        if row is not None:
            s.delete(row)
    elif row is None:
        s.add(RepoMeta(key=REPLICA, value=remote))
    else:
        row.value = remote


def _held(remote: str) -> CTE:
    """A recursive CTE of the commits ``remote`` holds (column ``id``)."""
    roots = union(select(RemoteCommit.commit_id.label("id")).where(RemoteCommit.remote == remote),
                  select(Ref.commit_id.label("id")).where(Ref.kind == "remote",
                                                          Ref.name.startswith(f"{remote}/"))).subquery()
    held = select(roots.c.id).cte("held", recursive=True)
    return held.union(select(Edge.parent_id.label("id")).where(Edge.child_id == held.c.id))


def holds(s: Session, remote: str, commit_id: str) -> bool:
    """Whether ``remote`` holds commit ``commit_id`` (its manifest, or a commit it holds descends
    from it)."""
    if s.scalar(select(RemoteCommit.commit_id).where(RemoteCommit.remote == remote,
                                                     RemoteCommit.commit_id == commit_id)) is not None:
        return True
    held = _held(remote)
    return s.scalar(select(held.c.id).where(held.c.id == commit_id)) is not None


def _local() -> CTE:
    """A recursive CTE of the commits this repository's branches and tags reach."""
    roots = select(Ref.commit_id.label("id")).where(Ref.kind.in_(("branch", "tag")),
                                                    ~Ref.name.startswith("conflicts/"))
    live = roots.cte("local_live", recursive=True)
    return live.union(select(Edge.parent_id.label("id")).where(Edge.child_id == live.c.id))


def backlog(s: Session, remote: str) -> tuple[int, int]:
    """``(commits, stored bytes)`` the branches and tags here reach that ``remote`` does not hold
    (pruned commits count, with no bytes: only their manifests travel)."""
    held, live = _held(remote), _local()
    nbytes = func.coalesce(func.sum(case((Commit.pruned.is_(True), 0), else_=Commit.stored_bytes)), 0)
    row = s.execute(select(func.count(), nbytes).where(
        Commit.id.in_(select(live.c.id)), Commit.id.not_in(select(held.c.id)))).one()
    return int(row[0]), int(row[1])


def recovery_points(s: Session, remote: str) -> list[RecoveryPoint]:
    """Each branch's recovery point on ``remote`` (``types.RecoveryPoint``), by name."""
    held_cte = _held(remote)
    held = set(s.scalars(select(held_cte.c.id)))
    points = []
    for name, head in s.execute(select(Ref.name, Ref.commit_id).where(
            Ref.kind == "branch", ~Ref.name.startswith("conflicts/")).order_by(Ref.name)):
        at, lost = head, 0
        while at is not None and at not in held:
            lost += 1
            at = s.scalar(select(Commit.first_parent_id).where(Commit.id == at))
        top = s.get(Commit, head)
        base = s.get(Commit, at) if at is not None else None
        steps = (top.step - base.step) if top is not None and base is not None and top.step is not None \
            and base.step is not None else None
        seconds = (top.created_at - base.created_at).total_seconds() if top is not None and base is not None else None
        points.append(RecoveryPoint(branch=name, local=head, remote=at, commits_at_risk=lost, steps_at_risk=steps,
                                    seconds_at_risk=seconds))
    return points


def protected(s: Session) -> dict[str, str]:
    """The commits retention must keep while a remote replicates the repository, with why: those
    the remote does not hold yet (``unreplicated``: pruning would free the only copy once gc
    runs), and each branch's newest commit the remote holds (``replicated_head``: the recovery
    point on the durable tier)."""
    remote = replica(s)
    if remote is None:
        return {}
    held, live = _held(remote), _local()
    found = {cid: "unreplicated" for cid in s.scalars(select(Commit.id).where(
        Commit.id.in_(select(live.c.id)), Commit.id.not_in(select(held.c.id)), Commit.pruned.is_(False)))}
    for point in recovery_points(s, remote):
        if point.remote is not None:
            found.setdefault(point.remote, "replicated_head")
    return found
