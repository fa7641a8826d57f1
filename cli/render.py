"""Output for people (rich) and for scripts (one JSON document on stdout).

Human output goes to ``out`` (stdout); progress, notices and errors go to ``err``
(stderr), so ``--json`` keeps stdout to exactly one document. Every string that
comes from a repository or a user is rendered as plain ``Text``, never as markup,
with its control characters made visible (``plain``, ``terminal.one_line``; a commit
message in ``show`` keeps its line breaks: ``terminal.lines``). Both consoles are
``terminal.Console``: no markup, and no wrapping when writing to a pipe or a file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import typer
from rich.text import Text

from ckptrepo.types import (
    Annotation,
    Commit,
    Diff,
    GcReport,
    HistoryPoint,
    Problem,
    PruneReport,
    RebuildReport,
    RefInfo,
    RepackReport,
    ReplicationStatus,
    RepoStats,
    TensorDelta,
    TensorInfo,
    VerifyReport,
    short_id,
)

from . import terminal

if TYPE_CHECKING:
    from rich.table import Table

# file=None: rich writes to whatever sys.stdout / sys.stderr is at print time.
out = terminal.Console()
err = terminal.Console(stderr=True)

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def _table() -> Table:
    """An empty table: a header line over its rows. (rich's tables are imported at first use:
    ``ckpt log`` draws none.)"""
    from rich import box
    from rich.table import Table

    return Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)


def _grid() -> Table:
    """An empty grid: columns two spaces apart, no lines."""
    from rich.table import Table

    return Table.grid(padding=(0, 2))


def emit_json(document: Any) -> None:
    """Write ``document`` as the single JSON document on stdout."""
    typer.echo(json.dumps(document, indent=2, default=str))


@contextmanager
def phases(*, enabled: bool) -> Iterator[Callable[[str], None]]:
    """A spinner on stderr naming the current phase of a long command (nothing when not enabled
    or when stderr is not a terminal); yields the function that names the next phase."""
    if not (enabled and err.is_terminal):  # rich's live display is not even imported then
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
    return "  ".join(f"{terminal.one_line(name)}={value:.4g}" for name, value in sorted(values.items()))


def refs(names: Iterable[str]) -> str:
    return ", ".join(map(terminal.one_line, names))


def optional(value: object) -> str:
    return "" if value is None else terminal.one_line(str(value))


def plain(value: str | None, style: str = "") -> Text:
    """A stored or user-given string as one line of plain text (``terminal.one_line``; None: empty)."""
    return Text(terminal.one_line(value or ""), style=style)


def commit_summary(commit: Commit) -> Text:
    """One line after ``ckpt commit``: what was made and what it cost."""
    text = Text("committed ")
    text.append(commit.short_id, style="bold yellow")
    if commit.branch:
        text.append(f" on {terminal.one_line(commit.branch)}")
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
    if commit.annotations:
        line.append("  [" + metrics(commit.annotations) + "]", style="blue")
    if commit.pruned:
        line.append(" (pruned)", style="dim red")
    if commit.damage is not None:
        line.append(" (damaged)", style="bold red")
    if commit.tiers != ("local",):
        line.append(f" [{tiers(commit.tiers)}]", style="magenta")
    if commit.message:
        line.append("  " + terminal.one_line(commit.message))
    return line


def tiers(names: tuple[str, ...]) -> str:
    """Where a commit is durable: ``local+origin``; ``origin only`` when its data is not here."""
    if "local" in names:
        return "+".join(terminal.one_line(n) for n in names)
    return "+".join(terminal.one_line(n) for n in names) + " only"


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
        ("annotated", metrics(commit.annotations), "blue"),
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
        ("pruned", "yes: metadata and statistics kept, tensors dropped" if commit.pruned else "", "red"),
        ("damaged", commit.damage or "", "bold red"),
        ("tiers", tiers(commit.tiers), "magenta"),
    ]
    grid = _grid()
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    for label, value, style in rows:
        if value:  # the message keeps its line breaks; every other value is one line
            grid.add_row(label, Text(terminal.lines(value), style=style) if label == "message" else plain(value, style))
    return grid


def annotation_table(notes: Sequence[Annotation]) -> Table:
    """``ckpt show`` / ``ckpt annotate REV``: every annotation of a commit, oldest first; a value
    a newer one superseded is marked."""
    table = _table()
    table.add_column("annotated at")
    table.add_column("result", style="blue")
    table.add_column("source")
    table.add_column("")
    for a in notes:
        result = terminal.one_line(a.note or "") if a.name is None else f"{terminal.one_line(a.name)}={a.value:.6g}"
        table.add_row(a.at.isoformat(sep=" ", timespec="seconds"), result, plain(a.source),
                      "" if a.current else Text("superseded", style="dim"))
    return table


def tensor_table(tensors: Sequence[TensorInfo]) -> Table:
    table = _table()
    table.add_column("tensor")
    table.add_column("dtype", style="magenta")
    table.add_column("shape")
    table.add_column("size", justify="right")
    for tensor in tensors:
        shape = "[" + ", ".join(str(d) for d in tensor.shape) + "]"
        table.add_row(plain(tensor.name), plain(tensor.dtype), shape, size(tensor.nbytes))
    return table


def ref_table(refs_: Sequence[RefInfo], commits: Mapping[str, Commit], *, current: str | None = None) -> Table:
    """Branches or tags with the step and message of the commit each names; branch ``current``
    is marked with ``*`` (the others get two spaces, so names stay aligned)."""
    table = _table()
    table.add_column("name", style="cyan")
    table.add_column("commit", style="yellow", no_wrap=True)
    table.add_column("step", justify="right")
    table.add_column("message")
    for ref in refs_:
        commit = commits.get(ref.commit_id)
        marked = ("* " if ref.name == current else "  ") + ref.name if current is not None else ref.name
        table.add_row(
            plain(marked, style="bold green" if ref.name == current else ""),
            short_id(ref.commit_id),
            optional(commit.step) if commit else "",
            plain(commit.message if commit else ""),
        )
    return table


def stats_table(stats: RepoStats, awaiting_repack: tuple[int, int] = (0, 0)) -> Table:
    grid = _grid()
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
    grid.add_row("saved by dedup", size(stats.dedup_saved_bytes), "identical chunks stored once")
    grid.add_row("saved by compression", size(stats.compression_saved_bytes), "zstd and byte grouping, standalone")
    grid.add_row("saved by delta", size(stats.delta_saved_bytes),
                 f"{stats.delta_chunks} chunks stored as a difference from a base chunk")
    if awaiting_repack[0]:
        grid.add_row("awaiting repack", size(awaiting_repack[1]),
                     f"{awaiting_repack[0]} packs stored raw by commits; `ckpt repack` encodes them")
    return grid


def verify_summary(report: VerifyReport) -> Table:
    """``ckpt verify``: what was checked."""
    c = report.checked
    grid = _grid()
    grid.add_column(style="bold")
    grid.add_column(justify="right")
    grid.add_column(style="dim")
    grid.add_row("packs", str(c.packs), f"{size(c.pack_bytes)}: present, size, index and name checked")
    grid.add_row("chunks", str(c.chunks), "located in their pack's index")
    if report.full:
        grid.add_row("chunks read", str(c.chunks_read), f"{size(c.bytes_read)} decoded and hash-verified")
    grid.add_row("tensors", str(c.tensors), "chunk lists complete")
    grid.add_row("commits", str(c.commits), f"{c.refs} refs; entries, tensors and parents present")
    grid.add_row("store objects", str(c.store_objects), "each named by a pack row or a commit, else unreferenced")
    grid.add_row("time", seconds(c.seconds), "")
    return grid


def gc_summary(report: GcReport) -> Table:
    """``ckpt gc``: what was (or, with --dry-run, would be) removed, and what was kept."""
    would = "would remove" if report.dry_run else "removed"
    grid = _grid()
    grid.add_column(style="bold")
    grid.add_column(justify="right")
    grid.add_column(style="dim")
    grid.add_row("commits", str(report.commits_removed), f"{would}: no branch or tag reaches them")
    grid.add_row("tensors", str(report.tensors_removed), f"{would}: no remaining commit has them")
    grid.add_row("chunks", str(report.chunks_removed), f"{would}: no remaining tensor or delta needs them")
    grid.add_row("packs", str(report.packs_removed), f"{would}: all their chunks went")
    grid.add_row("unreferenced packs", str(report.unreferenced_packs_removed), f"{would}: left by interrupted commits")
    grid.add_row("temporary files", str(report.temporary_files_removed), f"{would}: left by interrupted writes")
    grid.add_row("freed" if not report.dry_run else "would free", size(report.bytes_freed), "")
    if report.young_objects_kept:
        grid.add_row("kept (young)", str(report.young_objects_kept),
                     f"{size(report.young_bytes_kept)} younger than {report.grace_s:g} s: a later gc removes them")
    if report.leased_objects_kept:
        grid.add_row("kept (leased)", str(report.leased_objects_kept),
                     f"{size(report.leased_bytes_kept)} a writer in progress may own: a later gc removes them")
    if report.links_skipped:
        grid.add_row("symbolic links", str(report.links_skipped),
                     "in the store's staging folder: not followed, not removed (remove them by hand)")
    if report.partial_packs:
        grid.add_row("kept (partly live)", str(report.partial_packs),
                     f"packs also holding live chunks; {size(report.dead_bytes_in_partial_packs)} of dead ones")
    grid.add_row("time", seconds(report.seconds), "")
    return grid


def prune_table(commits: Sequence[Commit], more: int) -> Table:
    """``ckpt prune``: the commits it pruned (or would), ``more`` of them left out."""
    table = _table()
    table.add_column("pruned", style="yellow", no_wrap=True)
    table.add_column("step", justify="right")
    table.add_column("branch", style="cyan")
    table.add_column("metrics", style="green")
    table.add_column("message", overflow="fold")
    for c in commits:
        table.add_row(c.short_id, optional(c.step), plain(c.branch), metrics(c.metrics), plain(c.message))
    if more:
        table.add_row(f"+{more} more", "", "", "", "")
    return table


def prune_summary(report: PruneReport, rules: str, saved: bool) -> Table:
    """``ckpt prune``: what was considered, kept (and why) and pruned, and what gc then frees."""
    grid = _grid()
    grid.add_column(style="bold")
    grid.add_column(justify="right")
    grid.add_column(style="dim")
    grid.add_row("rules", "", rules + ("  (saved: applied after every commit)" if saved else ""))
    grid.add_row("considered", str(report.considered), "commits on the first-parent lines in scope")
    kept = ", ".join(f"{reason} {n}" for reason, n in report.kept_by.items())
    grid.add_row("kept", str(report.kept), kept)
    grid.add_row("would prune" if report.dry_run else "pruned", str(len(report.pruned)),
                 "they stay in log, show, history and diff; their state can no longer be checked out")
    if report.already_pruned:
        grid.add_row("already pruned", str(report.already_pruned), "")
    grid.add_row("gc would free" if report.dry_run else "gc frees", size(report.freeable_bytes),
                 f"{report.freeable_chunks} chunks only pruned commits use; {report.freeable_packs} packs "
                 f"({size(report.freeable_pack_bytes)}) go whole" + ("" if report.dry_run else "; run `ckpt gc`"))
    grid.add_row("time", seconds(report.seconds), "")
    return grid


def repack_summary(report: RepackReport) -> Table:
    """``ckpt repack``: what was read, encoded, copied and written, and the bytes before and after."""
    grid = _grid()
    grid.add_column(style="bold")
    grid.add_column(justify="right")
    grid.add_column(style="dim")
    would = "to read" if report.dry_run else "read"
    grid.add_row("packs", str(report.packs_read),
                 f"{would}: {report.deferred_packs} written raw by commits, {report.sparse_packs} mostly dead")
    if report.dry_run:
        grid.add_row("bytes", size(report.bytes_before), "stored in their live chunks now")
        return grid
    grid.add_row("chunks encoded", str(report.chunks_encoded), f"{report.delta_chunks} of them as deltas")
    grid.add_row("chunks copied", str(report.chunks_copied), "moved as they were")
    grid.add_row("bytes", f"{size(report.bytes_before)} -> {size(report.bytes_after)}", "the moved chunks, stored")
    grid.add_row("packs written", str(report.packs_written), size(report.pack_bytes_written))
    grid.add_row("packs retired", str(report.packs_retired), "a gc deletes them once older than its grace period")
    grid.add_row("time", seconds(report.seconds), f"{report.cpu_s:.2f} CPU-s")
    return grid


def last_good_table(report: VerifyReport) -> Table:
    """``ckpt verify``: per branch, the newest commit no error breaks (what to resume from)."""
    table = _table()
    table.add_column("branch")
    table.add_column("last known good")
    heads = dict(report.heads)
    for branch, commit in report.last_good.items():
        if commit is None:
            good = Text("none: every commit of its line is broken", style="red")
        elif commit == heads.get(branch):
            good = Text(short_id(commit)).append(" (its head)", style="dim")
        else:
            good = Text(short_id(commit), style="yellow").append(" (its head is broken)", style="red")
        table.add_row(plain(branch, style="cyan"), good)
    return table


def verify_verdict(report: VerifyReport) -> Text:
    """``ckpt verify``'s last line: ok, or how many errors, plus reclaimable warnings."""
    n_err, n_warn = len(report.errors), len(report.warnings)
    verdict = Text("ok", style="bold green") if report.ok else Text(f"{n_err} errors", style="bold red")
    if n_warn:
        verdict.append(f", {n_warn} warnings (nothing lost; each says what to do)", style="yellow")
    return verdict


def problem_table(problems: Sequence[Problem]) -> Table:
    """One row per verify problem: severity, kind, what is wrong, and the commits it breaks."""
    table = _table()
    table.add_column("severity")
    table.add_column("kind")
    table.add_column("problem", overflow="fold")
    table.add_column("breaks", style="yellow")
    for p in problems:
        style = "red" if p.severity == "error" else "yellow"
        extra = f" ({size(p.size)}, {seconds(p.age_s or 0.0)} old)" if p.size is not None else ""
        shown = ", ".join(short_id(c) for c in p.commits[:3])
        if len(p.commits) > 3:
            shown += f" +{len(p.commits) - 3} more"
        table.add_row(plain(p.severity, style=style), plain(p.kind), plain(p.detail + extra), shown)
    return table


# -- diff / history ------------------------------------------------------------------------------

_STATUS_STYLE = {"changed": "yellow", "added": "green", "removed": "red", "unchanged": "dim", "absent": "dim"}
_STATUS_MARK = {"changed": "~", "added": "+", "removed": "-", "unchanged": "=", "absent": "·"}


def num(x: float | int | None, *, signed: bool = False) -> str:
    """A figure in 3 significant digits (``+`` on deltas), empty when unknown."""
    if x is None:
        return ""
    return f"{x:+.3g}" if signed else f"{x:.3g}"


def _relative(a: float | None, b: float | None) -> str:
    """b against a in percent (``+12.5%``), empty when a is 0 or unknown."""
    return f"{100 * (b - a) / a:+.3g}%" if a and b is not None else ""


def _shape(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _chunks(changed: int, total: int) -> str:
    return f"{changed}/{total}" if total else ""


def diff_note(t: TensorDelta) -> str:
    """A diff row's words: the added/removed tensor's layout, shape/dtype changes, why not exact."""
    parts = []
    if t.status in ("added", "removed"):
        side = t.b if t.status == "added" else t.a
        assert side is not None
        parts.append(f"{_shape(side.shape)} {side.dtype}")
    if t.shape_changed and t.a and t.b:
        parts.append(f"shape {_shape(t.a.shape)} -> {_shape(t.b.shape)}")
    if t.dtype_changed and t.a and t.b:
        parts.append(f"dtype {t.a.dtype} -> {t.b.dtype}")
    if t.note and not (t.shape_changed or t.dtype_changed):
        parts.append(t.note)
    return "; ".join(parts)


def diff_summary(d: Diff) -> Text:
    """``diff A..B (stat): N changed, ...`` plus the legend of the status marks."""
    counts = d.counts
    text = Text("diff ").append(short_id(d.a), style="yellow").append("..").append(short_id(d.b), style="yellow")
    text.append(f" ({'exact' if d.exact else 'stat'}): ")
    text.append(", ".join(f"{counts[k]} {k} ({_STATUS_MARK[k]})" for k in ("changed", "added", "removed",
                                                                          "unchanged")))
    return text


def file_table(files: Mapping[str, int]) -> Table:
    """The files a commit keeps beside its tensors, with their sizes."""
    table = _table()
    table.add_column("file")
    table.add_column("size", justify="right")
    for path, nbytes in files.items():
        table.add_row(plain(path), size(nbytes))
    return table


def diff_files(files: Mapping[str, str]) -> Text:
    """``files: config.json changed, tokenizer.json added``: the kept files that differ."""
    text = Text("files: ")
    for i, (path, status) in enumerate(files.items()):
        text.append(", " if i else "").append(plain(path)).append(f" {status}")
    return text


def diff_table(tensors: Sequence[TensorDelta], *, exact: bool) -> Table:
    """One row per tensor: status mark, name, chunks that differ; then the L2 norm's relative change
    and the mean/std deltas (stat), or ‖b−a‖, ‖b−a‖/‖a‖, cosine similarity and max |b−a| (exact)."""
    table = _table()
    table.add_column("", no_wrap=True)
    table.add_column("tensor", overflow="fold", ratio=3)
    table.add_column("chunks", justify="right", no_wrap=True)
    figures = ("‖b−a‖", "rel", "cos", "max|Δ|") if exact else ("Δl2", "Δmean", "Δstd")
    for name in figures:
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("note", overflow="fold", ratio=2, style="dim")
    for t in tensors:
        changed = t.status == "changed"
        row: list[str | Text] = [Text(_STATUS_MARK[t.status], style=_STATUS_STYLE[t.status]), plain(t.name),
                                 _chunks(t.chunks_changed, t.n_chunks) if t.status != "unchanged" else ""]
        if exact:
            e = t.exact if changed else None
            row += ["", "", "", ""] if e is None else [
                num(e.l2_diff), num(e.rel_change), "" if e.cosine is None else f"{e.cosine:.6f}",
                num(e.max_abs_diff)]
        elif changed and t.a and t.b:
            row += [_relative(t.a.stats.l2_norm, t.b.stats.l2_norm),
                    num(t.deltas.get("mean"), signed=True), num(t.deltas.get("std"), signed=True)]
        else:
            row += ["", "", ""]
        table.add_row(*row, plain(diff_note(t)))
    return table


def history_summary(name: str, along: str, points: Sequence[HistoryPoint]) -> Text:
    """``NAME along REV: N commits, newest first; ...`` with the legend of the status marks."""
    counts = {k: sum(p.status == k for p in points) for k in _STATUS_MARK}
    text = plain(name, style="bold").append(f" along {terminal.one_line(along)}: {len(points)} commits, newest first; ")
    text.append(", ".join(f"{counts[k]} {k} ({_STATUS_MARK[k]})" for k in _STATUS_MARK if counts[k]))
    return text


def history_table(points: Sequence[HistoryPoint]) -> Table:
    """One row per commit: status mark against its first parent, chunks that changed, stored
    statistics, and the L2 norm's relative change; a pruned commit's id says ``(pruned)``."""
    table = _table()
    table.add_column("commit", style="yellow", no_wrap=True)
    table.add_column("step", justify="right", no_wrap=True)
    table.add_column("", no_wrap=True)
    for name in ("chunks", "mean", "std", "l2_norm", "abs_max", "Δl2"):
        table.add_column(name, justify="right", no_wrap=True)
    for p in points:
        s = p.tensor.stats if p.tensor else None
        changed = p.status == "changed"
        commit = Text(short_id(p.commit_id)).append(" (pruned)", style="dim red") if p.pruned else short_id(p.commit_id)
        table.add_row(
            commit, optional(p.step), Text(_STATUS_MARK[p.status], style=_STATUS_STYLE[p.status]),
            _chunks(p.chunks_changed, p.n_chunks) if changed else "",
            *(num(getattr(s, f)) if s else "" for f in ("mean", "std", "l2_norm", "abs_max")),
            _relative(p.previous.stats.l2_norm, s.l2_norm) if changed and p.previous and s else "",
        )
    return table


def rebuild_summary(report: RebuildReport) -> Table:
    """``ckpt db rebuild``: what came back from the store, and what could not."""
    grid = _grid()
    grid.add_column(style="bold")
    grid.add_column(justify="right")
    grid.add_column(style="dim")
    grid.add_row("database", "", plain(report.database))
    grid.add_row("commits", str(report.commits), f"from their manifests ({size(report.manifest_bytes)}), "
                 f"{report.pruned} of them pruned")
    if report.recovered:
        grid.add_row("recovered", str(report.recovered), "commits whose manifest was missing or damaged, "
                     "from the database replaced")
    if report.damaged:
        grid.add_row("damaged", str(report.damaged), "commits whose manifest or data is missing or damaged: "
                     "kept in the lineage, not readable", style="red")
    grid.add_row("branches", str(report.branches), f"{report.conflicts} kept on conflicts/ branches")
    grid.add_row("tags", str(report.tags), f"replayed with {report.journal_entries} journal entries")
    grid.add_row("packs", str(report.packs), f"{report.chunks} chunks indexed from their footers")
    if report.moved_aside:
        grid.add_row("old database", "", plain(f"kept as {report.moved_aside}"))
    for why in report.skipped:
        grid.add_row("skipped", "", plain(why), style="yellow")
    grid.add_row("time", seconds(report.seconds), "")
    return grid



def replication_rows(status: ReplicationStatus) -> dict[str, str]:
    """``ckpt status`` rows for the replica remote: the backlog, each branch's recovery point
    (what the local tier alone holds), the last replication error."""
    rows = {"replica": f"{status.remote}: {status.backlog_commits} commit(s), {size(status.backlog_bytes)} "
                       "waiting to replicate"}
    for p in status.points:
        if p.commits_at_risk == 0:
            rows[f"  {p.branch}"] = f"on {status.remote} up to its head {short_id(p.local)}"
            continue
        at = f"{status.remote} has {short_id(p.remote)}" if p.remote is not None else f"{status.remote} has none of it"
        lost = f"{p.commits_at_risk} commit(s)"
        if p.steps_at_risk is not None:
            lost += f", {p.steps_at_risk} steps"
        if p.seconds_at_risk is not None:
            lost += f", {p.seconds_at_risk:.0f} s"
        rows[f"  {p.branch}"] = f"{at}; only here: {lost}"
    if status.last_error is not None:
        rows["  last error"] = status.last_error
    return rows


def status_grid(branch: str, head: Commit | None, where: Mapping[str, str]) -> Table:
    """``ckpt status``: the current branch and its head commit (step, message), or that the branch
    has no commits yet; then ``where`` (label -> the repository's folder, database, store)."""
    grid = _grid()
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    grid.add_row("branch", plain(branch, style="bold green"))
    if head is None:
        grid.add_row("head", Text("no commits yet: the next commit creates the branch", style="yellow"))
    else:
        line = Text(head.short_id, style="yellow")
        if head.step is not None:
            line.append(f" step {head.step}", style="bold")
        if head.pruned:
            line.append(" (pruned)", style="dim red")
        if head.message:
            line.append("  ").append_text(plain(head.message))
        grid.add_row("head", line)
    for label, value in where.items():
        grid.add_row(label, plain(value))
    return grid
