"""The integers a query may take: checked before they reach the database.

SQLite's INTEGER and PostgreSQL's BIGINT are 64-bit signed, and a larger Python int makes the
driver raise mid-query (sqlite3: OverflowError). Every integer a caller gives a query is
checked here first, so that a huge one is a UsageError naming it:

- ``value``: a value stored in a column (a step, an epoch; a revision's ``@step=N``), any
  64-bit signed integer;
- ``count``: how many (a limit, an offset, a depth, a revision's ``~N`` and ``^N``), from a
  minimum to ``MAX_COUNT``, which leaves room for a query's own arithmetic (``offset + limit``,
  ``limit + 1``) within 64 bits.
"""

from __future__ import annotations

from typing import Any, Final

from ckptrepo.errors import UsageError

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
MAX_COUNT: Final = 10**18
MAX_SECONDS: Final = 100 * 366 * 86400  # a grace period or an age: ``datetime`` spans about 10,000 years


def value(what: str, number: Any) -> int:
    """``number`` when it is an int (not a bool) a 64-bit column holds; UsageError naming ``what`` otherwise."""
    return _check(what, number, INT64_MIN, INT64_MAX)


def count(what: str, number: Any, *, minimum: int = 0) -> int:
    """``number`` when it is an int (not a bool) from ``minimum`` to ``MAX_COUNT``; UsageError naming
    ``what`` otherwise."""
    return _check(what, number, minimum, MAX_COUNT)


def seconds(what: str, number: Any) -> float:
    """``number`` as a float of seconds from 0 to ``MAX_SECONDS`` (a grace period, an age to keep,
    which become a ``datetime`` cutoff); UsageError naming ``what`` otherwise (nan and inf too)."""
    if isinstance(number, bool) or not isinstance(number, int | float) or not 0 <= number <= MAX_SECONDS:
        raise UsageError(f"{what} must be from 0 to {MAX_SECONDS} seconds (100 years), got {_shown(number)}",
                         hint="Give a number of seconds, or a duration such as 90s, 12h or 7d.")
    return float(number)


def _check(what: str, number: Any, low: int, high: int) -> int:
    if isinstance(number, bool) or not isinstance(number, int) or not low <= number <= high:
        raise UsageError(f"{what} must be an integer from {low} to {high}, got {_shown(number)}")
    return number


def _shown(number: Any) -> str:
    if isinstance(number, int) and number.bit_length() > 96:  # str() refuses ints of over 4300 digits
        return f"an integer of {number.bit_length()} bits"
    text = repr(number)
    return text if len(text) <= 40 else text[:37] + "..."
