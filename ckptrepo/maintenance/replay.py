"""Replaying the store's record of ref changes: which commit each branch and tag ends at.

Two sources (``ledger``): every commit's manifest holds its own branch move (``{branch, from,
at}``: applied by compare-and-swap, when the branch is at the head it expected), and the journal
holds the changes made outside commits (branch created, reset or deleted; tags), applied as
they were written. ``replay_refs`` is pure: a rebuild (``maintenance.rebuild``) records what it
returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

ANY = "*"
"""The head a move expects when it is not known (a commit whose manifest is lost, made a damaged
node by a rebuild, moved the branch its children's moves expect it at): it applies from
whatever the branch's value is, when no move that expected that value does."""


@dataclass(frozen=True)
class _Move:
    at: float
    expected: str | None
    target: str


def replay_refs(manifests: Mapping[str, Mapping[str, Any]], entries: Iterable[Mapping[str, Any]],
                unknown: Mapping[str, Iterable[tuple[str, float]]] | None = None
                ) -> tuple[dict[tuple[str, str], str], list[str]]:
    """The refs ``{(kind, name): commit id}`` that the commits' branch moves and the journal's ref
    changes leave, and the commits whose move never applied.

    Per ref, the journal's changes (forced: branch create, reset, delete; tags) apply in time
    order. From each value the ref takes, it follows the commits' moves that expected that value
    (compare-and-swap). Of several moves from one value, which one the database took shows in
    what came after: the move whose own successors reach the latest time is taken (the others
    ended there: they lost, like a rolled-back transaction), ties to the later move. Timestamps
    only order the forced changes against the moves, so another host's clock being behind does
    not reorder a chain of moves.

    ``unknown``: commits whose own move is not known, each with the ``(branch, time)`` of the
    moves that expected it; each gets a move on those branches from ``ANY`` head."""
    moves: dict[tuple[str, str], list[_Move]] = {}
    forced: dict[tuple[str, str], list[tuple[float, str | None]]] = {}
    for cid, body in manifests.items():
        move = body["move"]
        moves.setdefault(("branch", move["branch"]), []).append(_Move(move["at"], move["from"], cid))
    for cid, expected_on in (unknown or {}).items():
        for branch, at in expected_on:
            moves.setdefault(("branch", branch), []).append(_Move(at, ANY, cid))
    for entry in entries:
        if entry.get("op") == "ref":
            forced.setdefault((entry["kind"], entry["name"]), []).append((entry["at"], entry["to"]))
    refs: dict[tuple[str, str], str] = {}
    lost: list[str] = []
    for ref in sorted(moves.keys() | forced.keys()):
        current, unused = _follow(moves.get(ref, []), sorted(forced.get(ref, []), key=lambda f: f[0]))
        if current is not None:
            refs[ref] = current
        lost.extend(m.target for m in unused)
    return refs, lost


def _follow(moves: list[_Move], forced: list[tuple[float, str | None]]) -> tuple[str | None, list[_Move]]:
    by_expected: dict[str | None, list[_Move]] = {}
    for m in moves:
        by_expected.setdefault(m.expected, []).append(m)
    latest: dict[str, float] = {}

    def reach(m: _Move) -> float:  # the latest time among m and the moves after it (iterative DFS)
        stack = [(m, False)]
        while stack:
            node, done = stack.pop()
            if node.target in latest:
                continue
            after = by_expected.get(node.target, [])
            if done:
                latest[node.target] = max([node.at, *(latest[a.target] for a in after)])
                continue
            stack.append((node, True))
            stack.extend((a, False) for a in after if a.target not in latest)
        return latest[m.target]

    used: set[str] = set()
    current: str | None = None
    for until, value in [*forced, (float("inf"), None)]:
        while True:
            options = [m for m in by_expected.get(current, []) if m.target not in used and m.at <= until]
            if not options:  # stalled: a move whose expected head is not known may apply
                options = [m for m in by_expected.get(ANY, []) if m.target not in used and m.at <= until]
            if not options:
                break
            best = max(options, key=lambda m: (reach(m), m.at, m.target))
            used.add(best.target)
            current = best.target
        if until != float("inf"):
            current = value
    return current, [m for m in moves if m.target not in used]
