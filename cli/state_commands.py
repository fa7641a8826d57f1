"""Commands that move state in and out: ``commit`` and ``checkout``."""

from __future__ import annotations

from pathlib import Path

from ckptrepo import errors
from ckptrepo.formats import SAFETENSORS_SUFFIXES, TORCH_SUFFIXES, read_state, write_state
from ckptrepo.ids import short

from . import render
from .options import (
    BranchOpt,
    EpochOpt,
    InputArg,
    JsonOpt,
    MessageOpt,
    MetricOpt,
    OutputOpt,
    ParentOpt,
    RevArg,
    StepOpt,
)
from .session import current

# Inputs at least this large get a spinner on stderr while they are read and persisted.
PROGRESS_MIN_BYTES = 64 << 20


def commit(
    path: InputArg,
    message: MessageOpt = None,
    branch: BranchOpt = None,
    step: StepOpt = None,
    epoch: EpochOpt = None,
    metric: MetricOpt = None,
    parent: ParentOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Commit a checkpoint file or model folder on a branch (default main).

    The input is read in full and validated before anything is written; the new
    commit becomes visible only once all its bytes are durable.
    """
    with current().open() as repo, render.phases(enabled=_input_bytes(path) >= PROGRESS_MIN_BYTES) as phase:
        phase(f"reading {path.name}")
        state = read_state(path)
        phase("hashing, compressing and writing")
        handle = repo.commit(
            state,
            branch=branch,
            message=message,
            step=step,
            epoch=epoch,
            metrics={m.name: m.value for m in metric} if metric else None,
            parents=parent or None,
            blocking=True,
        )
        result = handle.wait()
    if as_json:
        render.emit_json(result.to_json())
    else:
        render.out.print(render.commit_summary(result))


def checkout(rev: RevArg, output: OutputOpt = None, as_json: JsonOpt = False) -> None:
    """Write the state of commit REV to a file: -o FILE.safetensors or -o FILE.pt."""
    if output is None:
        raise errors.UsageError(
            "checkout needs -o FILE: switching the working branch is not supported yet",
            hint="Write the state to a file, e.g. `ckpt checkout main -o model.safetensors` (or model.pt).",
        )
    if output.suffix.lower() not in SAFETENSORS_SUFFIXES + TORCH_SUFFIXES:
        # Refuse before restoring anything: restoring a large state only to fail here wastes minutes.
        raise errors.UsageError(
            f"cannot write {output}: unknown suffix {output.suffix or '(none)'!r}",
            hint=f"Name it {'/'.join(SAFETENSORS_SUFFIXES)}, or {'/'.join(TORCH_SUFFIXES)} for torch.save.",
        )
    with current().open() as repo:
        commit_id = repo.resolve(rev)
        state = repo.checkout(commit_id)
    write_state(state, output)
    written = output.stat().st_size
    if as_json:
        render.emit_json({"id": commit_id, "short_id": short(commit_id), "path": str(output), "bytes": written})
    else:
        render.out.print(f"wrote {short(commit_id)} to {output} ({render.size(written)})", markup=False)


def _input_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
