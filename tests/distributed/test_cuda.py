"""The CUDA path: pinned staging memory and non-blocking device-to-host copies, for plain commits
and for saves through ``ckptrepo.dcp.Writer``. Runs only where CUDA is present."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ckptrepo
from ckptrepo.testing import parts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_cuda_state_commits_through_pinned_staging_and_restores(tmp_path: Path) -> None:
    state = {"w": torch.randn(1024, 1024, device="cuda"), "b": torch.arange(10, device="cuda")}
    with ckptrepo.Repo.init(tmp_path) as repo:
        handle = repo.commit(state)
        arena = parts(repo).writer.snapshots().staging._free or []
        state["w"].zero_()  # the copy has ended (synchronised) when commit() returns
        commit = handle.wait()
        restored = repo.checkout(commit.id)
    assert torch.equal(restored["b"], torch.arange(10))
    assert not torch.equal(restored["w"], torch.zeros(1024, 1024))
    assert all(slot.arena is None or slot.arena.is_pinned() for slot in arena)


def test_cuda_tensors_save_through_the_writer(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    from ckptrepo.dcp import Writer, commit_id

    state = {"w": torch.randn(256, 64, device="cuda")}
    expected = state["w"].cpu()
    with ckptrepo.Repo.init(tmp_path) as repo, pytest.warns(UserWarning):
        cid = commit_id(dcp.save(state, storage_writer=Writer(repo), no_dist=True))
        assert torch.equal(repo.checkout(cid)["w"], expected)
