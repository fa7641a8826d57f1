"""PNG charts of tensor history and metrics (optional: ``pip install 'ckptrepo[plot]'``).

matplotlib is imported only when a chart is drawn, through its object-oriented API
(``Figure`` + the Agg canvas): nothing touches pyplot's global state or the caller's
backend. Without matplotlib, drawing raises UsageError saying how to install it.
Charts are written atomically (temp file in the same folder, fsynced, renamed), so a
failed or interrupted plot leaves no partial image.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ckptrepo.atomic import atomic_output
from ckptrepo.errors import UsageError
from ckptrepo.types import STAT_FIELDS, HistoryPoint, MetricPoint

DEFAULT_STATS = ("l2_norm", "mean", "std", "abs_max")
_ABSENT_COLOR = "#d62728"


def require() -> None:
    """Fail early, with the install command, when matplotlib is missing (UsageError)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise UsageError(
            "plotting needs matplotlib, which is not installed",
            hint="Install it with `pip install 'ckptrepo[plot]'` (or `pip install matplotlib`).",
        ) from exc


def _figure(rows: int, width: float = 9.0, height_per_row: float = 2.4) -> Any:
    require()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, 1.2 + height_per_row * rows), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def check_output(path: Path) -> None:
    """UsageError unless ``path`` names a .png file in an existing folder."""
    if path.suffix.lower() != ".png":
        raise UsageError(f"cannot write {path}: charts are PNG files", hint="Name the output FILE.png.")
    if not path.parent.is_dir():
        raise UsageError(f"cannot write {path}: no folder {path.parent}", hint="Create the folder first.")


def _save(fig: Any, path: Path) -> None:
    check_output(path)
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)


def _x_axis(points: Sequence[HistoryPoint | MetricPoint]) -> tuple[list[float], str]:
    """Steps when every point has one, else commit order (oldest = 0)."""
    if points and all(p.step is not None for p in points):
        return [float(p.step) for p in points if p.step is not None], "step"
    top = max((p.depth for p in points), default=0)
    return [float(top - p.depth) for p in points], "commit (oldest shown = 0)"


def check_stats(stats: Sequence[str]) -> list[str]:
    """The statistic names, validated against the stored ones (UsageError naming the valid ones)."""
    unknown = [s for s in stats if s not in STAT_FIELDS]
    if unknown or not stats:
        raise UsageError(f"unknown statistic {', '.join(map(repr, unknown)) or '(none given)'}",
                         hint=f"Choose from {', '.join(STAT_FIELDS)}.")
    return list(dict.fromkeys(stats))


def plot_history(
    points: Sequence[HistoryPoint], path: Path, *, name: str, along: str, stats: Sequence[str] = DEFAULT_STATS
) -> None:
    """One panel per statistic of tensor ``name`` along a first-parent chain (``points`` as
    ``history`` returns them, any order), oldest left; commits where the tensor changed are
    dots, commits without the tensor red marks on the axis. Writes ``path`` (.png) atomically."""
    stats = check_stats(stats)
    ordered = sorted(points, key=lambda p: -p.depth)
    xs, xlabel = _x_axis(ordered)
    fig = _figure(len(stats))
    axes = fig.subplots(len(stats), 1, sharex=True, squeeze=False)[:, 0]
    for ax, stat in zip(axes, stats, strict=True):
        ys = [float(v) if (v := _stat(p, stat)) is not None else float("nan") for p in ordered]
        ax.plot(xs, ys, color="#1f77b4", linewidth=1.3)
        changed = [(x, y) for x, y, p in zip(xs, ys, ordered, strict=True) if p.changed and p.present]
        if changed:
            ax.plot(*zip(*changed, strict=True), linestyle="none", marker="o", markersize=3, color="#1f77b4")
        absent = [x for x, p in zip(xs, ordered, strict=True) if not p.present]
        if absent:
            ax.plot(absent, [0] * len(absent), linestyle="none", marker="x", color=_ABSENT_COLOR,
                    transform=ax.get_xaxis_transform(), clip_on=False, label="tensor absent")
            if ax is axes[0]:
                ax.legend(loc="best", fontsize="small")
        ax.set_ylabel(stat)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel(xlabel)
    fig.suptitle(f"{name} along {along}")
    _save(fig, path)


def _stat(p: HistoryPoint, stat: str) -> Any:
    return getattr(p.tensor.stats, stat) if p.tensor is not None else None


def plot_metrics(series: Mapping[str, Sequence[MetricPoint]], names: Sequence[str], path: Path) -> None:
    """One panel per metric in ``names``, one line per branch of ``series`` (branch -> points as
    ``metrics_along`` returns them); commits without the metric are skipped. Writes ``path``."""
    fig = _figure(len(names))
    axes = fig.subplots(len(names), 1, sharex=True, squeeze=False)[:, 0]
    xlabel = "step"
    for ax, metric in zip(axes, names, strict=True):
        for branch, points in series.items():
            ordered = sorted(points, key=lambda p: -p.depth)
            xs, label = _x_axis(ordered)
            xlabel = label if label != "step" else xlabel
            pairs = [(x, p.values[metric]) for x, p in zip(xs, ordered, strict=True) if metric in p.values]
            if pairs:
                ax.plot(*zip(*pairs, strict=True), marker="o", markersize=2.5, linewidth=1.3, label=branch)
        ax.set_ylabel(metric)
        ax.grid(True, alpha=0.3)
        if len(series) > 1:
            ax.legend(loc="best", fontsize="small")
    axes[-1].set_xlabel(xlabel)
    fig.suptitle(", ".join(names) + " along " + ", ".join(series))
    _save(fig, path)
