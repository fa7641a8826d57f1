"""The bulk helpers ``analysis.history`` builds its points with give what the plain ways give."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest

from ckptrepo.db.models import utc_datetime
from ckptrepo.lineage.analysis import _utc_datetimes
from ckptrepo.types import HistoryPoint, TensorInfo, TensorStats

NOW = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc)


def test_fast_history_point_equals_the_constructed_one() -> None:
    info = TensorInfo("w", "a" * 64, "float32", (2, 3), 24, 1, TensorStats(6, 0.5, 1.0, -1.0, 2.0, 3.0, 2.0, 0, 0))
    args = ("b" * 64, 7, NOW, 3, "changed", info, None, 1, 1, True)  # every field, pruned last
    fast, plain = HistoryPoint._fast(*args), HistoryPoint(*args)
    assert fast == plain and fast.to_json() == plain.to_json()
    assert [getattr(fast, f.name) for f in dataclasses.fields(fast)] == list(args)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.status = "unchanged"  # type: ignore[misc]
    assert dataclasses.replace(fast, status="added").status == "added"


@pytest.mark.parametrize("values", [
    ["2026-01-02 03:04:05.678901", "2026-01-02 03:04:05"],  # SQLite's stored text (UTC)
    ["2026-01-02 03:04:05.678901", "2026-01-02T04:04:05+01:00"],  # an offset in the text
    [NOW, NOW + timedelta(seconds=1)],  # psycopg's datetimes in a UTC session
    [NOW.astimezone(timezone(timedelta(hours=2))), NOW.replace(tzinfo=None)],  # another zone, naive
    [],
])
def test_utc_datetimes_equal_utc_datetime_one_by_one(values: list[object]) -> None:
    got = _utc_datetimes(list(values))
    assert got == [utc_datetime(v) for v in values]  # type: ignore[arg-type]
    assert all(d.tzinfo is timezone.utc for d in got)
