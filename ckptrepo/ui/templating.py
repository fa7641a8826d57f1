"""The Jinja2 environment of the pages: autoescaping on for every template, strict undefined
names, and the filters that format numbers, sizes and times for people.

Nothing reaches a page unescaped: values are escaped by autoescaping, JSON data blocks are
written with ``tojson`` (which also escapes ``<``, ``>``, ``&`` and ``'``), and links come
from ``urls`` (quoted). No template marks anything ``safe``.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from functools import cache
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from starlette.responses import HTMLResponse

from ckptrepo.ui import urls

DASH = "—"


def number(value: Any, digits: int = 4) -> str:
    """A float with ``digits`` significant digits (ints with thousands separators); ``—`` for None,
    ``NaN``/``inf`` as such."""
    if value is None:
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.{digits}g}"
    return str(value)


def signed(value: Any, digits: int = 3) -> str:
    """A difference: with its sign (``+0.012``), ``—`` for None."""
    if value is None or not isinstance(value, int | float) or isinstance(value, bool):
        return DASH
    if isinstance(value, float) and not math.isfinite(value):
        return number(value)
    return f"{value:+.{digits}g}"


def percent(value: Any) -> str:
    """A fraction as a percentage (``12.5%``), ``—`` for None."""
    if value is None or not isinstance(value, int | float) or not math.isfinite(value):
        return DASH
    return f"{100 * value:.3g}%"


def size(value: Any) -> str:
    """Bytes in binary units (``1.5 MiB``)."""
    if value is None:
        return DASH
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(amount) < 1024 or unit == "TiB":
            return f"{int(amount)} B" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return DASH  # unreachable


def seconds(value: Any) -> str:
    if value is None:
        return DASH
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def timestamp(value: datetime | None) -> str:
    """A time as ``2026-01-31 12:00:05 UTC``."""
    return DASH if value is None else value.strftime("%Y-%m-%d %H:%M:%S %Z").strip()


def first_line(text: str | None) -> str:
    return (text or "").split("\n", 1)[0].rstrip("\r")


def pretty_json(value: Any) -> str:
    """``value`` as indented JSON text (for display: the template escapes it)."""
    return json.dumps(value, indent=2, sort_keys=True, default=str)


@cache
def environment() -> Environment:
    """The one environment of the package's templates (``autoescape=True``: every template)."""
    env = Environment(loader=PackageLoader("ckptrepo.ui", "templates"), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(number=number, signed=signed, percent=percent, size=size, seconds=seconds,
                       timestamp=timestamp, first_line=first_line, pretty_json=pretty_json)
    env.globals["urls"] = urls
    # Data blocks: compact, and NaN refused (the data is made JSON-safe first: ``data.json_safe``).
    env.policies["json.dumps_kwargs"] = {"separators": (",", ":"), "allow_nan": False}
    return env


def render(template: str, context: dict[str, Any], *, status: int = 200) -> HTMLResponse:
    """``template`` rendered with ``context`` as an HTML response."""
    html = environment().get_template(template).render(**context)
    return HTMLResponse(html, status_code=status)
