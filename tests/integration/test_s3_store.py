"""A repository whose packs live in an S3-compatible object store (a real server on loopback)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import boto3
import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from ckptrepo import Repo, errors
from ckptrepo.cli.app import app
from ckptrepo.storage import S3Backend
from ckptrepo.storage.s3 import parse_s3_url
from ckptrepo.testing import assert_states_equal, parts


def _state(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(256, 64, generator=gen),
        "layer.0.weight": torch.randn(64, 64, generator=gen).to(torch.bfloat16),
        "layer.0.bias": torch.zeros(64),
        "head.weight": torch.randn(10, 64, generator=gen),
        "steps": torch.tensor(seed, dtype=torch.int64),
    }


def _objects(url: str) -> list[str]:
    """Every object key in the URL's bucket, straight from the server."""
    bucket, _, endpoint, _ = parse_s3_url(url)
    listing = boto3.client("s3", endpoint_url=endpoint).list_objects_v2(Bucket=bucket)
    return sorted(item["Key"] for item in listing.get("Contents", ()))


def test_repo_on_s3_commit_checkout_verify_gc(tmp_path: Path, s3_url: str) -> None:
    with Repo.init(tmp_path / "work", store_url=s3_url, chunk_size=16 << 10) as repo:
        assert isinstance(parts(repo).backend.local, S3Backend)  # under the read-through to remotes
        first = repo.commit(_state(1), step=1, blocking=True).wait()
        assert _objects(s3_url) and all(key.startswith(("repo/store/packs/", "repo/store/manifests/"))
                                        or key == "repo/store/repository.json" for key in _objects(s3_url))
        second_state = dict(_state(1), **{"head.weight": _state(2)["head.weight"]})
        second = repo.commit(second_state, step=2).wait()
        assert 0 < second.new_bytes < second.logical_bytes / 4

    with Repo.open(tmp_path / "work") as repo:
        assert repo.config.store_url == s3_url
        assert_states_equal(repo.checkout(first.id), _state(1))
        assert_states_equal(repo.checkout("main"), second_state)
        assert repo.load_tensor("main~1", "layer.0.weight").equal(_state(1)["layer.0.weight"])
        assert repo.verify(full=True).ok

        repo.branch("explore", at="main")
        repo.commit(_state(3), branch="explore", step=3).wait()
        kept = _objects(s3_url)
        staging = tmp_path / "work" / ".ckpt" / "store" / ".staging"
        assert list(staging.iterdir()) == []
        (staging / "pack-interrupted.tmp").write_bytes(b"left by a killed writer")
        assert [p.kind for p in repo.verify().warnings] == ["temporary_file"]
        repo.delete_branch("explore", force=True)
        report = repo.gc(grace=0)
        assert report.commits_removed == 1 and report.packs_removed >= 1
        assert report.temporary_files_removed == 1 and list(staging.iterdir()) == []
        # The removed commit's packs and its manifest went; the branch's deletion was journalled.
        now = _objects(s3_url)
        assert len(now) == len(kept) - report.packs_removed - report.commits_removed + 1
        assert len([k for k in now if k.startswith("repo/store/journal/")]) == 2  # branch explore, its deletion
        assert_states_equal(repo.checkout("main"), second_state)
        assert repo.verify(full=True).ok


def test_cli_init_commit_checkout_on_s3(tmp_path: Path, s3_url: str) -> None:
    runner = CliRunner()
    work = tmp_path / "work"

    def run(*args: str) -> Any:
        result = runner.invoke(app, ["--repo", str(work), *args], catch_exceptions=False)
        assert result.exit_code == 0, result.stderr
        return result

    source = tmp_path / "model.safetensors"
    save_file(_state(5), str(source))
    assert s3_url in run("init", "--store", s3_url, str(work)).stdout
    run("commit", str(source), "-m", "first", "--step", "5")
    out = tmp_path / "out.safetensors"
    run("checkout", "main", "-o", str(out))
    assert_states_equal(load_file(str(out)), _state(5))
    assert _objects(s3_url)


def _unusable_urls(s3_url: str, s3_endpoint: str) -> list[tuple[str, str]]:
    bucket = parse_s3_url(s3_url)[0]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    return [
        (f"s3://{bucket}-missing/p?endpoint_url={s3_endpoint}", "does not exist"),
        (f"s3://{bucket}/p?endpoint_url={dead}", "unreachable"),
    ]


@pytest.mark.parametrize("case", [0, 1], ids=["missing-bucket", "unreachable-endpoint"])
def test_unusable_store_is_a_clear_error_and_changes_nothing(
    tmp_path: Path, s3_url: str, s3_endpoint: str, case: int
) -> None:
    url, words = _unusable_urls(s3_url, s3_endpoint)[case]
    with pytest.raises(errors.StorageError, match=words) as info:
        Repo.init(tmp_path / "work", store_url=url)
    assert info.value.hint
    assert not (tmp_path / "work").exists()

    result = CliRunner().invoke(app, ["init", "--store", url, str(tmp_path / "cli")])
    assert result.exit_code == errors.StorageError.exit_code
    assert words in result.stderr and "hint:" in result.stderr
    assert not (tmp_path / "cli").exists()
    assert _objects(s3_url) == []


def test_missing_credentials_are_named(
    tmp_path: Path, s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(errors.StorageError, match="credentials") as info:
        Repo.init(tmp_path / "work", store_url=s3_url)
    assert "AWS_ACCESS_KEY_ID" in info.value.hint
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize(
    "url",
    [
        "s3://",
        "s3://b/p",
        "s3://Bad_Bucket!/p",
        "s3://key:secret@bucket/p",
        "s3://bucket/a//b",
        "s3://bucket/../x",
        "s3://bucket/p?endpoint=http://x",
        "s3://bucket/p?endpoint_url=ftp://x",
        "s3://bucket/p?region=",
    ],
)
def test_bad_s3_urls_are_usage_errors(tmp_path: Path, url: str) -> None:
    with pytest.raises(errors.UsageError) as info:
        Repo.init(tmp_path / "work", store_url=url)
    assert "s3://BUCKET" in info.value.hint or "AWS_ACCESS_KEY_ID" in info.value.hint
    assert not (tmp_path / "work").exists()
