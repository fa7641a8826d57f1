"""``Exploring``, the part of the ``Repo`` facade that explores a lineage after the fact: results
attached to commits (annotations), evaluation runs, bisect, weight-space merges, and lineage
recovered from the weights. Each call validates its arguments and delegates to ``explore``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptrepo.sync import Sync

if TYPE_CHECKING:
    from collections.abc import Mapping

    from typing_extensions import Unpack

    from ckptrepo import types as t
    from ckptrepo.config import RepoConfig
    from ckptrepo.handle import CommitHandle
    from ckptrepo.ingest.writer import WriterOptions


class Exploring(Sync):
    """Annotations, evaluation, bisect, weight merges and lineage inference over the repository."""

    if TYPE_CHECKING:  # Repo's
        def __init__(self, repo_dir: Path, config: RepoConfig, **options: Unpack[WriterOptions]) -> None: ...
        def _check_writable(self, what: str) -> None: ...
        def commit(self, state: Any, *, branch: str | None = None, message: str | None = None,
                   step: int | None = None, epoch: int | None = None, metrics: Mapping[str, float] | None = None,
                   config: Any = None, parents: list[str] | None = None, transfer_from: Any = None,
                   allow_pickle: bool = False, code_version: str | None = None, blocking: bool = False,
                   group: Any = None, local: bool = False, wait_remote: bool = False) -> CommitHandle: ...
        def annotate(self, rev: str, *, metrics: Mapping[str, float] | None = None, note: str | None = None,
                     source: str | None = None) -> t.Commit: ...

    # -- evaluation and bisect (explore.runner, explore.evaluate, explore.bisect) ---------------

    # -- weight-space merges (explore.merge) ----------------------------------------------------

    # -- lineage from the weights (explore.similar) ---------------------------------------------
