"""Huge and malformed integers are usage errors before they reach a query (issue 45).

``db.integers`` bounds what the queries take; ``revparse`` bounds a revision's numbers;
``ui.params.integer`` bounds a query parameter of the UI. None of them may let a number reach
``int()`` (over 4300 digits) or the database (over 64 bits) as an OverflowError.
"""

from __future__ import annotations

import pytest
from starlette.requests import Request

from ckptrepo.db import integers
from ckptrepo.errors import UnknownRevision, UsageError
from ckptrepo.lineage import revparse
from ckptrepo.ui import params

HUGE = [10**20, 2**63, -(2**63) - 1, 10**5000]
HUGE_IDS = ["1e20", "2**63", "-2**63-1", "1e5000"]


@pytest.mark.parametrize("number", [0, 1, 2**63 - 1, -(2**63)])
def test_value_takes_any_64_bit_integer(number: int) -> None:
    assert integers.value("step", number) == number


@pytest.mark.parametrize("number", [*HUGE, True, 1.0, "1", None], ids=[*HUGE_IDS, "True", "1.0", "'1'", "None"])
def test_value_refuses_what_a_column_cannot_hold(number: object) -> None:
    with pytest.raises(UsageError, match=r"^step must be an integer from"):
        integers.value("step", number)


@pytest.mark.parametrize("number", [1, integers.MAX_COUNT])
def test_count_takes_one_to_max(number: int) -> None:
    assert integers.count("limit", number, minimum=1) == number


@pytest.mark.parametrize("number", [0, -1, integers.MAX_COUNT + 1, *HUGE, False],
                         ids=["0", "-1", "MAX_COUNT+1", *HUGE_IDS, "False"])
def test_count_refuses_out_of_range(number: int) -> None:
    with pytest.raises(UsageError) as caught:
        integers.count("limit", number, minimum=1)
    assert caught.value.message.startswith("limit must be an integer from 1 to 1000000000000000000")
    assert len(caught.value.message) < 200  # a 5000-digit number is described, not printed


@pytest.mark.parametrize("rev", ["main~99999999999999999999", "main^99999999999999999999",
                                 "main@step=99999999999999999999", "main@step=-99999999999999999999",
                                 "main~" + "9" * 5000, "main@step=" + "9" * 5000],
                         ids=["~1e20", "^1e20", "step=1e20", "step=-1e20", "~5000 digits", "step=5000 digits"])
def test_revision_numbers_out_of_range_are_usage_errors(rev: str) -> None:
    with pytest.raises(UsageError) as caught:
        revparse.parse(rev)
    assert not isinstance(caught.value, UnknownRevision)
    assert "out of range" in caught.value.message or "must be an integer" in caught.value.message
    assert len(caught.value.message) < 300


def test_revision_numbers_in_range_parse() -> None:
    assert revparse.parse("main~1000000000000000000").hops == (("~", 10**18),)
    assert revparse.parse("main@step=9223372036854775807").step == 2**63 - 1
    assert revparse.parse("main@step=-9223372036854775808^2").step == -(2**63)


def _request(query: str) -> Request:
    return Request({"type": "http", "method": "GET", "path": "/api/commits", "query_string": query.encode(),
                    "headers": []})


@pytest.mark.parametrize("raw", ["100000000000000000000", "9" * 5000, "1000000000000000001", "-5", "0"],
                         ids=["1e20", "5000 digits", "1e18+1", "-5", "0"])
def test_ui_integer_out_of_range(raw: str) -> None:
    with pytest.raises(UsageError) as caught:
        params.integer(_request(f"limit={raw}"), "limit", default=None, minimum=1)
    assert caught.value.message.startswith("limit must be from 1 to 1000000000000000000")
    assert len(caught.value.message) < 200 and "?limit=" in caught.value.hint


@pytest.mark.parametrize("raw", ["many", "1_000", "1e3", "1.0", "%D9%A3", "0x10", "--1"])
def test_ui_integer_malformed(raw: str) -> None:
    """Only ASCII digits count (``int()`` would take ``1_000`` and Arabic-Indic digits)."""
    with pytest.raises(UsageError, match=r"^limit must be an integer, got"):
        params.integer(_request(f"limit={raw}"), "limit", default=None, minimum=1)


def test_ui_integer_in_range() -> None:
    assert params.integer(_request("limit=+7"), "limit", default=None, minimum=1) == 7
    assert params.integer(_request("limit=%2007%20"), "limit", default=None, minimum=1) == 7
    assert params.integer(_request("limit=00000000000000000000000000012"), "limit", default=None, minimum=1) == 12
    assert params.integer(_request("limit="), "limit", default=3, minimum=1) == 3
    assert params.integer(_request(""), "limit", default=None, minimum=1) is None
    assert params.integer(_request("limit=1000000000000000000"), "limit", default=None, minimum=1) == 10**18


def test_the_library_bounds_steps_grace_periods_and_durations_before_any_query(tmp_path: object) -> None:
    """``Repo.commit(step=HUGE)``, ``gc(grace=HUGE)`` and a duration of centuries are UsageErrors
    (they raised OverflowError from the driver or ``datetime``), and the CLI's bounds are the
    library's."""
    import torch

    import ckptrepo
    from ckptrepo.cli import options
    from ckptrepo.maintenance.retention import parse_duration

    assert (options.INT64_MAX, options.MAX_COUNT, options.MAX_SECONDS) == (
        integers.INT64_MAX, integers.MAX_COUNT, integers.MAX_SECONDS)
    with pytest.raises(UsageError, match="100 years"):
        parse_duration("99999999999d")
    assert parse_duration("7d") == 7 * 86400
    with ckptrepo.Repo.init(str(tmp_path)) as repo:
        for bad in (10**20, -(2**63) - 1):
            with pytest.raises(UsageError, match=r"^step must be an integer"):
                repo.commit({"w": torch.zeros(1)}, step=bad)
        with pytest.raises(UsageError, match=r"^epoch must be an integer"):
            repo.commit({"w": torch.zeros(1)}, epoch=2**64)
        for grace in (1e308, float("inf"), float("nan")):
            with pytest.raises(UsageError, match="grace period"):
                repo.gc(grace=grace)
        assert repo.log() == []
        repo.gc(grace=0)
