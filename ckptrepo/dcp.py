"""Commit and load through ``torch.distributed.checkpoint`` (DCP).

>>> import torch.distributed.checkpoint as dcp
>>> from ckptrepo.dcp import Reader, Writer, commit_id
>>> metadata = dcp.save(state_dict, storage_writer=Writer("runs/exp1", step=1000))  # every rank
>>> commit_id(metadata)                       # the commit, on every rank
>>> dcp.load(state_dict, storage_reader=Reader("runs/exp1", "main"))   # any world size, any layout

``Writer(repo, ...)`` is a DCP StorageWriter: each ``dcp.save`` (or ``dcp.async_save``) through it
makes one commit; every rank writes its own shards' chunks (no tensor bytes travel between
ranks), and the coordinator records the commit once every rank's packs are durable.
``Reader(repo, rev)`` is a DCP StorageReader: ``dcp.load`` reshards commit ``rev`` to the
target's layout, each rank reading only the chunks its shards need. ``repo`` is an open
``Repo`` or a path; a path opens a repository the Writer or Reader owns (``close()`` it, or use
it as a context manager). See ``ckptrepo.distributed`` for the protocol and its failure semantics.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from ckptrepo.distributed.writer import commit_id
from ckptrepo.repository import Repo
from ckptrepo.types import Commit

__all__ = ["Reader", "Writer", "commit_id"]


class _Owned:
    """An open ``Repo``, or one opened from a path and closed by ``close()``."""

    def __init__(self, repo: Repo | str | Path) -> None:
        self.repo = repo if isinstance(repo, Repo) else Repo.open(repo)
        self._owned = not isinstance(repo, Repo)

    def close(self) -> None:
        """Close the repository if this object opened it (waits for its pending work)."""
        if self._owned:
            self.repo.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class Writer(_Owned, StorageWriter):
    """A DCP StorageWriter committing each save to ``repo`` on ``branch`` (default: its current
    branch) with this message, step, epoch, metrics and config. ``commit`` is the last save's
    commit on the coordinator; every rank reads its id with ``commit_id(metadata)``."""

    def __init__(self, repo: Repo | str | Path, *, branch: str | None = None, step: int | None = None,
                 epoch: int | None = None, metrics: Mapping[str, float] | None = None, message: str | None = None,
                 config: Any = None, allow_pickle: bool = False) -> None:
        _Owned.__init__(self, repo)
        StorageWriter.__init__(self)
        self._impl = self.repo.dcp_writer(branch=branch, step=step, epoch=epoch, metrics=metrics, message=message,
                                          config=config, allow_pickle=allow_pickle)

    @property
    def commit(self) -> Commit | None:
        return self._impl.commit

    def reset(self, checkpoint_id: Any = None) -> None:
        self._impl.reset(checkpoint_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._impl.set_up_storage_writer(is_coordinator, *args, **kwargs)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return self._impl.prepare_local_plan(plan)

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return self._impl.prepare_global_plan(plans)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        return self._impl.write_data(plan, planner)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        self._impl.finish(metadata, results)

    def storage_meta(self) -> StorageMeta | None:
        return self._impl.storage_meta()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False


class Reader(_Owned, StorageReader):
    """A DCP StorageReader over commit ``rev`` of ``repo``; values stored pickled are refused
    unless ``allow_pickle``."""

    def __init__(self, repo: Repo | str | Path, rev: str, *, allow_pickle: bool = False) -> None:
        _Owned.__init__(self, repo)
        StorageReader.__init__(self)
        self._impl = self.repo.dcp_reader(rev, allow_pickle=allow_pickle)

    @property
    def commit_id(self) -> str:
        """The full id of the commit (once DCP has read the metadata)."""
        return self._impl.commit_id

    def reset(self, checkpoint_id: Any = None) -> None:
        self._impl.reset(checkpoint_id)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return self._impl.read_metadata(*args, **kwargs)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._impl.set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return self._impl.prepare_local_plan(plan)

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return self._impl.prepare_global_plan(plans)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        return self._impl.read_data(plan, planner)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False
