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
Importing ckptrepo does not import torch; the calls that take or return tensors do.
"""

from ckptrepo import errors
from ckptrepo.folder import find_repo, upgrade_database
from ckptrepo.ingest.handle import CommitHandle
from ckptrepo.repository import DEFAULT_BRANCH, Repo
from ckptrepo.training import Checkpointer
from ckptrepo.types import (
    Commit,
    Diff,
    ExactDelta,
    GcReport,
    GraphEdge,
    GraphNode,
    HistoryPoint,
    LineageGraph,
    MetricPoint,
    Parent,
    Problem,
    PruneReport,
    RebuildReport,
    RefInfo,
    RepackReport,
    RepoStats,
    RetentionRules,
    TensorDelta,
    TensorInfo,
    TensorStats,
    VerifyCounts,
    VerifyReport,
)

__all__ = [
    "DEFAULT_BRANCH",
    "Checkpointer",
    "Commit",
    "CommitHandle",
    "Diff",
    "ExactDelta",
    "GcReport",
    "GraphEdge",
    "GraphNode",
    "HistoryPoint",
    "LineageGraph",
    "MetricPoint",
    "Parent",
    "Problem",
    "PruneReport",
    "RebuildReport",
    "RefInfo",
    "RepackReport",
    "Repo",
    "RepoStats",
    "RetentionRules",
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
