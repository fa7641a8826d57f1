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

from ckptrepo import knobs

from .session import current

# Bounds of the integers and durations a user gives (larger ones are Typer usage errors, exit 2,
# before any query: the database holds 64-bit integers, ``datetime`` about 10,000 years).
# The library's own bounds (``ckptrepo.db.integers``, below the CLI's public API), checked here too
# so that Typer reports them as usage errors before a repository is opened.
INT64_MAX = 2**63 - 1  # a step or an epoch (a column)
MAX_COUNT = 10**18  # how many commits, edges, steps: what the library's queries take
MAX_SECONDS = 100 * 366 * 86400  # a grace period or an age to keep
DEMO_MAX_STEPS = 1_000_000  # the demo trains one step at a time, ~1 ms each

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


def _finite_grace(value: float) -> float:
    """``--grace`` when it is a number of seconds (not nan, which no range check refuses)."""
    if not math.isfinite(value):
        raise typer.BadParameter(f"expected a number of seconds from 0 to {MAX_SECONDS}, got {value}")
    return value


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _bounded_duration(value: str | None) -> str | None:
    """``--keep-younger-than`` as given, once it is known to be at most ``MAX_SECONDS`` (the
    library parses it and refuses other syntax with its own hint)."""
    match = _DURATION_RE.match(value) if value is not None else None
    if match is not None and float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()] > MAX_SECONDS:
        raise typer.BadParameter(f"{match.group(0).strip()} is longer than the {MAX_SECONDS // (366 * 86400)} years a "
                                 "commit's age is looked at (use e.g. 90s, 30m, 12h, 7d or 2w)")
    return value


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
        envvar=knobs.KNOBS["REPO"].variable,
        help=f"Repository to use: PATH or PATH/.ckpt. Default: {knobs.KNOBS['REPO'].shown_default}.",
        show_default=False,
    ),
]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show the traceback when a command fails.")]
ReadOnlyOpt = Annotated[bool, typer.Option(
    "--read-only", help="Open the repository read-only: write nothing, refuse commands that write (exit 7). A "
                        "repository on a read-only filesystem opens so by itself.")]

# Shared by many commands --------------------------------------------------------


def _json_failures(value: bool) -> bool:
    """``--json`` also makes a failure one line of JSON on stderr (``failures.emit``). Eager, so
    that it is known before any other argument is checked."""
    if value:
        current().json = True
    return value


JsonOpt = Annotated[
    bool,
    typer.Option("--json", is_eager=True, callback=_json_failures,
                 help="Print one JSON document on stdout instead of tables (for scripts); a failure is one line "
                 'on stderr, {"error", "hint", "exit_code"}.'),
]
REV_HELP = "Commit id or prefix, branch or tag name, REV~N, REV^N or BRANCH@step=N."
RevArg = Annotated[
    str,
    typer.Argument(
        metavar="REV",
        help=REV_HELP,
        show_default=False,
    ),
]
OptionalRevArg = Annotated[
    str | None,
    typer.Argument(
        metavar="REV",
        help=REV_HELP,
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
    typer.Option("--compression/--no-compression",
                 help="Compress stored chunks (zstd, byte grouping, deltas); --no-compression stores them raw."),
]
DeltaOpt = Annotated[
    bool,
    typer.Option("--delta/--no-delta", help="Store chunks as differences from the parent's when that is smaller."),
]
EncodeOpt = Annotated[
    str,
    typer.Option("--encode", metavar="auto|inline|deferred",
                 help="When new chunks are encoded: auto (asynchronous commits store them raw and a background "
                      "repack encodes them when the process is idle; blocking commits encode), inline (while "
                      "committing), deferred (only by `ckpt repack`)."),
]
DeltaBaseOpt = Annotated[
    str,
    typer.Option("--delta-base", metavar="root|parent",
                 help="Delta against the parent chunk's keyframe (root: reads decode at most 2 chunks) "
                      "or the parent chunk itself (parent: chains up to --max-delta-depth)."),
]
DeltaDepthOpt = Annotated[
    int | None,
    typer.Option("--max-delta-depth", metavar="N",
                 help="Commits per keyframe (root) or longest chain (parent), 1..64. Default: 8.",
                 show_default=False),
]

# commit -------------------------------------------------------------------------

AllowPickleOpt = Annotated[
    bool,
    typer.Option(
        "--allow-pickle",
        help="Load torch.save files with full unpickling (a Lightning .ckpt with hyper-parameter objects): this "
        "runs any code the file holds, so only for files you trust. The commit then needs allow_pickle to restore.",
    ),
]
RunDirArg = Annotated[
    Path,
    typer.Argument(
        metavar="DIR",
        exists=True,
        file_okay=False,
        help="A Hugging Face Trainer's output_dir (checkpoint-N folders) or a folder of Lightning .ckpt files.",
        show_default=False,
    ),
]
InputArg = Annotated[
    list[Path],
    typer.Argument(
        metavar="FILE|DIR",
        exists=True,
        readable=True,
        help="A .safetensors file, a torch.save file (read with weights_only=True, never unpickling code), a "
        "torch.distributed.checkpoint folder (its shards assembled into whole tensors) or a Hugging Face model "
        "folder (sharded safetensors); several are committed one after the other, in the order given, each on "
        "top of the one before.",
        show_default=False,
    ),
]
MessageOpt = Annotated[str | None, typer.Option("--message", "-m", help="Commit message.", show_default=False)]
BranchOpt = Annotated[
    str | None,
    typer.Option("--branch", "-b", help="Branch to commit on. Default: the current branch.", show_default=False),
]
StepOpt = Annotated[
    int | None,
    typer.Option("--step", min=0, max=INT64_MAX, help="Training step of this state.", show_default=False),
]
EpochOpt = Annotated[
    int | None,
    typer.Option("--epoch", min=0, max=INT64_MAX, help="Training epoch of this state.", show_default=False),
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
ResultOpt = Annotated[
    list[Metric] | None,
    typer.Option(
        "--metric",
        metavar="NAME=NUMBER",
        parser=parse_metric,
        help="A result to attach, e.g. --metric eval/acc=0.91 (repeatable).",
        show_default=False,
    ),
]
NoteOpt = Annotated[str | None, typer.Option("--note", help="A note to attach (free text).", show_default=False)]
SourceOpt = Annotated[str | None, typer.Option(
    "--source", help="Where the results come from (a command, a dataset, a person).", show_default=False)]
ParentOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--parent",
        metavar="REV",
        help="Parent commit (repeatable; two or more make a merge). Default: the branch head.",
        show_default=False,
    ),
]

TransferFromOpt = Annotated[
    str | None,
    typer.Option(
        "--transfer-from",
        metavar="REV[:MAPPING_FILE]",
        help="Record that this state was initialised from commit REV (a transfer edge, e.g. fine-tuning a "
        'released model). MAPPING_FILE is JSON {"dst.tensor": "src.tensor"} naming which tensors came from where.',
        show_default=False,
    ),
]

# checkout -----------------------------------------------------------------------

CheckoutRevArg = Annotated[
    str | None,
    typer.Argument(
        metavar="BRANCH|REV",
        help="Branch to switch to; with -b, where the new branch starts (default: the current branch's head); "
        "with -o, any revision to export.",
        show_default=False,
    ),
]
NewBranchOpt = Annotated[
    str | None, typer.Option("-b", "--new-branch", metavar="NEW", help="Create branch NEW at REV and switch to it.")
]

OutputOpt = Annotated[
    Path | None,
    typer.Option(
        "--output",
        "-o",
        metavar="PATH",
        help="Export the state to PATH (no branch switch), in --format, else by suffix: .safetensors, or "
        ".pt/.pth/.bin/.ckpt for torch.save.",
        show_default=False,
    ),
]
FormatOpt = Annotated[
    str | None,
    typer.Option(
        "--format",
        metavar="safetensors|torch|dcp|hf",
        help="With -o: the format to write, whatever PATH's suffix. dcp writes a torch.distributed.checkpoint "
        "folder (PATH must not exist or be empty) that dcp.load reads at any world size; hf a Hugging Face model "
        "folder (the commit's files, the model's weights as safetensors shards and their index) that "
        "from_pretrained loads.",
        show_default=False,
    ),
]
MaxShardSizeOpt = Annotated[
    str,
    typer.Option("--max-shard-size", metavar="SIZE", help="With --format hf: the largest safetensors shard "
                 "(5GB, 500MB, 2GiB or bytes); a larger model is split as save_pretrained splits it."),
]
AllowCodeOpt = Annotated[
    bool,
    typer.Option("--allow-code", help="Keep the code files of a model folder (*.py: a model's own modeling code) "
                 "with its other files; they are stored, never run. Without it they are left out."),
]
ExportForceOpt = Annotated[
    bool,
    typer.Option("--force", "-f", help="With -o: replace the file at PATH (a symbolic link there is replaced "
                 "itself, never followed). Without it an existing PATH is refused; a folder is never replaced."),
]

# log ----------------------------------------------------------------------------

LimitOpt = Annotated[
    int | None,
    typer.Option("--max-count", "-n", min=1, max=MAX_COUNT, metavar="N", help="Show at most N commits.",
                 show_default=False),
]

AllCommitsOpt = Annotated[
    bool, typer.Option("--all", help="Show every commit of every branch, not only the current branch's history.")
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
        help="Commit to point at (any revision). Default: the head of the current branch, else the latest commit.",
        show_default=False,
    ),
]
BranchRevArg = Annotated[
    str | None,
    typer.Argument(
        metavar="REV|NEW",
        help="Commit to point at (any revision). Default: the head of the current branch, else the latest commit. "
        "With --move: the branch's new name.",
        show_default=False,
    ),
]
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force", "-f",
        help="Move an existing branch to REV; with --delete, delete even when commits only it reaches become "
        "garbage; with --move, replace an existing branch NEW.",
    ),
]
MoveOpt = Annotated[
    bool,
    typer.Option("--move", "-m", help="Rename branch NAME to NEW (the current branch follows its name)."),
]
TagForceOpt = Annotated[
    bool, typer.Option("--force", "-f", help="With --delete: delete even when commits only it reaches become garbage.")
]
DeleteOpt = Annotated[bool, typer.Option("--delete", "-d", help="Delete NAME (its commits stay until `ckpt gc`).")]

# gc -----------------------------------------------------------------------------

CompactBelowOpt = Annotated[
    float,
    typer.Option("--compact-below", min=0.0, max=1.0, metavar="FRACTION",
                 help="Also move the live chunks of packs whose live bytes are less than this fraction of "
                      "their size (what gc keeps of partly dead packs) into new packs; 0: off."),
]

DryRunOpt = Annotated[bool, typer.Option("--dry-run", "-n", help="Report what would be removed; change nothing.")]
GraceOpt = Annotated[
    float,
    typer.Option(
        "--grace",
        min=0,
        max=MAX_SECONDS,
        callback=_finite_grace,
        metavar="SECONDS",
        help="Keep packs and temporary files younger than this (a commit in flight may be writing them).",
    ),
]

# prune --------------------------------------------------------------------------

KeepLastOpt = Annotated[
    int | None,
    typer.Option("--keep-last", min=1, max=MAX_COUNT, metavar="N", show_default=False,
                 help="Keep the N newest commits of each branch's first-parent line."),
]
KeepEveryOpt = Annotated[
    int | None,
    typer.Option("--keep-every", min=1, max=INT64_MAX, metavar="STEPS", show_default=False,
                 help="Keep one commit per STEPS-wide bucket of step (the first at or after each multiple of STEPS)."),
]
KeepBestOpt = Annotated[
    str | None,
    typer.Option("--keep-best", metavar="METRIC:N", help="Keep the N best commits of each line by METRIC (lowest; "
                 "highest with --max).", show_default=False),
]
KeepDenseEarlyOpt = Annotated[
    bool,
    typer.Option("--keep-dense-early", help="Keep the first commit of step 0 and of each step range [2^k, 2^(k+1)): "
                 "dense early in training, sparse late."),
]
KeepYoungerOpt = Annotated[
    str | None,
    typer.Option("--keep-younger-than", metavar="DURATION", callback=_bounded_duration,
                 help="Keep commits made within DURATION: 90s, 30m, 12h, "
                 "7d, 2w.", show_default=False),
]
PruneBranchOpt = Annotated[
    list[str] | None,
    typer.Option("--branch", "-b", metavar="B", help="Prune only B's first-parent line (repeatable; a commit also "
                 "on another branch's line is kept). Default: every branch.", show_default=False),
]
PruneDryRunOpt = Annotated[
    bool, typer.Option("--dry-run", "-n", help="Show what would be pruned and what gc would then free; change nothing.")
]
SaveRulesOpt = Annotated[
    bool, typer.Option("--save", help="Also store the rules as the repository's retention setting, applied after "
                       "every commit (a prune, then a gc when something was pruned).")
]
SavedRulesOpt = Annotated[bool, typer.Option("--saved", help="Prune by the stored retention setting.")]
ForgetRulesOpt = Annotated[bool, typer.Option("--forget", help="Remove the stored retention setting; prune nothing.")]
PruneDamagedOpt = Annotated[bool, typer.Option(
    "--damaged", help="Accept the loss of every damaged commit (its data or manifest gone, as `ckpt db rebuild` "
                      "found): mark them pruned, so that gc runs again. Takes no rules.")]

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
        max=DEMO_MAX_STEPS,
        metavar="N",
        help="Training steps on main, committing every N/8; the branch forks at the middle commit, trains to step N.",
    ),
]

# verify -------------------------------------------------------------------------

FullOpt = Annotated[
    bool,
    typer.Option("--full", help="Also read every chunk, decode it and check its hash (reads the whole store)."),
]

# diff / history / plot ----------------------------------------------------------

DiffAArg = Annotated[str, typer.Argument(metavar="A", help="Revision to compare from.", show_default=False)]
DiffBArg = Annotated[str, typer.Argument(metavar="B", help="Revision to compare to.", show_default=False)]
ExactOpt = Annotated[
    bool,
    typer.Option(
        "--exact/--stat",
        help="--stat (default): compare stored statistics and chunk ids, reading no tensor bytes. --exact: also "
        "compute ‖b−a‖, relative change, cosine similarity and max |b−a|, reading only the chunks that differ.",
    ),
]
ChangedOnlyOpt = Annotated[bool, typer.Option("--changed-only", help="Leave unchanged tensors out.")]
TensorArg = Annotated[str, typer.Argument(metavar="TENSOR", help="Name, as `ckpt show` lists it.", show_default=False)]
AlongOpt = Annotated[
    str | None,
    typer.Option("--along", metavar="REV", help="Follow REV's first parents. Default: the current branch.",
                 show_default=False),
]
HistoryLimitOpt = Annotated[
    int | None,
    typer.Option("--max-count", "-n", min=1, max=MAX_COUNT, metavar="N", help="Look at most N commits back.",
                 show_default=False),
]
PlotOutputOpt = Annotated[
    Path,
    typer.Option("--output", "-o", metavar="FILE.png", dir_okay=False, help="PNG file to write.", show_default=False),
]
StatsOpt = Annotated[
    str,
    typer.Option("--stat", metavar="NAME[,NAME...]", help="Statistics to plot, one panel each: numel, mean, std, "
                 "min, max, l2_norm, abs_max, nan_count, inf_count."),
]
MetricNamesArg = Annotated[
    list[str],
    typer.Argument(metavar="NAME...", help="Metric names, space- or comma-separated (one panel each).",
                   show_default=False),
]
PlotBranchOpt = Annotated[
    list[str] | None,
    typer.Option("--branch", "-b", metavar="B", help="Branch (any revision) whose first parents to plot, one line "
                 "each (repeatable). Default: the current branch.", show_default=False),
]

# lineage / best / log --graph --where -------------------------------------------

KindOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--kind",
        "-k",
        metavar="KINDS",
        help="Follow only edges of these kinds: parent, merge, transfer (comma-separated or repeated). "
        "Default: all.",
        show_default=False,
    ),
]
DepthOpt = Annotated[
    int | None,
    typer.Option("--depth", "-d", min=1, max=MAX_COUNT, metavar="N", help="At most N edges away.",
                 show_default=False),
]
PathAArg = Annotated[str, typer.Argument(metavar="A", help="One end (any revision).", show_default=False)]
PathBArg = Annotated[str, typer.Argument(metavar="B", help="The other end (any revision).", show_default=False)]
GraphOpt = Annotated[
    bool, typer.Option("--graph", help="Draw branches and merges as an ASCII graph left of the commits.")
]
WhereOpt = Annotated[
    str | None,
    typer.Option(
        "--where",
        "-w",
        metavar="EXPR",
        help="Only commits matching EXPR, e.g. \"val_loss < 2.1 and step >= 1000\": comparisons (< <= > >= == !=) "
        "of step, epoch, time (ISO dates), branch, message, author, host, nonfinite or any metric, joined by "
        "and, or, not and parentheses; quote strings (branch == 'main').",
        show_default=False,
    ),
]
BestMetricOpt = Annotated[
    str, typer.Option("--metric", "-m", metavar="NAME", help="Metric to rank commits by.", show_default=False)
]
MaximizeOpt = Annotated[
    bool, typer.Option("--max/--min", help="Best is the highest value (--max) or the lowest (--min, the default).")
]
BestBranchOpt = Annotated[
    str | None,
    typer.Option(
        "--branch", "-b", metavar="BRANCH", help="Only BRANCH's head and its ancestors.", show_default=False
    ),
]
SubtreeOpt = Annotated[
    str | None,
    typer.Option("--subtree", metavar="REV", help="Only REV and its descendants.", show_default=False),
]
TopOpt = Annotated[int, typer.Option("--max-count", "-n", min=1, max=MAX_COUNT, metavar="N",
                                     help="Show the N best commits.")]
ReplaceDbOpt = Annotated[bool, typer.Option(
    "--replace", help="Rebuild over a database that holds a repository (a SQLite file is kept beside the new one).")]

# ui -----------------------------------------------------------------------------

UiHostOpt = Annotated[
    str,
    typer.Option("--host", metavar="HOST", help="Address to listen on. Anything but loopback (127.0.0.1, ::1, "
                 "localhost) lets other machines read the repository: the UI is read-only but has no authentication."),
]
UiPortOpt = Annotated[
    int,
    typer.Option("--port", "-p", min=0, max=65535, metavar="PORT", help="TCP port to listen on (0: any free port)."),
]
UiOpenOpt = Annotated[bool, typer.Option("--open", help="Open the UI in the default web browser once it is up.")]

# remotes ------------------------------------------------------------------------

RemoteNameArg = Annotated[
    str, typer.Argument(metavar="NAME", help="The remote's name (e.g. origin).", show_default=False)]
RemoteUrlArg = Annotated[
    str, typer.Argument(metavar="URL", help="A folder, a repository folder, or s3://BUCKET/PREFIX[?endpoint_url=...].",
                        show_default=False)]
ReplicateOpt = Annotated[bool, typer.Option(
    "--replicate", help="Push every commit there in the background once it is durable here (a durable tier).")]
OptionalRemoteArg = Annotated[
    str | None, typer.Argument(metavar="REMOTE", help="The remote (default: origin, or the only one).",
                               show_default=False)]
PushRefsArg = Annotated[
    list[str] | None, typer.Argument(metavar="REF...", help="Branches and tags to push (default: the current branch).",
                                     show_default=False)]
PushAllOpt = Annotated[bool, typer.Option("--all", help="Push every branch and tag.")]
PushForceOpt = Annotated[bool, typer.Option(
    "--force", "-f", help="Replace the remote's refs even when that is not a fast-forward.")]
FetchDataOpt = Annotated[
    list[str] | None, typer.Option("--data", metavar="REV",
                                   help="Also download these commits' tensor bytes now (repeatable).",
                                   show_default=False)]
FetchAllDataOpt = Annotated[bool, typer.Option("--all-data", help="Download every commit's tensor bytes now.")]
PullBranchArg = Annotated[
    str | None, typer.Argument(metavar="BRANCH", help="The branch to fast-forward (default: the current one).",
                               show_default=False)]
CloneUrlArg = Annotated[
    str, typer.Argument(metavar="URL", help="What to clone: a folder or repository folder, or s3://BUCKET/PREFIX.",
                        show_default=False)]
CloneDirArg = Annotated[
    Path | None, typer.Argument(metavar="DIR", help="Where (default: the URL's last part).", show_default=False)]
CloneDataOpt = Annotated[str, typer.Option(
    "--data", help="lazy: read tensor bytes from the remote at first use (and keep them); full: download all now.")]

# -- lineage from the weights (similar_commands; commit --infer-parent, import-run --infer-lineage) --
SimilarArg = Annotated[
    str, typer.Argument(metavar="REV|FILE", show_default=False,
                        help="A commit (" + REV_HELP + ") or a checkpoint file or folder (read, hashed, not stored).")]
NearestOpt = Annotated[int, typer.Option("-n", "--number", min=1, max=1000, help="How many commits to list.")]
InferParentOpt = Annotated[bool, typer.Option(
    "--infer-parent", help="Propose the commit this checkpoint came from (parent or transfer), from its weights; "
    "nothing is committed without --accept.")]
InferLineageOpt = Annotated[bool, typer.Option(
    "--infer-lineage", help="Propose a tree over the run's checkpoints (any checkpoint files or folders in DIR) "
    "from their weights: each one's parent or transfer source; nothing is committed without --accept.")]
AcceptOpt = Annotated[bool, typer.Option(
    "--accept", help="With --infer-parent / --infer-lineage: commit with the proposed edges.")]
