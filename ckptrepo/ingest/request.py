"""A commit request: the arguments of ``Repo.commit`` checked, and what phase 1 hands to phase 2."""

from __future__ import annotations

import getpass
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import torch

from ckptrepo.errors import UsageError

if TYPE_CHECKING:
    from ckptrepo.ingest.stats import Moments
    from ckptrepo.ingest.writeahead import WriteAhead


@dataclass
class CommitRequest:
    """A staged commit handed from phase 1 to phase 2 (revisions still unresolved)."""

    tensors: dict[str, torch.Tensor]
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
        return os.environ.get("CKPT_AUTHOR") or getpass.getuser()
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
        return as_int
    return value


def check_json(what: str, value: Any) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{what} is not JSON-serialisable ({exc})",
                         hint="Pass plain dicts, lists, strings, numbers, booleans and None.") from exc
