"""ckptrepo: a lineage-aware checkpoint repository for PyTorch.

>>> import ckptrepo
>>> repo = ckptrepo.Repo.init("runs")
>>> commit = repo.commit({"model": model, "optim": opt}, step=100, metrics={"loss": 2.3}).wait()
>>> state = repo.checkout("main~1")
"""

from ckptrepo import errors
from ckptrepo.ingest.handle import CommitHandle
from ckptrepo.repository import Repo, upgrade_database
from ckptrepo.types import Commit, Parent, Problem, RefInfo, RepoStats, TensorInfo, TensorStats, VerifyReport

__all__ = [
    "Commit",
    "CommitHandle",
    "Parent",
    "Problem",
    "RefInfo",
    "Repo",
    "RepoStats",
    "TensorInfo",
    "TensorStats",
    "VerifyReport",
    "errors",
    "upgrade_database",
]
__version__ = "0.1.0"
