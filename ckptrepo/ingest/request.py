"""A commit request: the arguments of ``Repo.commit`` checked, and what phase 1 hands to phase 2.

The ``check_*`` functions validate arguments before anything is staged (UsageError naming the
argument and what to pass instead)."""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypedDict

from ckptrepo import knobs
from ckptrepo.db import catalog, integers, refs
from ckptrepo.errors import UsageError, did_you_mean
from ckptrepo.lineage import revparse

if TYPE_CHECKING:
    import torch

    from ckptrepo.db.engine import Sessions
    from ckptrepo.ingest.sources import LazySource, Source
    from ckptrepo.ingest.stats import Moments
    from ckptrepo.ingest.writeahead import WriteAhead


class CommitMeta(TypedDict, total=False):
    """What a commit records besides its state (``Repo.commit``'s keyword arguments)."""

    message: str | None
    step: int | None
    epoch: int | None
    metrics: Mapping[str, float] | None
    config: Any
    parents: list[str] | None
    transfer_from: Any
    code_version: str | None


@dataclass
class CommitRequest:
    """A staged commit handed from phase 1 to phase 2 (revisions still unresolved): its state as
    staged torch ``tensors`` or as byte ``sources`` (phase 2 reads ``sources`` when given)."""

    skeleton: Any
    branch: str
    parents: list[str] | None
    transfer: tuple[str, dict[str, str] | None] | None
    message: str
    step: int | None
    epoch: int | None
    metrics: dict[str, float]
    config: Any
    code_version: str | None
    created_at: datetime
    stall_s: float
    wait_s: float
    staged_at: float
    tensors: Mapping[str, torch.Tensor] = field(default_factory=dict)
    sources: Sequence[Source | LazySource] | None = None
    ahead: WriteAhead | None = None  # raw chunks written ahead of phase 2 (ingest.writeahead)
    # Each chunk's moments, taken by the staging copy (``Slot.copy_summarized``), or None.
    summaries: list[Moments | None] | None = None


def transfer_spec(transfer_from: Any) -> tuple[str, dict[str, str] | None] | None:
    if transfer_from is None:
        return None
    if isinstance(transfer_from, tuple):
        rev, mapping = transfer_from
        return str(rev), {str(k): str(v) for k, v in dict(mapping).items()}
    return str(transfer_from), None


def author() -> str:
    try:
        return knobs.get_str("AUTHOR")  # its default may find no login name (KeyError, OSError)
    except (KeyError, OSError):
        return ""


def check_metrics(metrics: Mapping[str, float] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, value in (metrics or {}).items():
        if not isinstance(name, str) or not name or len(name) > 255:
            raise UsageError(f"metric name {name!r} is not a non-empty string of at most 255 characters")
        try:
            out[name] = float(value)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"metric {name!r} = {value!r} is not a number",
                             hint="Metrics are scalars: pass float(x) or tensor.item().") from exc
        if not math.isfinite(out[name]):
            raise UsageError(f"metric {name!r} = {out[name]} is not a finite number",
                             hint="Leave a diverged metric out of metrics= (non-finite tensors are flagged "
                                  "by the commit itself), or record it in config= as a string.")
    return out


def check_int(what: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            as_int = int(value)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{what} {value!r} is not an integer") from exc
        if as_int != value:
            raise UsageError(f"{what} {value!r} is not an integer")
        value = as_int
    return integers.value(what, value)  # a 64-bit column holds it


def check_json(what: str, value: Any) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{what} is not JSON-serialisable ({exc})",
                         hint="Pass plain dicts, lists, strings, numbers, booleans and None.") from exc


def prepare(sessions: Sessions, *, branch: str, names: Collection[str], message: str | None = None, step: Any = None,
            epoch: Any = None, metrics: Mapping[str, float] | None = None, config: Any = None,
            parents: list[str] | None = None, transfer_from: Any = None,
            code_version: str | None = None) -> dict[str, Any]:
    """Validate a commit's arguments before anything is staged and return ``CommitRequest``'s
    metadata fields (but ``skeleton``). ``names``: the entry names of the state, which a declared
    transfer mapping's destinations must be among (its sources among the transfer source's).
    UsageError / InvalidRefName for a bad argument; UnknownRevision for a parent or transfer
    source that does not resolve. Revisions are resolved again when the commit is made."""
    refs.check_ref_name(branch, "branch")
    metrics_f = check_metrics(metrics)
    step, epoch = check_int("step", step), check_int("epoch", epoch)
    check_json("config", config)
    transfer = transfer_spec(transfer_from)
    with sessions() as s:  # unknown revisions fail here, before anything is staged
        for rev in parents or []:
            revparse.resolve(s, rev)
        if transfer is not None:
            source = revparse.resolve(s, transfer[0])
            if transfer[1] is not None:
                have = {entry.name for entry, _ in catalog.tensor_layout(s, source)}
                _check_mapping(transfer[0], source, transfer[1], names, have)
    return dict(branch=branch, parents=list(parents) if parents else None, transfer=transfer, message=message or "",
                step=step, epoch=epoch, metrics=metrics_f, config=config, code_version=code_version,
                created_at=datetime.now(timezone.utc))


def _check_mapping(rev: str, source: str, mapping: Mapping[str, str], dst: Collection[str],
                   src: Collection[str]) -> None:
    """Every mapped name exists: destinations in the state being committed, sources in the source."""
    for names, known, where in ((mapping.keys(), dst, "the state being committed"),
                                (mapping.values(), src, f"commit {source[:10]} ({rev})")):
        missing = [n for n in names if n not in known]
        if missing:
            raise UsageError(
                f"the transfer mapping names {missing[0]!r}, which {where} has no tensor of"
                + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""),
                hint=did_you_mean("tensor", missing[0], known, "`ckpt show REV`"),
            )
