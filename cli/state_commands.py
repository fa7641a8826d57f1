"""Commands that move state in and out and switch branches: ``commit``, ``import-run`` and ``checkout``."""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptrepo import errors
from ckptrepo.formats import output_format, read_ahead, suffix_format, write_state
from ckptrepo.types import short_id

from . import render
from .options import (
    AcceptOpt,
    AllowCodeOpt,
    AllowPickleOpt,
    BranchOpt,
    CheckoutRevArg,
    EpochOpt,
    ExportForceOpt,
    FormatOpt,
    InferLineageOpt,
    InferParentOpt,
    InputArg,
    JsonOpt,
    MaxShardSizeOpt,
    MessageOpt,
    MetricOpt,
    NewBranchOpt,
    OutputOpt,
    ParentOpt,
    RunDirArg,
    StepOpt,
    TransferFromOpt,
)
from .session import branch_head, current

if TYPE_CHECKING:  # loaded when a command runs: `ckpt --version` imports no database stack
    from ckptrepo import Repo

# Inputs at least this large get a spinner on stderr while they are read and persisted.
PROGRESS_MIN_BYTES = 64 << 20


def commit(
    paths: InputArg,
    message: MessageOpt = None,
    branch: BranchOpt = None,
    step: StepOpt = None,
    epoch: EpochOpt = None,
    metric: MetricOpt = None,
    parent: ParentOpt = None,
    transfer_from: TransferFromOpt = None,
    allow_pickle: AllowPickleOpt = False,
    infer_parent: InferParentOpt = False,
    accept: AcceptOpt = False,
    allow_code: AllowCodeOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Commit checkpoint files or model folders on a branch (default: the current branch).

    A Hugging Face model folder keeps its other files too (config.json, tokenizer files, chat
    template, model card, subfolders; not hidden ones, pickles or the weights it read), so
    that `ckpt checkout REV -o DIR --format hf` gives the folder back; code files (*.py) only
    with --allow-code. Each file at most CKPT_MAX_FILE_BYTES.

    Each input is validated (format, header, sizes) before anything of it is written; a
    safetensors file is read whole, then hashed and stored as bytes. Several inputs (an
    import: `ckpt commit ckpts/*.safetensors`) become one commit each, in the order given,
    each on top of the one before; every file is read whole while the one before is
    committed, and its name is its commit's message (after -m MSG if given). A commit
    becomes visible only once all its bytes are durable; if an input fails, the commits
    before it stay and the error names the input.

    --infer-parent proposes the commit one input came from, from its weights (a parent, or a
    transfer source: a frozen body under a new head), with a score and the runner-up; it
    commits with that edge only with --accept.
    """
    _warn_if_pickle(allow_pickle)
    if infer_parent or accept:
        from .similar_commands import commit_inferred

        _inferring("--infer-parent", infer_parent, accept, len(paths), {"--parent": parent,
                                                                        "--transfer-from": transfer_from})
        commit_inferred(paths[0], message=message, branch=branch, step=step, epoch=epoch,
                        metrics={m.name: m.value for m in metric} if metric else None, accept=accept,
                        allow_pickle=allow_pickle, as_json=as_json)
        return
    if len(paths) > 1:
        _commit_many(paths, message, branch, as_json,
                     given={"--step": step, "--epoch": epoch, "--metric": metric, "--parent": parent,
                            "--transfer-from": transfer_from}, allow_pickle=allow_pickle, allow_code=allow_code)
        return
    path = paths[0]
    transfer = _transfer_spec(transfer_from) if transfer_from is not None else None
    read_ahead(path)  # a safetensors file is read while the library is imported and the repository opened
    with current().open() as repo, render.phases(enabled=_input_bytes(path) >= PROGRESS_MIN_BYTES) as phase, \
            warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", UserWarning)
        branch = branch or repo.head
        phase(f"committing {path.name}: reading, hashing, compressing and writing")
        result = repo.commit_file(
            path,
            branch=branch,
            message=message,
            step=step,
            epoch=epoch,
            metrics={m.name: m.value for m in metric} if metric else None,
            parents=parent or None,
            transfer_from=transfer,
            allow_pickle=allow_pickle,
            allow_code=allow_code,
        )
    _tell(said)
    if as_json:
        render.emit_json(result.to_json())
    else:
        render.out.print(render.commit_summary(result))


def _tell(said: list[warnings.WarningMessage]) -> None:
    """Print on stderr the notes a call gave as UserWarnings (files left out, a missing config)."""
    for note in said:
        if issubclass(note.category, UserWarning):
            render.err.print(f"note: {note.message}", markup=False)


def _warn_if_pickle(allow_pickle: bool) -> None:
    if allow_pickle:
        render.err.print("warning: --allow-pickle unpickles what the inputs hold (torch.save files, pickled values "
                         "in a state's skeleton, a DCP folder's non-tensor objects), which runs any code they hold; "
                         "use it only for inputs you trust", markup=False)


def _commit_many(paths: list[Path], message: str | None, branch: str | None, as_json: bool,
                 given: Mapping[str, object], *, allow_pickle: bool = False, allow_code: bool = False,
                 steps: Mapping[Path, int | None] | None = None) -> None:
    """Commit several inputs in order on one branch, each read while the one before is committed.

    ``steps`` (import-run): each input's step when what the run recorded gives none; a failure's
    hint then says how to import the rest instead of how to commit it."""
    per_state = [opt for opt, value in given.items() if value]
    if per_state:
        raise errors.UsageError(
            f"{', '.join(per_state)} describe one state, and {len(paths)} inputs were given",
            hint="Commit the files one at a time to give each its own step, metrics or parents "
            "(`ckpt commit FILE --step N`), or import them all without those options.",
        )
    if len(set(paths)) != len(paths):
        raise errors.UsageError("an input is named twice", hint="Name each file or folder once.")
    from ckptrepo.formats import fill_run_meta, read_states
    from ckptrepo.formats.files import hf_folder_files, skipped_note

    done: list[dict[str, Any]] = []
    with current().open() as repo, render.phases(enabled=True) as phase:
        branch = branch or repo.head
        files = read_states(paths, allow_pickle=allow_pickle)
        try:
            for i, (path, state) in enumerate(files):
                phase(f"committing {path.name} ({i + 1} of {len(paths)})")
                run: dict[str, Any] = fill_run_meta({}, path, state)
                step = run.get("step", (steps or {}).get(path))
                kept = hf_folder_files(path, allow_code=allow_code) if path.is_dir() else None
                result = repo.commit(state, branch=branch, message=f"{message}: {path.name}" if message else path.name,
                                     step=step, epoch=run.get("epoch"), metrics=run.get("metrics"),
                                     allow_pickle=allow_pickle, blocking=True,
                                     files=kept.kept if kept else None).wait()
                note = skipped_note(kept) if kept else None
                if note is not None:
                    render.err.print(f"note: {path.name}: {note}", markup=False)
                del state
                done.append(result.to_json())
                if not as_json:
                    render.out.print(render.commit_summary(result))
        except errors.CkptError as exc:
            last = f" (the last: {short_id(done[-1]['id'])})" if done else ""
            if steps is None:
                hint = f"{len(done)} of {len(paths)} inputs were committed before it{last}; commit the rest once it " \
                       "is fixed."
                own = exc.hint
            else:
                hint = f"{len(done)} of {len(paths)} new checkpoints were imported before it{last}. {_RERUN}"
                own = "" if exc.hint == errors.InvalidInput.hint else exc.hint  # that one is about `ckpt commit`
            exc.hint = hint + (f" {own}" if own else "")  # type: ignore[misc]
            raise
        finally:
            files.close()
    if as_json:
        render.emit_json(done)


def import_run(
    run_dir: RunDirArg,
    message: MessageOpt = None,
    branch: BranchOpt = None,
    allow_pickle: AllowPickleOpt = False,
    infer_lineage: InferLineageOpt = False,
    accept: AcceptOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Import a training run's checkpoints: one commit each, in step order.

    A Hugging Face Trainer's output folder: its checkpoint-N folders, each with the step,
    epoch and metrics its trainer_state.json records (the metrics logged at that step). A
    Lightning run's checkpoint folder: its .ckpt files, each with the step, epoch and
    monitored scores it holds (ordered by the step=S in their names, else by the step each
    holds); last.ckpt, a copy of the newest, is left out when another file has its step.
    Each checkpoint is committed on top of the one before. Like `ckpt commit DIR...`: if one
    fails, the commits before it stay and the error names it.

    Running it again imports only what is new: a checkpoint whose step a commit of the
    branch has, with the same tensors, is left out (each is read and hashed to tell; nothing
    is stored); one whose tensors differ from that commit's stops the import before anything
    is committed (the run changed: import it on another branch). --json lists the commits made.

    --infer-lineage takes the folder's checkpoints in any order (any checkpoint files or model
    folders) and proposes a tree over them from their weights: each one's parent or transfer
    source among the others or the repository's commits, with scores and runners-up; it
    commits them with those edges only with --accept (one line per branch).
    """
    from ckptrepo.formats import checkpoint_step, lightning_meta, read_state, run_checkpoints

    _warn_if_pickle(allow_pickle)
    if infer_lineage or accept:
        from .similar_commands import import_inferred

        _inferring("--infer-lineage", infer_lineage, accept, 1, {})
        import_inferred(run_dir, message=message, branch=branch, accept=accept, allow_pickle=allow_pickle,
                        as_json=as_json)
        return
    held: dict[Path, int | None] = {}

    def step_of(path: Path) -> int | None:  # read once: a file without step=S in its name is read for it
        if path not in held:
            held[path] = lightning_meta(read_state(path, mapped=True, allow_pickle=allow_pickle)).get("step")
        return held[path]

    try:
        paths, left_out = run_checkpoints(run_dir, step_of)
        for path in left_out:
            render.err.print(f"left out {path.name}: another checkpoint holds its step", markup=False)
        steps = {path: checkpoint_step(path, step_of) for path in paths}
        with current().open() as repo:
            branch = branch or repo.head
            new = _not_imported(repo, branch, steps, allow_pickle)
    except errors.CkptError as exc:
        if exc.hint == errors.InvalidInput.hint:  # that one is about `ckpt commit`
            exc.hint = _RERUN  # type: ignore[misc]
        raise
    if not new:
        render.err.print(f"nothing new to import: every checkpoint of {run_dir} is on {branch}", markup=False)
        if as_json:
            render.emit_json([])
        return
    _commit_many(new, message, branch, as_json, given={}, allow_pickle=allow_pickle, steps=steps)


def _inferring(flag: str, inferring: bool, accept: bool, inputs: int, given: Mapping[str, object]) -> None:
    """UsageError for --accept without ``flag``, several inputs, or edges given as well as inferred."""
    if not inferring:
        raise errors.UsageError(f"--accept commits what {flag} proposes", hint=f"Add {flag}.")
    if inputs != 1:
        raise errors.UsageError(f"{flag} proposes the source of one checkpoint, and {inputs} were given",
                                hint="Give one file, or use `ckpt import-run DIR --infer-lineage` for many.")
    both = [opt for opt, value in given.items() if value]
    if both:
        raise errors.UsageError(f"{', '.join(both)} gives the edge that {flag} infers", hint="Give one or the other.")


_RERUN = ("Fix that checkpoint or move it out of the folder, then run `ckpt import-run` again: it imports only the "
          "checkpoints the branch does not have yet.")


def _not_imported(repo: Repo, branch: str, steps: Mapping[Path, int | None], allow_pickle: bool) -> list[Path]:
    """The checkpoints (``steps``: path -> step, in step order) that ``branch`` does not hold yet.

    A checkpoint is imported when a commit of the branch's first-parent chain has its step and
    the same tensors (names and tensor ids: ``Repo.tensor_ids`` hashes the checkpoint, reading it
    whole but storing nothing; where ids differ, ``Repo.holds`` compares the stored bytes, since a
    distributed commit lays equal tensors out differently); it is then left out, with a note.
    ImportConflict when such a commit has other tensors (the run changed since): checked for
    every checkpoint before any is imported, so nothing is."""
    from ckptrepo.formats import read_state

    if branch_head(repo, branch) is None:
        return list(steps)
    on_branch: dict[int, list[str]] = {}
    for point in repo.metrics_along((), along=branch):
        if point.step is not None:
            on_branch.setdefault(point.step, []).append(point.commit_id)
    new: list[Path] = []
    for path, step in steps.items():
        candidates = on_branch.get(step, []) if step is not None else []
        if not candidates:
            new.append(path)
            continue
        state = read_state(path, mapped=True, allow_pickle=allow_pickle)
        ids = repo.tensor_ids(state, allow_pickle=allow_pickle)
        same = next((c for c in candidates if {t.name: t.tensor_id for t in repo.tensors(c)} == ids), None)
        if same is None:  # equal tensors may be laid out otherwise (a distributed commit's): compare them
            same = next((c for c in candidates if repo.holds(c, state, allow_pickle=allow_pickle)), None)
        del state
        if same is None:
            raise errors.ImportConflict(path=str(path), step=step, branch=branch, commit=short_id(candidates[0]))
        render.err.print(f"already imported {path.name} (step {step}) as {short_id(same)}", markup=False)
    return new


def checkout(
    rev: CheckoutRevArg = None,
    new_branch: NewBranchOpt = None,
    output: OutputOpt = None,
    fmt: FormatOpt = None,
    force: ExportForceOpt = False,
    max_shard_size: MaxShardSizeOpt = "5GB",
    as_json: JsonOpt = False,
) -> None:
    """Switch branches, start one (-b NEW [REV]), or export a commit (REV -o PATH).

    `ckpt checkout BRANCH` switches; `ckpt checkout -b NEW [REV]` starts
    branch NEW at REV (default: the current branch's head) and switches to
    it; `ckpt checkout REV -o PATH` writes that commit's state to
    PATH.safetensors or PATH.pt without switching, and with --format
    safetensors|torch|dcp in that format whatever the name (dcp: a
    torch.distributed.checkpoint folder, which dcp.load reads at any
    world size); --format hf writes a Hugging Face model folder (the
    commit's files and the model's weights, sharded at --max-shard-size)
    that from_pretrained loads. The output appears whole or not at all,
    and replaces an existing file only with --force.

    The current branch is where `ckpt commit` commits and what `ckpt log`
    shows; .ckpt/HEAD names it. Switching changes no other file.
    """
    if output is not None:
        if new_branch is not None or rev is None:
            raise errors.UsageError(
                "-o exports one commit and switches no branch" + (", so it takes no -b" if new_branch else ""),
                hint="Export with `ckpt checkout REV -o PATH`; start a branch with `ckpt checkout -b NEW [REV]`.",
            )
        _export(rev, output, fmt, as_json, replace=force, max_shard_size=max_shard_size)
        return
    if force:
        raise errors.UsageError("--force replaces the file an export writes", hint="Export over an existing file "
                                "with `ckpt checkout REV -o FILE --force`.")
    if fmt is not None:
        raise errors.UsageError("--format names the format of an export", hint="Export with "
                                "`ckpt checkout REV -o PATH --format safetensors|torch|dcp`.")
    with current().open() as repo:
        if new_branch is not None:
            _start_branch(repo, new_branch, rev, as_json)
        elif rev is None:
            raise errors.UsageError(
                "checkout needs a BRANCH to switch to",
                hint="`ckpt checkout BRANCH` switches, `ckpt checkout -b NEW [REV]` starts a branch, "
                "`ckpt checkout REV -o FILE` exports; `ckpt branch` lists branches.",
            )
        else:
            _switch(repo, rev, as_json)


def _switch(repo: Repo, name: str, as_json: bool) -> None:
    head = branch_head(repo, name)
    if head is None:
        repo.resolve(name)  # an unknown revision fails here with its own message
        raise errors.UsageError(
            f"{name!r} is not a branch",
            hint=f"Start a branch there with `ckpt checkout -b NEW {name}`, or export it with "
            f"`ckpt checkout {name} -o FILE`; `ckpt branch` lists branches.",
        )
    try:
        previous: str | None = repo.head
    except errors.UsageError:
        previous = None  # a damaged HEAD: switching rewrites it
    repo.switch(name)
    _switched(name, head, created=False, previous=previous, as_json=as_json)


def _start_branch(repo: Repo, name: str, at: str | None, as_json: bool) -> None:
    if at is None:
        at = repo.head
        if branch_head(repo, at) is None:
            raise errors.UsageError(
                f"the current branch {at!r} has no commits yet, so -b has nowhere to start",
                hint="Commit first, or name where the branch starts: `ckpt checkout -b NEW REV`.",
            )
    ref = repo.branch(name, at=at)  # RefExists when it is there already: checkout -b never moves a branch
    repo.switch(name)
    _switched(name, ref.commit_id, created=True, previous=None, as_json=as_json)


def _switched(name: str, commit_id: str, *, created: bool, previous: str | None, as_json: bool) -> None:
    if as_json:
        render.emit_json({"branch": name, "commit_id": commit_id, "short_id": short_id(commit_id), "created": created})
    elif created:
        render.out.print(f"switched to a new branch {name} at {short_id(commit_id)}", markup=False)
    elif previous == name:
        render.out.print(f"already on {name} ({short_id(commit_id)})", markup=False)
    else:
        render.out.print(f"switched to branch {name} ({short_id(commit_id)})", markup=False)


def _export(rev: str, output: Path, fmt: str | None, as_json: bool, *, replace: bool,
            max_shard_size: str = "5GB") -> None:
    # Refused before restoring anything: restoring a large state only to fail here wastes minutes.
    kind = output_format(output, fmt, replace=replace)
    with current().open() as repo, warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", UserWarning)
        if kind == "hf":
            commit_id = repo.export(rev, output, format="hf", max_shard_size=max_shard_size)
        elif kind == suffix_format(output):
            # streams: each tensor written while later ones decode
            commit_id = repo.export(rev, output, replace=replace)
        else:
            commit_id = repo.resolve(rev)
            write_state(repo.checkout(commit_id), output, format=kind, replace=replace)
    _tell(said)
    written = output.stat().st_size if kind not in ("dcp", "hf") else \
        sum(f.stat().st_size for f in output.rglob("*") if f.is_file())
    if as_json:
        render.emit_json({"id": commit_id, "short_id": short_id(commit_id), "path": str(output), "format": kind,
                          "bytes": written})
    else:
        render.out.print(f"wrote {short_id(commit_id)} to {output} ({kind}, {render.size(written)})", markup=False)


def _transfer_spec(text: str) -> str | tuple[str, dict[str, str]]:
    """``REV`` or ``(REV, mapping)`` from ``REV[:MAPPING_FILE]``; UsageError for an unreadable mapping."""
    rev, sep, mapping_path = text.partition(":")
    if not rev.strip() or (sep and not mapping_path):
        raise errors.UsageError(f"--transfer-from {text!r}: expected REV or REV:MAPPING_FILE")
    if not sep:
        return rev
    hint = 'The mapping file is a JSON object {"dst.tensor.name": "src.tensor.name", ...}.'
    try:
        mapping: Any = json.loads(Path(mapping_path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise errors.UsageError(f"--transfer-from: no mapping file {mapping_path}", hint=hint) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise errors.UsageError(f"--transfer-from: cannot read mapping file {mapping_path}: {exc}",
                                hint=hint) from None
    if not isinstance(mapping, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in mapping.items()):
        raise errors.UsageError(f"--transfer-from: {mapping_path} is not a JSON object of names to names",
                                hint=hint)
    return rev, mapping


def _input_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
