"""ckptrepo: a lineage-aware checkpoint repository for PyTorch.

>>> import ckptrepo
>>> repo = ckptrepo.Repo.init("runs")
>>> commit = repo.commit({"model": model, "optim": opt}, step=100, metrics={"loss": 2.3}).wait()
>>> state = repo.checkout("main~1")

The public names: ``Repo`` and what its methods return (``ckptrepo.types``, all exported here),
``CommitHandle``, ``Checkpointer`` (commit from a training loop, resume exactly) with its
policies (``ckptrepo.policy``), the errors (``ckptrepo.errors``), repository settings and
process knobs (``ckptrepo.config``, ``ckptrepo.knobs``), checkpoint file formats
(``ckptrepo.formats``).
Importing ckptrepo does not import torch (the calls that take or return tensors do), nor the
database stack: each public name is imported when it is first used (``__getattr__``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ckptrepo import errors

if TYPE_CHECKING:
    from ckptrepo.folder import find_repo, upgrade_database
    from ckptrepo.handle import CommitHandle
    from ckptrepo.repository import DEFAULT_BRANCH, Repo
    from ckptrepo.training import Checkpointer
    from ckptrepo.types import (
        Annotation,
        BisectResult,
        BisectStep,
        Commit,
        Diff,
        EvalResult,
        ExactDelta,
        FetchResult,
        GcReport,
        GraphEdge,
        GraphNode,
        HistoryPoint,
        InterpolationPoint,
        LineageCandidate,
        LineageEvidence,
        LineageGraph,
        LineageProposal,
        MetricPoint,
        Parent,
        Problem,
        PruneReport,
        PullResult,
        PushResult,
        RebuildReport,
        RecoveryPoint,
        RefInfo,
        RefUpdate,
        RemoteInfo,
        RepackReport,
        ReplicationStatus,
        RepoStats,
        RetentionRules,
        Similarity,
        TensorDelta,
        TensorInfo,
        TensorStats,
        VerifyCounts,
        VerifyReport,
    )

# Where each public name lives, imported at its first use (PEP 562): `import ckptrepo` alone
# loads no database stack, so `ckpt --version` starts in about the time Typer takes to import.
_HOMES = {
    "find_repo": "ckptrepo.folder", "upgrade_database": "ckptrepo.folder", "CommitHandle": "ckptrepo.handle",
    "DEFAULT_BRANCH": "ckptrepo.repository", "Repo": "ckptrepo.repository", "Checkpointer": "ckptrepo.training",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name, "ckptrepo.types" if name in __all__ and name != "errors" else None)
    if home is None:
        raise AttributeError(f"module 'ckptrepo' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups find it without this call
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "DEFAULT_BRANCH",
    "Annotation",
    "BisectResult",
    "BisectStep",
    "Checkpointer",
    "Commit",
    "CommitHandle",
    "Diff",
    "EvalResult",
    "ExactDelta",
    "FetchResult",
    "FollowUpdate",
    "GcReport",
    "GraphEdge",
    "GraphNode",
    "HistoryPoint",
    "InterpolationPoint",
    "LineageCandidate",
    "LineageEvidence",
    "LineageGraph",
    "LineageProposal",
    "MetricPoint",
    "Parent",
    "Problem",
    "PruneReport",
    "PullResult",
    "PushResult",
    "RebuildReport",
    "RecoveryPoint",
    "RefInfo",
    "RefUpdate",
    "RemoteInfo",
    "RepackReport",
    "ReplicationStatus",
    "Repo",
    "RepoStats",
    "RetentionRules",
    "Similarity",
    "TensorDelta",
    "TensorInfo",
    "TensorStats",
    "VerifyCounts",
    "VerifyReport",
    "errors",
    "find_repo",
    "upgrade_database",
]
__version__ = "0.1.0"
