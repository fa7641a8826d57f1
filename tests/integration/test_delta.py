"""Delta encoding through the repository, on every database the suite runs against."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from sqlalchemy import select
from typer.testing import CliRunner

import ckptrepo
import ckptrepo.ingest.writer
from ckptrepo import errors
from ckptrepo.chunks.codecs import Encoding
from ckptrepo.chunks.store import pack_key
from ckptrepo.cli.app import app
from ckptrepo.db.models import Chunk, Entry, TensorChunk
from ckptrepo.testing import assert_states_equal, parts


def _drift(state: dict[str, torch.Tensor], seed: int, scale: float = 1e-4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: (v * (1 + scale * torch.randn(v.shape, generator=g))).to(v.dtype) for k, v in state.items()}


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w32": torch.randn(96 * 1024, generator=g) * 0.02,
        "w16": (torch.randn(64 * 1024, generator=g) * 0.02).to(torch.bfloat16),
        "w64": torch.randn(20 * 1024, generator=g, dtype=torch.float64),
    }


def _chunks(repo: ckptrepo.Repo) -> list[Chunk]:
    with parts(repo).sessions() as s:
        return list(s.scalars(select(Chunk)))


@pytest.fixture
def repo(tmp_path: Path, db_url: str) -> ckptrepo.Repo:
    r = ckptrepo.Repo.init(tmp_path / "work", db_url=db_url, chunk_size=64 * 1024, max_delta_depth=3)
    yield r
    r.close()


@pytest.mark.parametrize("policy", ["root", "parent"])
def test_related_commits_are_stored_as_bounded_deltas_and_restore_bit_exactly(
    tmp_path: Path, db_url: str, policy: str
) -> None:
    with ckptrepo.Repo.init(tmp_path / "w", db_url=db_url, chunk_size=64 * 1024, max_delta_depth=3,
                            delta_base=policy) as repo:
        _check_bounded_deltas(repo, policy)


def _check_bounded_deltas(repo: ckptrepo.Repo, policy: str) -> None:
    states = [_state()]
    for i in range(1, 8):
        states.append(_drift(states[-1], i))
    ids = [repo.commit(s, step=i, blocking=True).wait().id for i, s in enumerate(states)]
    chunks = _chunks(repo)
    deltas = [c for c in chunks if c.encoding == Encoding.DELTA]
    assert deltas, "drifted float chunks should be stored as deltas"
    assert max(c.depth for c in chunks) == 3  # the configured bound, reached and not exceeded
    by_key = {c.key: c for c in chunks}
    for c in deltas:
        base = by_key[c.base_key]  # bases are ordinary index rows
        assert c.alone_length is not None and c.length < c.alone_length
        if policy == "root":  # one hop to a keyframe; depth counts commits since it
            assert base.depth == 0 and base.base_key is None
        else:  # a chain through the parent's chunk
            assert c.depth == base.depth + 1
    for cid, state in zip(ids, states, strict=True):
        restored = repo.checkout(cid)
        assert_states_equal(restored, state)
    assert repo.load_tensor(ids[-1], "w32").equal(states[-1]["w32"])
    stats = repo.stats()
    assert stats.delta_chunks == len(deltas) and stats.delta_saved_bytes > 0
    assert stats.dedup_saved_bytes + stats.compression_saved_bytes + stats.delta_saved_bytes == (
        stats.logical_bytes - stats.stored_bytes
    )
    assert repo.verify(full=True).ok


def test_delta_off_and_compression_off(tmp_path: Path) -> None:
    states = [_state(), _drift(_state(), 1)]
    for kwargs, encodings in (({"delta": False}, {Encoding.BYTEGROUP, Encoding.RAW}),
                              ({"compression": False}, {Encoding.RAW})):
        with ckptrepo.Repo.init(tmp_path / str(kwargs), chunk_size=64 * 1024, **kwargs) as repo:
            for s in states:
                repo.commit(s, blocking=True)
            assert {c.encoding for c in _chunks(repo)} <= encodings
            assert repo.stats().delta_saved_bytes == 0 and repo.stats().delta_chunks == 0
            assert_states_equal(repo.checkout("main")["w32"], states[1]["w32"])


def test_transfer_mapping_names_the_base(repo: ckptrepo.Repo) -> None:
    src = _state()
    source = repo.commit({"encoder.w": src["w32"]}, branch="pre", blocking=True).wait()
    new = {"backbone.w": _drift({"w": src["w32"]}, 5)["w"], "head.w": torch.randn(1000)}
    repo.commit(new, branch="ft", transfer_from=(source.id, {"backbone.w": "encoder.w"}), blocking=True)
    with parts(repo).sessions() as s:
        src_chunks = set(s.scalars(
            select(TensorChunk.chunk_key).join(Entry, Entry.tensor_key == TensorChunk.tensor_key)
            .where(Entry.commit_id == source.id)))
    deltas = [c for c in _chunks(repo) if c.encoding == Encoding.DELTA]
    assert deltas and all(c.base_key in src_chunks for c in deltas)
    assert_states_equal(repo.checkout("ft")["backbone.w"], new["backbone.w"])


def test_a_corrupt_base_fails_reads_naming_commit_and_tensor(repo: ckptrepo.Repo) -> None:
    first = _state()
    repo.commit(first, blocking=True)
    second = repo.commit(_drift(first, 1), blocking=True).wait()
    chunks = _chunks(repo)
    by_key = {c.key: c for c in chunks}
    delta = next(c for c in chunks if c.encoding == Encoding.DELTA)
    base = by_key[delta.base_key]
    path = repo.repo_dir / "store" / pack_key(base.pack_id)
    data = bytearray(path.read_bytes())
    data[base.offset + base.length - 1] ^= 0x01  # the base's last (stored, mantissa) byte
    path.write_bytes(bytes(data))
    with pytest.raises(errors.IntegrityError) as exc:
        repo.checkout(second.id)
    assert second.id[:10] in str(exc.value) and "tensor '" in str(exc.value)


def test_cli_init_options_and_stats_json(tmp_path: Path) -> None:
    runner = CliRunner()
    work = tmp_path / "w"
    assert runner.invoke(app, ["init", str(work), "--no-delta"], catch_exceptions=False).exit_code == 0
    assert json.loads((work / ".ckpt" / "config.json").read_text())["delta"] is False
    other = tmp_path / "d"
    result = runner.invoke(app, ["init", str(other), "--max-delta-depth", "4"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    with ckptrepo.Repo.open(other) as repo:
        assert repo.config.delta and repo.config.max_delta_depth == 4
        repo.commit(_state(), blocking=True)
        repo.commit(_drift(_state(), 1), blocking=True)
    result = runner.invoke(app, ["--repo", str(other), "stats", "--json"], catch_exceptions=False)
    data = json.loads(result.output)
    for key in ("logical_bytes", "unique_bytes", "stored_bytes", "dedup_saved_bytes", "compression_saved_bytes",
                "delta_saved_bytes", "delta_chunks"):
        assert key in data
    assert data["delta_saved_bytes"] > 0
    text = runner.invoke(app, ["--repo", str(other), "stats"], catch_exceptions=False).output
    assert "saved by delta" in text
    bad = runner.invoke(app, ["init", str(tmp_path / "x"), "--max-delta-depth", "0"])
    assert bad.exit_code != 0 and not (tmp_path / "x" / ".ckpt").exists()


@pytest.mark.parametrize("policy", ["root", "parent"])
def test_with_a_base_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str) -> None:
    monkeypatch.setenv("CKPT_DELTA_CACHE", str(8 << 20))
    states = [_state()]
    for i in range(1, 5):
        states.append(_drift(states[-1], i))
    with ckptrepo.Repo.init(tmp_path / "w", chunk_size=64 * 1024, delta_base=policy, max_delta_depth=3) as repo:
        ids = [repo.commit(s, blocking=True).wait().id for s in states]
        cache = parts(repo).writer._base_cache
        assert cache.budget == 8 << 20 and cache.nbytes > 0 and repo.stats().delta_chunks > 0
        for cid, state in zip(ids, states, strict=True):
            restored = repo.checkout(cid)
            assert_states_equal(restored, state)


@pytest.mark.parametrize("where", ["stored plane", "zstd frame"])
def test_a_damaged_base_does_not_break_later_commits(tmp_path: Path, where: str) -> None:
    """At ingest a base is decoded without its hash check: damage that still decodes gives a
    delta against the damaged bytes, which restores exactly (decoding is deterministic);
    damage that does not decode makes the chunk standalone. Either way the new commit is whole."""
    with ckptrepo.Repo.init(tmp_path / "w", chunk_size=64 * 1024) as repo:
        first = _state()
        repo.commit(first, blocking=True)
        chunks = {c.id: c for c in _chunks(repo)}
        target = next(c for c in chunks.values() if c.encoding == Encoding.BYTEGROUP)
        path = repo.repo_dir / "store" / pack_key(target.pack_id)
        data = bytearray(path.read_bytes())
        # A float32 bytegroup payload: 2-byte header, 4 x 5-byte plane table, then planes 0-2
        # (mantissa bytes, stored) and last plane 3 (sign and exponent, one zstd frame).
        pos = target.offset + 2 + 4 * 5 + 40 if where == "stored plane" else target.offset + target.length - 1
        data[pos] ^= 0x5A
        path.write_bytes(bytes(data))
        second = _drift(first, 1)
        commit = repo.commit(second, blocking=True).wait()
        assert_states_equal(repo.checkout(commit.id), second)
        with pytest.raises(errors.IntegrityError):
            repo.checkout("main~1")  # the damaged commit itself is reported, not repaired


def test_encoding_hints_carry_over_to_later_commits(repo: ckptrepo.Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    """A repository that committed a tensor before knows its standalone size and which planes
    pay, so a delta of a later commit is tried without encoding the chunk standalone too;
    the hints are about encoding only and never change what is stored."""
    from ckptrepo.chunks import codecs

    calls: list[int] = []
    real = codecs._standalone

    def counted(*args: object, **kw: object) -> object:
        calls.append(1)
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(codecs, "_standalone", counted)
    state = {"w": torch.randn(16 * 1024) * 0.02}  # one chunk
    for seed in range(3):
        state = _drift(state, seed)
        calls.clear()
        commit = repo.commit(state, blocking=True).wait()
    assert calls == [] and "w" in parts(repo).writer._hints  # the third commit encoded its delta only
    assert_states_equal(repo.checkout(commit.id)["w"], state["w"])
    parts(repo).writer._hints.clear()
    calls.clear()
    repo.commit(_drift(state, 9), blocking=True).wait()
    assert calls == [1]  # without hints the chunk is measured standalone first


def test_a_failing_delta_plan_fails_the_commit_and_leaves_the_repository_as_it_was(
    repo: ckptrepo.Repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delta plan is read on a worker while hashing starts; its error surfaces on the
    commit, no row or pack of that commit stays, and the next commit works."""
    first = repo.commit(_state(), message="a", blocking=True).wait()
    before = {c.id for c in _chunks(repo)}

    def broken(*_args: object, **_kwargs: object) -> None:
        raise errors.InvalidInput(path="(delta plan)", reason="injected")

    monkeypatch.setattr(ckptrepo.ingest.writer, "delta_plan", broken)
    with pytest.raises(errors.InvalidInput, match="injected"):
        repo.commit(_drift(_state(), 1), message="b", blocking=True).wait()
    assert repo.resolve("main") == first.id and {c.id for c in _chunks(repo)} == before
    monkeypatch.undo()
    second = repo.commit(_drift(_state(), 1), message="b", blocking=True).wait()
    assert [p.id for p in second.parents] == [first.id]
    assert_states_equal(repo.checkout(second.id), _drift(_state(), 1))
