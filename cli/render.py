"""Output for people (rich) and for scripts (one JSON document on stdout).

Human output goes to ``out`` (stdout); progress, notices and errors go to ``err``
(stderr), so ``--json`` keeps stdout to exactly one document. Every string that
comes from a repository or a user is rendered as plain ``Text``, never as markup.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ckptrepo.ids import short
from ckptrepo.types import Commit, Problem, RefInfo, RepoStats, TensorInfo, VerifyReport

# file=None: rich writes to whatever sys.stdout / sys.stderr is at print time.
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def emit_json(document: Any) -> None:
    """Write ``document`` as the single JSON document on stdout."""
    typer.echo(json.dumps(document, indent=2, default=str))


@contextmanager
def phases(*, enabled: bool) -> Iterator[Callable[[str], None]]:
    """A spinner on stderr naming the current phase of a long command (nothing when not enabled
    or when stderr is not a terminal); yields the function that names the next phase."""
    if not enabled:
        yield lambda _description: None
        return
    with err.status("") as status:
        yield lambda description: status.update(description)


def size(n: int | float) -> str:
    """Bytes in binary units: ``512 B``, ``1.5 KiB``, ``12.3 MiB``."""
    if abs(n) < 1024:
        return f"{int(n)} B"
    value = float(n)
    for unit in _UNITS:
        value /= 1024
        if abs(value) < 1024 or unit == _UNITS[-1]:
            break
    return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"


def seconds(s: float) -> str:
    """A duration: ``850 µs``, ``12.3 ms``, ``1.24 s``."""
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    return f"{s:.3g} s"


def ratio(x: float) -> str:
    return f"{x:.2f}x"


def metrics(values: Mapping[str, float]) -> str:
    return "  ".join(f"{name}={value:.4g}" for name, value in sorted(values.items()))


def refs(names: Iterable[str]) -> str:
    return ", ".join(names)


def optional(value: object) -> str:
    return "" if value is None else str(value)


def commit_summary(commit: Commit) -> Text:
    """One line after ``ckpt commit``: what was made and what it cost."""
    text = Text("committed ")
    text.append(commit.short_id, style="bold yellow")
    if commit.branch:
        text.append(f" on {commit.branch}")
    if commit.step is not None:
        text.append(f" at step {commit.step}")
    text.append(
        f": {commit.n_tensors} tensors, {size(commit.logical_bytes)} logical, {size(commit.new_bytes)} new, "
        f"{size(commit.stored_bytes)} stored"
    )
    return text


def log_line(commit: Commit) -> Text:
    """One line per commit, git style: ``id (refs) step N  metrics  message`` (empty parts left out)."""
    line = Text().append(commit.short_id, style="yellow")
    if commit.refs:
        line.append(" (").append(refs(commit.refs), style="cyan").append(")")
    if commit.step is not None:
        line.append(f" step {commit.step}", style="bold")
    if commit.metrics:
        line.append("  " + metrics(commit.metrics), style="green")
    if commit.message:
        line.append("  " + commit.message)
    return line


def commit_fields(commit: Commit) -> Table:
    """``ckpt show``: a commit's identity, lineage, context and ingest figures as a two-column grid."""
    rows: list[tuple[str, str, str]] = [  # label, value, style; rows with an empty value are left out
        ("commit", commit.id, "yellow"),
        ("refs", refs(commit.refs), "cyan"),
        ("branch", optional(commit.branch), ""),
        ("date", commit.created_at.isoformat(sep=" ", timespec="seconds"), ""),
        ("author", f"{commit.author}@{commit.host}" if commit.host else commit.author, ""),
        ("step", optional(commit.step), ""),
        ("epoch", optional(commit.epoch), ""),
        ("message", commit.message, ""),
        ("code", optional(commit.code_version), ""),
    ]
    for parent in commit.parents:
        mapped = f" ({len(parent.mapping)} tensors mapped)" if parent.mapping else ""
        rows.append((parent.kind, parent.id + mapped, ""))
    rows += [
        ("metrics", metrics(commit.metrics), ""),
        ("config", "" if commit.config is None else json.dumps(commit.config, default=str), ""),
        ("tensors", str(commit.n_tensors), ""),
        (
            "bytes",
            f"{size(commit.logical_bytes)} logical, {size(commit.new_bytes)} new, {size(commit.stored_bytes)} stored",
            "",
        ),
        (
            "time",
            f"stall {seconds(commit.stall_s)} (waiting {seconds(commit.wait_s)}), persist {seconds(commit.persist_s)}",
            "",
        ),
        ("nonfinite", f"{commit.nonfinite} NaN/Inf values" if commit.nonfinite else "", "red"),
    ]
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for label, value, style in rows:
        if value:
            grid.add_row(label, Text(value, style=style))
    return grid


def tensor_table(tensors: Sequence[TensorInfo]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("tensor")
    table.add_column("dtype", style="magenta")
    table.add_column("shape")
    table.add_column("size", justify="right")
    for tensor in tensors:
        shape = "[" + ", ".join(str(d) for d in tensor.shape) + "]"
        table.add_row(Text(tensor.name), tensor.dtype, shape, size(tensor.nbytes))
    return table


def ref_table(refs_: Sequence[RefInfo], commits: Mapping[str, Commit]) -> Table:
    """Branches or tags with the step and message of the commit each names."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("name", style="cyan")
    table.add_column("commit", style="yellow", no_wrap=True)
    table.add_column("step", justify="right")
    table.add_column("message")
    for ref in refs_:
        commit = commits.get(ref.commit_id)
        table.add_row(
            Text(ref.name),
            short(ref.commit_id),
            optional(commit.step) if commit else "",
            Text(commit.message) if commit else Text(""),
        )
    return table


def stats_table(stats: RepoStats) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(justify="right")
    grid.add_column(style="dim")
    grid.add_row("commits", str(stats.commits), f"{stats.branches} branches, {stats.tags} tags")
    grid.add_row("tensors", str(stats.tensors), "distinct")
    grid.add_row("chunks", str(stats.chunks), f"in {stats.packs} packs")
    grid.add_row("logical", size(stats.logical_bytes), "every commit's state, summed")
    grid.add_row("unique", size(stats.unique_bytes), f"dedup {ratio(stats.dedup_ratio)}")
    grid.add_row("stored", size(stats.stored_bytes), f"compression {ratio(stats.compression_ratio)}")
    grid.add_row("packs", size(stats.pack_bytes), "on disk, including indexes")
    return grid


def verify_summary(report: VerifyReport) -> Table:
    """``ckpt verify``: what was checked."""
    c = report.checked
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(justify="right")
    grid.add_column(style="dim")
    grid.add_row("packs", str(c.packs), f"{size(c.pack_bytes)}: present, size, index and name checked")
    grid.add_row("chunks", str(c.chunks), "located in their pack's index")
    if report.full:
        grid.add_row("chunks read", str(c.chunks_read), f"{size(c.bytes_read)} decoded and hash-verified")
    grid.add_row("tensors", str(c.tensors), "chunk lists complete")
    grid.add_row("commits", str(c.commits), f"{c.refs} refs; entries, tensors and parents present")
    grid.add_row("store objects", str(c.store_objects), "each named by a pack row, else listed as unreferenced")
    grid.add_row("time", seconds(c.seconds), "")
    return grid


def verify_verdict(report: VerifyReport) -> Text:
    """``ckpt verify``'s last line: ok, or how many errors, plus reclaimable warnings."""
    n_err, n_warn = len(report.errors), len(report.warnings)
    verdict = Text("ok", style="bold green") if report.ok else Text(f"{n_err} errors", style="bold red")
    if n_warn:
        verdict.append(f", {n_warn} warnings (leftovers gc reclaims)", style="yellow")
    return verdict


def problem_table(problems: Sequence[Problem]) -> Table:
    """One row per verify problem: severity, kind, what is wrong, and the commits it breaks."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("severity")
    table.add_column("kind")
    table.add_column("problem", overflow="fold")
    table.add_column("breaks", style="yellow")
    for p in problems:
        style = "red" if p.severity == "error" else "yellow"
        extra = f" ({size(p.size)}, {seconds(p.age_s or 0.0)} old)" if p.size is not None else ""
        shown = ", ".join(short(c) for c in p.commits[:3])
        if len(p.commits) > 3:
            shown += f" +{len(p.commits) - 3} more"
        table.add_row(Text(p.severity, style=style), p.kind, Text(p.detail + extra), shown)
    return table
