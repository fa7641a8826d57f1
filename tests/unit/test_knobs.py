"""The knobs: read from the environment, documented in one table that matches ``knobs.KNOBS``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ckptrepo import knobs
from ckptrepo.errors import UsageError

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"


def test_the_documented_table_is_the_knobs_table() -> None:
    text = DESIGN.read_text(encoding="utf-8")
    table = text.split("<!-- knobs-table", 1)[1].split("<!-- /knobs-table -->", 1)[0]
    rows = re.findall(r"^\| `(CKPT_[A-Z0-9_]+)` \| (.*?) \| (.*?) \|$", table, re.M)
    assert [(v, d, doc) for v, d, doc in rows] == [(k.variable, k.default, k.doc) for k in knobs.KNOBS.values()]


def test_knobs_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CKPT_MAX_INFLIGHT", raising=False)
    assert knobs.get_int("MAX_INFLIGHT", 1) == 1
    monkeypatch.setenv("CKPT_MAX_INFLIGHT", "3")
    assert knobs.get_int("MAX_INFLIGHT", 1) == 3
    monkeypatch.setenv("CKPT_MAX_INFLIGHT", "")
    assert knobs.get_int("MAX_INFLIGHT", 1) == 1
    monkeypatch.setenv("CKPT_MAX_INFLIGHT", "three")
    with pytest.raises(UsageError, match="CKPT_MAX_INFLIGHT='three' is not an integer"):
        knobs.get_int("MAX_INFLIGHT", 1)
    monkeypatch.setenv("CKPT_DIRECT_IO", "0")
    assert knobs.get_bool("DIRECT_IO", True) is False
    monkeypatch.setenv("CKPT_WORKERS", "0")
    assert knobs.workers() == 1


def test_an_unknown_knob_is_a_programming_error() -> None:
    with pytest.raises(KeyError):
        knobs.get_int("NOT_A_KNOB", 0)
