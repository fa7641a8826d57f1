"""Revision expressions: parse and resolve to a full commit id.

Grammar (git-like)::

    rev    := base suffix*
    base   := NAME "@step=" INT     the commit with that step on NAME's first-parent chain
            | NAME                  a branch, a tag, a full commit id or a unique id prefix (>= 4 hex)
    suffix := "~" [INT]             the INT-th first-parent ancestor (default 1)
            | "^" [INT]             the INT-th parent (default 1; ^0 is the commit itself)

Parents are the ``parent`` and ``merge`` edges; a transfer source is not a parent.

Names are looked up in that order: branch, tag, full id, id prefix. Resolution only
reads the database; parameters always travel as bound values, never as SQL text. Numbers are
bounded (``db.integers``): a step is a 64-bit integer, ``~N`` and ``^N`` at most 10**18;
beyond, UsageError.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from ckptrepo.db import integers, lines
from ckptrepo.db.engine import fetch_tuples
from ckptrepo.db.models import Commit, Edge, Ref
from ckptrepo.db.refs import MIN_PREFIX
from ckptrepo.errors import AmbiguousRevision, UnknownRevision, UsageError, did_you_mean
from ckptrepo.ids import ID_HEX_LEN, is_hex, short

_BASE_RE = re.compile(r"^(?P<name>[^~^@\s]+)(?:@step=(?P<step>-?\d+))?")
_SUFFIX_RE = re.compile(r"([~^])(\d*)")


@dataclass(frozen=True)
class RevSpec:
    """A parsed revision: a base name (optionally at a step) and parent/ancestor hops."""

    name: str
    step: int | None
    hops: tuple[tuple[str, int], ...]


def parse(rev: str) -> RevSpec:
    """Parse ``rev``; UnknownRevision when it is not of the grammar above, UsageError for a
    number out of range."""
    text = rev.strip()
    match = _BASE_RE.match(text)
    if not match:
        raise UnknownRevision(rev=rev)
    pos = match.end()
    hops: list[tuple[str, int]] = []
    while pos < len(text):
        m = _SUFFIX_RE.match(text, pos)
        if not m:
            raise UnknownRevision(rev=rev)
        op = m.group(1)
        hops.append((op, _number(rev, f"N of {op}N", m.group(2), integers.count) if m.group(2) else 1))
        pos = m.end()
    step = match.group("step")
    at = _number(rev, "the step", step, integers.value) if step is not None else None
    return RevSpec(match.group("name"), at, tuple(hops))


def _number(rev: str, what: str, digits: str, check: Callable[[str, int], int]) -> int:
    """``digits`` as an int, within the range ``check`` (``db.integers``) allows; UsageError, naming
    ``what`` in ``rev``, otherwise (before ``int()``, which refuses more than 4300 digits, when
    it is so long that it cannot fit)."""
    what = f"{what} in revision {rev!r}" if len(rev) <= 60 else f"{what} in the revision"
    if len(digits.lstrip("-")) > 40:
        raise UsageError(f"{what} is out of range: {len(digits)} characters long")
    return check(what, int(digits))


def resolve(session: Session, rev: str) -> str:
    """The full id of the commit ``rev`` names (see module docstring)."""
    spec = parse(rev)
    commit_id = _resolve_name(session, spec.name, rev)
    if spec.step is not None:
        commit_id = _at_step(session, commit_id, spec.step, rev)
    for op, n in spec.hops:
        if op == "~":
            commit_id = _first_parent_at(session, commit_id, n, rev)
        elif n:
            commit_id = _parent(session, commit_id, n, rev)
    return commit_id


def _resolve_name(session: Session, name: str, rev: str) -> str:
    # A branch before a tag, a tag before a remote-tracking ref (``origin/main``) of the same name;
    # all looked up at once (one round trip).
    refs = dict(session.execute(select(Ref.kind, Ref.commit_id).where(Ref.name == name)).all())
    for kind in ("branch", "tag", "remote"):
        if kind in refs:
            return str(refs[kind])
    lowered = name.lower()
    if not is_hex(lowered) or len(lowered) < MIN_PREFIX or len(lowered) > ID_HEX_LEN:
        raise _unknown_name(session, name, rev)
    if len(lowered) == ID_HEX_LEN:
        # The id only: loading the row would parse its skeleton (thousands of names for a large model).
        if session.scalar(select(Commit.id).where(Commit.id == lowered)) is None:
            raise UnknownRevision(rev=rev)
        return lowered
    # Bound parameter on an indexed primary key: a prefix scan, never SQL text.
    upper = lowered + "g"  # 'g' sorts after every hex digit
    rows = session.scalars(
        select(Commit.id).where(Commit.id >= lowered, Commit.id < upper).order_by(Commit.id).limit(11)
    ).all()
    if not rows:
        raise UnknownRevision(rev=rev)
    if len(rows) > 1:
        shown = ", ".join(short(r, 12) for r in rows[:10]) + (" ..." if len(rows) > 10 else "")
        raise AmbiguousRevision(rev=rev, candidates=shown)
    return rows[0]


def _unknown_name(session: Session, name: str, rev: str) -> UnknownRevision:
    """UnknownRevision for a ``name`` that is neither a ref nor an id prefix: its hint names the
    branches and tags spelled like it (``errors.did_you_mean``), and says that an id prefix needs
    4+ hex digits when ``name`` is a shorter run of hex digits; else the error's own hint."""
    close = did_you_mean("branch or tag", name, session.scalars(select(Ref.name).distinct()), "`ckpt branch`")
    similar = close.startswith("Did you mean")
    if is_hex(name.lower()) and len(name) < MIN_PREFIX:
        return UnknownRevision(rev=rev, hint=f"A commit id prefix needs at least {MIN_PREFIX} hex digits. "
                               + (close if similar else "`ckpt log` lists commits."))
    return UnknownRevision(rev=rev, hint=close) if similar else UnknownRevision(rev=rev)


def _parent(session: Session, commit_id: str, n: int, rev: str) -> str:
    parents = session.scalars(
        select(Edge.parent_id)
        .where(Edge.child_id == commit_id, Edge.kind != "transfer")
        .order_by(Edge.position)
    ).all()
    if n > len(parents):
        raise UnknownRevision(
            rev=rev, hint=f"Commit {short(commit_id)} has {len(parents)} parent(s); `ckpt log` shows the history."
        )
    return parents[n - 1]


def _first_parent_at(session: Session, commit_id: str, n: int, rev: str) -> str:
    """The ``n``-th commit down ``commit_id``'s first-parent chain (``n`` = 0: itself), read
    from the chain's first-parent lines in one query (``db.lines``)."""
    rows = fetch_tuples(session.connection(), lines.chain_commits(commit_id, n + 1, Commit.id))
    found = [cid for depth, cid in rows if depth == n]
    if not found:
        raise UnknownRevision(
            rev=rev, hint=f"Commit {short(commit_id)} has {len(rows) - 1} first-parent ancestor(s); "
                          "`ckpt log` shows the history.")
    return str(found[0])


def _at_step(session: Session, head: str, step: int, rev: str) -> str:
    """Nearest commit with ``step`` on the first-parent chain from ``head`` (head included)."""
    # Nearest first: the deepest ``fp_depth`` on the chain is the closest to ``head``.
    row = session.execute(
        lines.chain_commits(head, None, Commit.id).where(Commit.step == step).order_by(Commit.fp_depth.desc()).limit(1)
    ).first()
    found = None if row is None else str(row[1])
    if found is None:
        raise UnknownRevision(rev=rev, hint=f"No commit with step={step} on the first-parent chain of that revision.")
    return found
