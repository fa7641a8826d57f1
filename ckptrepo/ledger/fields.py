"""Type checks for the JSON the store's own objects hold (manifests, journal entries, the
identity), and their checksums.

Everything read from a store is untrusted input: each ``need_*`` returns its value when it has
the expected type and raises ``Invalid`` naming the field otherwise, so that a damaged or
crafted object is refused by name instead of failing later with a ``KeyError`` or ``TypeError``
deep inside a rebuild. The callers turn ``Invalid`` into ``IntegrityError``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import blake3

from ckptrepo.ids import ID_HEX_LEN, is_hex

CHECKSUM = "checksum"


class Invalid(ValueError):
    """A field of a stored object is missing or of the wrong type; the message names it."""


def checksum(value: Mapping[str, Any]) -> str:
    """BLAKE3 of the canonical JSON of ``value`` without its ``checksum`` field (NaN and
    infinities allowed: statistics hold them)."""
    body = {k: v for k, v in value.items() if k != CHECKSUM}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True)
    return blake3.blake3(text.encode("ascii")).hexdigest()


def check_sum(value: Mapping[str, Any], *, required: bool) -> None:
    """Raise Invalid when ``value``'s checksum is wrong, or absent and ``required``."""
    if CHECKSUM not in value:
        if required:
            raise Invalid("it has no checksum")
        return
    if value[CHECKSUM] != checksum(value):
        raise Invalid("its checksum does not match its content")


def need(value: Mapping[str, Any], name: str) -> Any:
    if not isinstance(value, Mapping) or name not in value:
        raise Invalid(f"it lacks the field {name!r}")
    return value[name]


def need_dict(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise Invalid(f"{what} is not an object")
    return value


def need_list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise Invalid(f"{what} is not a list")
    return value


def need_str(value: Any, what: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise Invalid(f"{what} is not a string")
    return value


def need_int(value: Any, what: str, *, optional: bool = False, minimum: int | None = None) -> int | None:
    if value is None and optional:
        return None
    if type(value) is not int:
        raise Invalid(f"{what} is not an integer")
    if minimum is not None and value < minimum:
        raise Invalid(f"{what} is {value}, below {minimum}")
    return value


def need_number(value: Any, what: str, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if type(value) not in (int, float):
        raise Invalid(f"{what} is not a number")
    return float(value)


def need_finite(value: Any, what: str) -> float:
    got = need_number(value, what)
    assert got is not None
    if not math.isfinite(got):
        raise Invalid(f"{what} is not finite")
    return got


def need_id(value: Any, what: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) != ID_HEX_LEN or not is_hex(value):
        raise Invalid(f"{what} is not an id of {ID_HEX_LEN} hex characters")
    return value
