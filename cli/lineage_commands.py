"""Lineage commands: ``ckpt lineage ancestors|descendants|path|merge-base`` and ``ckpt best``.

Thin functions over ``Repo``'s lineage queries; ``--json`` prints a list of commits
(``Commit.to_json``), in the order of the query.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import typer

from ckptrepo.errors import NoPath
from ckptrepo.types import EDGE_KINDS, Commit

from . import lineage_render, render
from .options import (
    BestBranchOpt,
    BestMetricOpt,
    DepthOpt,
    JsonOpt,
    KindOpt,
    MaximizeOpt,
    PathAArg,
    PathBArg,
    RevArg,
    SubtreeOpt,
    TopOpt,
)
from .session import current

if TYPE_CHECKING:  # loaded when a command runs: `ckpt --version` imports no database stack
    from ckptrepo import Repo


def _kinds(kind: list[str] | None) -> tuple[str, ...]:
    """``--kind`` values (each may list several, comma-separated); every kind when none is given."""
    if not kind:
        return EDGE_KINDS
    return tuple(k for value in kind for k in value.split(","))


def _print(commits: Sequence[Commit], as_json: bool, empty: str) -> None:
    if as_json:
        render.emit_json([c.to_json() for c in commits])
    elif not commits:
        render.err.print(empty)
    else:
        for c in commits:
            render.out.print(render.log_line(c), soft_wrap=True)


def ancestors(rev: RevArg, kind: KindOpt = None, depth: DepthOpt = None, as_json: JsonOpt = False) -> None:
    """List the commits REV descends from, nearest first (REV itself left out)."""
    with current().open() as repo:
        found = repo.commits(repo.ancestors(rev, kinds=_kinds(kind), max_depth=depth))
    _print(found, as_json, "no ancestors")


def descendants(rev: RevArg, kind: KindOpt = None, depth: DepthOpt = None, as_json: JsonOpt = False) -> None:
    """List the commits that descend from REV, nearest first (REV itself left out)."""
    with current().open() as repo:
        found = repo.commits(repo.descendants(rev, kinds=_kinds(kind), max_depth=depth))
    _print(found, as_json, "no descendants")


def path(a: PathAArg, b: PathBArg, kind: KindOpt = None, as_json: JsonOpt = False) -> None:
    """Show a shortest chain of commits from A to B: down to a common ancestor, then up to B
    (lines marked v step to a parent, ^ to a child). Exit 3 when A and B share no ancestor."""
    with current().open() as repo:
        found = _chain(repo, a, b, _kinds(kind))
    if as_json:
        render.emit_json([c.to_json() for c in found])
    else:
        for line in lineage_render.path_lines(found):
            render.out.print(line, soft_wrap=True)


def _chain(repo: Repo, a: str, b: str, kinds: tuple[str, ...]) -> list[Commit]:
    ids = repo.path(a, b, kinds=kinds)
    if not ids:
        raise NoPath(a=a, b=b)
    return repo.commits(ids)


def merge_base(a: PathAArg, b: PathBArg, kind: KindOpt = None, as_json: JsonOpt = False) -> None:
    """Show the best common ancestors of A and B (several after criss-cross merges). Without
    --json, exit 1 when there is none, like git; with --json, print []."""
    with current().open() as repo:
        found = repo.commits(repo.merge_base(a, b, kinds=_kinds(kind)))
    _print(found, as_json, "no common ancestor")
    if not found and not as_json:
        raise typer.Exit(1)


def best(
    metric: BestMetricOpt,
    maximize: MaximizeOpt = False,
    branch: BestBranchOpt = None,
    subtree: SubtreeOpt = None,
    max_count: TopOpt = 1,
    as_json: JsonOpt = False,
) -> None:
    """Show the commits with the best value of a metric (lowest unless --max), among all commits,
    a branch's history (--branch) and/or a subtree (--subtree: REV and its descendants)."""
    with current().open() as repo:
        found = repo.best(metric, maximize=maximize, branch=branch, subtree=subtree, limit=max_count)
    if as_json:
        render.emit_json([{**c.to_json(), "value": c.value(metric)} for c in found])
    elif not found:
        render.err.print(f"no commit in that scope records {metric}")
    else:
        render.out.print(lineage_render.best_table(found, metric))
