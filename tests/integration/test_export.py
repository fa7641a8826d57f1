"""``Repo.export`` (``ckpt checkout REV -o FILE``): the file ``write_state(checkout(rev))`` would
write, streamed for flat safetensors states, atomic, and refused early for unknown suffixes."""

from __future__ import annotations

from pathlib import Path

import pytest
import safetensors.torch
import torch
from torch import nn

import ckptrepo
from ckptrepo import errors
from ckptrepo.formats import read_state, write_state
from ckptrepo.formats.hf_layout import flat_keys as flat_entries
from ckptrepo.state import flatten
from ckptrepo.testing import parts


@pytest.fixture
def repo(tmp_path: Path, db_url: str) -> ckptrepo.Repo:
    r = ckptrepo.Repo.init(tmp_path / "work", db_url=db_url, chunk_size=64 * 1024)
    yield r
    r.close()


def _flat(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "emb.weight": torch.randn(300, 200, generator=g),  # several chunks
        "b16": torch.randn(1000, generator=g).to(torch.bfloat16),
        "step": torch.tensor(7.0),
        "ids": torch.arange(50),
        "mask": torch.rand(33, generator=g) > 0.5,
        "empty": torch.zeros(0, 4),
    }


def test_a_committed_safetensors_file_comes_back_byte_for_byte(repo: ckptrepo.Repo, tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    original = files / "model.safetensors"
    safetensors.torch.save_file(_flat(), str(original), metadata={"format": "pt"})
    commit = repo.commit(read_state(original), blocking=True).wait()
    out = files / "out.safetensors"
    assert repo.export(commit.id[:10], out) == commit.id
    assert out.read_bytes() == original.read_bytes()
    assert sorted(p.name for p in files.iterdir()) == ["model.safetensors", "out.safetensors"]


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_every_state_exports_as_write_state_writes_it(repo: ckptrepo.Repo, tmp_path: Path, suffix: str) -> None:
    model = nn.Linear(8, 3)
    tied = torch.randn(5)
    states = [{"model": model, "extra": {"lr": 0.1}}, {"a": tied, "b": tied}, _flat(1)]
    for i, state in enumerate(states):
        commit = repo.commit(state, branch=f"b{i}", blocking=True).wait()
        ours, theirs = tmp_path / f"ours{i}{suffix}", tmp_path / f"theirs{i}{suffix}"
        repo.export(commit.id, ours)
        write_state(repo.checkout(commit.id), theirs)
        if suffix == ".safetensors" and i > 0:  # nested states: save_file orders 2 metadata keys by hash
            assert ours.read_bytes() == theirs.read_bytes(), i
        restored, expected = flatten(read_state(ours)), flatten(read_state(theirs))
        assert restored.skeleton == expected.skeleton
        assert all(torch.equal(restored.tensors[n], t) for n, t in expected.tensors.items())


def test_flat_entries_tells_flat_tensor_dicts_from_other_states() -> None:
    t = torch.ones(2)
    assert flat_entries(flatten({"a": t, "b": torch.zeros(1)}).skeleton) == {"a": "a", "b": "b"}
    assert flat_entries(flatten({"a": t, "b": t}).skeleton) == {"a": "a", "b": "a"}
    for other in ({"a": t, "n": 3}, {"m": {"w": t}}, {1: t}, [t]):
        assert flat_entries(flatten(other).skeleton) is None


def test_unknown_suffix_is_refused_before_reading(repo: ckptrepo.Repo, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    commit = repo.commit(_flat(), blocking=True).wait()
    monkeypatch.setattr(parts(repo).reader, "read_into", lambda *a, **k: pytest.fail("read before the suffix check"))
    with pytest.raises(errors.UsageError, match="unknown suffix"):
        repo.export(commit.id, tmp_path / "out.npz")
    assert not (tmp_path / "out.npz").exists()


def test_a_damaged_chunk_fails_the_export_and_keeps_the_old_file(tmp_path: Path) -> None:
    with ckptrepo.Repo.init(tmp_path / "work", compression=False, chunk_size=64 * 1024) as repo:
        good = repo.commit(_flat(2), blocking=True).wait()
        files = tmp_path / "files"
        files.mkdir()
        out = files / "out.safetensors"
        repo.export(good.id, out)
        before = out.read_bytes()
        bad = repo.commit(_flat(3), blocking=True).wait()
        packs = sorted((repo.repo_dir / "store").rglob("*.pack"), key=lambda p: p.stat().st_mtime)
        data = bytearray(packs[-1].read_bytes())
        data[len(data) // 2] ^= 0xFF
        packs[-1].write_bytes(bytes(data))
        with pytest.raises(errors.IntegrityError, match=bad.id[:10]):
            repo.export(bad.id, out)
        assert out.read_bytes() == before
        assert [p.name for p in files.iterdir()] == ["out.safetensors"]
