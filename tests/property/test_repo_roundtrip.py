"""Property test through the whole repository: commit (staging, chunking, encoding, packs,
database) then checkout restores random nested states bit-exactly, ties included."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from test_state_roundtrip import assert_restored, states

import ckptrepo


@pytest.fixture(scope="module")
def repo() -> Iterator[ckptrepo.Repo]:
    # Small chunks and packs so dedup across examples and several packs occur.
    with tempfile.TemporaryDirectory() as tmp, ckptrepo.Repo.init(Path(tmp), chunk_size=4096,
                                                                  pack_target=64 * 1024) as r:
        yield r


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(state=states())
def test_commit_checkout_round_trip(repo: ckptrepo.Repo, state: Any) -> None:
    commit = repo.commit({"s": state}, branch="prop").wait()
    assert_restored({"s": state}, repo.checkout(commit.id))
