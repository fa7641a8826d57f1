"""Every CLI argument and option, declared once as an ``Annotated`` alias.

Commands compose these aliases so that one option reads and behaves the same
everywhere (huggingface_hub style); the parsers for sizes and ``--metric`` live
here as well, and turn bad syntax into Typer usage errors (exit code 2).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$", re.IGNORECASE)
_SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gib": 1 << 30,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
}


def parse_size(text: str) -> int:
    """Bytes from ``4096``, ``512KiB``, ``1MiB``, ``1G`` (K/M/G are binary; KB/MB/GB decimal)."""
    match = _SIZE_RE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise typer.BadParameter(f"expected a size such as 1MiB, 512KiB or 65536, got {text!r}")
    return int(match.group(1)) * _SIZE_UNITS[unit]


@dataclass(frozen=True)
class Metric:
    """One ``--metric NAME=NUMBER``."""

    name: str
    value: float


def parse_metric(text: str) -> Metric:
    """``NAME=NUMBER`` as a Metric; anything else is a usage error."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise typer.BadParameter(f"expected NAME=NUMBER, got {text!r}")
    try:
        number = float(value)
    except ValueError:
        raise typer.BadParameter(f"{name}: {value.strip()!r} is not a number (expected NAME=NUMBER)") from None
    if not math.isfinite(number):
        raise typer.BadParameter(f"{name}: metric values must be finite, got {value.strip()!r}")
    return Metric(name, number)


# Global options -----------------------------------------------------------------

RepoOpt = Annotated[
    Path | None,
    typer.Option(
        "--repo",
        metavar="PATH",
        envvar="CKPT_REPO",
        help="Repository to use: PATH or PATH/.ckpt. Default: the nearest .ckpt/ at or above the working directory.",
        show_default=False,
    ),
]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show the traceback when a command fails.")]

# Shared by many commands --------------------------------------------------------

JsonOpt = Annotated[
    bool,
    typer.Option("--json", help="Print one JSON document on stdout instead of tables (for scripts)."),
]
RevArg = Annotated[
    str,
    typer.Argument(
        metavar="REV",
        help="Commit id or prefix, branch or tag name, REV~N, REV^N or BRANCH@step=N.",
        show_default=False,
    ),
]
OptionalRevArg = Annotated[
    str | None,
    typer.Argument(
        metavar="REV",
        help="Commit id or prefix, branch or tag name, REV~N, REV^N or BRANCH@step=N.",
        show_default=False,
    ),
]

# init ---------------------------------------------------------------------------

InitPathArg = Annotated[
    Path | None,
    typer.Argument(
        metavar="PATH",
        help="Folder to create the repository in (as PATH/.ckpt). Default: --repo, else the working folder.",
        show_default=False,
    ),
]
DbUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--db",
        metavar="URL",
        help="SQLAlchemy database URL, e.g. postgresql+psycopg://host/db. Default: SQLite in .ckpt/.",
        show_default=False,
    ),
]
StoreUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--store",
        metavar="URL",
        help="Chunk store URL (a folder, or an S3-compatible bucket). Default: .ckpt/store.",
        show_default=False,
    ),
]
ChunkSizeOpt = Annotated[
    int | None,
    typer.Option(
        "--chunk-size",
        metavar="SIZE",
        parser=parse_size,
        help="Chunk size, e.g. 1MiB, 512KiB or plain bytes (a multiple of 64, 4KiB..1GiB). Default: 1MiB.",
        show_default=False,
    ),
]
CompressionOpt = Annotated[
    bool,
    typer.Option("--compression/--no-compression", help="Compress stored chunks (zstd, byte grouping, deltas)."),
]

# commit -------------------------------------------------------------------------

InputArg = Annotated[
    Path,
    typer.Argument(
        metavar="FILE|DIR",
        exists=True,
        readable=True,
        help="A .safetensors file, a torch.save file (read with weights_only=True, never unpickling code) or a "
        "Hugging Face model folder (sharded safetensors).",
        show_default=False,
    ),
]
MessageOpt = Annotated[str | None, typer.Option("--message", "-m", help="Commit message.", show_default=False)]
BranchOpt = Annotated[
    str | None,
    typer.Option("--branch", "-b", help="Branch to commit on. Default: main.", show_default=False),
]
StepOpt = Annotated[int | None, typer.Option("--step", min=0, help="Training step of this state.", show_default=False)]
EpochOpt = Annotated[
    int | None, typer.Option("--epoch", min=0, help="Training epoch of this state.", show_default=False)
]
MetricOpt = Annotated[
    list[Metric] | None,
    typer.Option(
        "--metric",
        metavar="NAME=NUMBER",
        parser=parse_metric,
        help="A metric of this state, e.g. --metric loss=1.93 (repeatable).",
        show_default=False,
    ),
]
ParentOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--parent",
        metavar="REV",
        help="Parent commit (repeatable; two or more make a merge). Default: the branch head.",
        show_default=False,
    ),
]

# checkout -----------------------------------------------------------------------

OutputOpt = Annotated[
    Path | None,
    typer.Option(
        "--output",
        "-o",
        metavar="FILE",
        dir_okay=False,
        help="File to write the state to, by suffix: .safetensors, or .pt/.pth/.bin/.ckpt for torch.save. "
        "Required for now.",
        show_default=False,
    ),
]

# log ----------------------------------------------------------------------------

LimitOpt = Annotated[
    int | None,
    typer.Option("--max-count", "-n", min=1, metavar="N", help="Show at most N commits.", show_default=False),
]

# branch / tag -------------------------------------------------------------------

BranchNameArg = Annotated[
    str | None,
    typer.Argument(metavar="NAME", help="Branch to create. Without it: list branches.", show_default=False),
]
TagNameArg = Annotated[
    str | None,
    typer.Argument(metavar="NAME", help="Tag to create. Without it: list tags.", show_default=False),
]
AtRevArg = Annotated[
    str | None,
    typer.Argument(
        metavar="REV",
        help="Commit to point at (any revision). Default: the head of main, else the latest commit.",
        show_default=False,
    ),
]
ForceOpt = Annotated[bool, typer.Option("--force", "-f", help="Move the branch if it already exists.")]

# demo ---------------------------------------------------------------------------

DemoDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--dir",
        metavar="PATH",
        file_okay=False,
        help="Folder for the demo repository (must not hold one yet). Default: a new temporary folder.",
        show_default=False,
    ),
]
DemoStepsOpt = Annotated[
    int,
    typer.Option(
        "--steps",
        min=2,
        metavar="N",
        help="Training steps on main, committing every N/8; the branch forks at the middle commit, trains to step N.",
    ),
]

# verify -------------------------------------------------------------------------

FullOpt = Annotated[
    bool,
    typer.Option("--full", help="Also read every chunk, decode it and check its hash (reads the whole store)."),
]
