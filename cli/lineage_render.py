"""Rendering for the lineage commands: ``log --graph``'s ASCII graph, ``best``'s table, path lines.

Kept apart from ``render`` (shared output helpers) because the graph layout is a small
algorithm of its own. Like ``render``, strings from the repository become plain ``Text``
with their control characters made visible (``render.plain``).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from rich import box
from rich.table import Table
from rich.text import Text

from ckptrepo.types import Commit

from . import render


def topo_order(commits: Sequence[Commit]) -> list[Commit]:
    """``commits`` reordered so that each comes after every child of it in the list, otherwise
    keeping the given order (git's ``--date-order`` on a newest-first list)."""
    index = {c.id: i for i, c in enumerate(commits)}
    waiting = [0] * len(commits)  # children in the list not yet emitted
    for c in commits:
        for p in dict.fromkeys(c.parent_ids):
            if p in index:
                waiting[index[p]] += 1
    ready = [i for i, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    out: list[Commit] = []
    while ready:
        c = commits[heapq.heappop(ready)]
        out.append(c)
        for p in dict.fromkeys(c.parent_ids):
            if p in index:
                waiting[index[p]] -= 1
                if waiting[index[p]] == 0:
                    heapq.heappush(ready, index[p])
    return out


def _row(cells: dict[int, str]) -> str:
    width = max(cells) + 1 if cells else 0
    return "".join(cells.get(i, " ") for i in range(width)).rstrip()


def graph_rows(commits: Sequence[Commit]) -> list[tuple[str, Commit | None]]:
    """Rows of an ASCII lineage graph like ``git log --graph``: (graph text, the commit drawn on
    that row or None for a connecting row), commits in ``topo_order``.

    Lane k is drawn at column 2k. ``*`` is a commit; ``|`` a line going on; ``/`` and ``\\``
    lines moving one lane; ``_`` a line crossing lanes to join another; a merge of n > 2
    parents is drawn ``*-.``. Edges to commits not in ``commits`` (outside a page, filtered
    out) are not drawn: such a commit ends its lane.
    """
    shown = {c.id for c in commits}
    lanes: list[str | None] = []  # the commit each lane leads to; None: reserved for an octopus fan-out
    rows: list[tuple[str, Commit | None]] = []
    for c in topo_order(commits):
        if c.id not in lanes:
            lanes.append(c.id)
        col = lanes.index(c.id)
        while c.id in lanes[col + 1 :]:  # lines from other children join this commit's lane
            j = lanes.index(c.id, col + 1)
            cells = {2 * k: "|" for k in range(j)}
            cells.update({2 * k + 1: "_" for k in range(col, j - 1)})
            cells[2 * j - 1] = "/"
            cells.update({2 * k - 1: "/" for k in range(j + 1, len(lanes))})
            rows.append((_row(cells), None))
            del lanes[j]
        parents = [p for p in dict.fromkeys(c.parent_ids) if p in shown]
        extra = len(parents) - 1
        for _ in range(extra - 1):  # make room right of an octopus merge for its fan-out
            if col + 1 < len(lanes):
                cells = {2 * k: "|" for k in range(col + 1)}
                cells.update({2 * k + 1: "\\" for k in range(col + 1, len(lanes)) if lanes[k] is not None})
                rows.append((_row(cells), None))
            lanes.insert(col + 1, None)
        cells = {2 * k: "|" for k in range(len(lanes)) if lanes[k] is not None}
        cells[2 * col] = "*"
        if extra >= 2:
            cells.update({2 * col + i: "-" for i in range(1, 2 * extra - 2)})
            cells[2 * col + 2 * extra - 2] = "."
        rows.append((_row(cells), c))
        if not parents:
            if col + 1 < len(lanes):  # the lanes to the right move one to the left
                cells = {2 * k: "|" for k in range(col)}
                cells.update({2 * k - 1: "/" for k in range(col + 1, len(lanes))})
                rows.append((_row(cells), None))
            del lanes[col]
            continue
        lanes[col] = parents[0]
        if extra >= 1:
            lanes[col + 1 : col + extra] = parents[1:extra]
            cells = {2 * k: "|" for k in range(col + 1)}
            cells.update({2 * col + 1 + 2 * i: "\\" for i in range(extra)})
            # Lanes right of the fan-out each move one lane to the right.
            cells.update({2 * k + 1: "\\" for k in range(col + extra, len(lanes))})
            lanes.insert(col + extra, parents[extra])
            rows.append((_row(cells), None))
    return rows


def graph_lines(commits: Sequence[Commit]) -> list[Text]:
    """``log --graph``: each commit's log line after its graph row, connecting rows on their own."""
    out: list[Text] = []
    for prefix, commit in graph_rows(commits):
        line = Text(prefix, style="red")
        if commit is not None:
            line.append(" ").append_text(render.log_line(commit))
        out.append(line)
    return out


def path_lines(commits: Sequence[Commit]) -> list[Text]:
    """``lineage path``: one log line per commit, marked ``v`` where the chain steps down to a
    parent and ``^`` where it steps up to a child."""
    out: list[Text] = []
    for i, commit in enumerate(commits):
        mark = "*" if i == 0 else ("v" if commit.id in commits[i - 1].parent_ids else "^")
        out.append(Text(mark + " ", style="bold").append_text(render.log_line(commit)))
    return out


def best_table(commits: Sequence[Commit], metric: str) -> Table:
    """``ckpt best``: rank, commit, metric value, step, branch and message."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("#", justify="right")
    table.add_column("commit", style="yellow", no_wrap=True)
    table.add_column(render.plain(metric), justify="right", style="green")
    table.add_column("step", justify="right")
    table.add_column("branch", style="cyan")
    table.add_column("message")
    for rank, c in enumerate(commits, 1):
        table.add_row(str(rank), c.short_id, f"{c.value(metric):.6g}", render.optional(c.step),
                      render.plain(c.branch), render.plain(c.message))
    return table
