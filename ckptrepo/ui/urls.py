"""Every link the pages make, built in one place with each part percent-encoded.

Revisions and tensor names are arbitrary strings: they go into a path or a query value
quoted, never as raw text. Only plain ones (letters, digits and ``. _ - ~ ^ @ = : +``, and
``/`` where the route takes a path, no ``.`` or ``..`` segment, which browsers resolve away)
go into the path (``/tensor/model/layer.0.weight``); any other uses the query form that every
such route also accepts (``/tensor?name=``, ``/commit?rev=``, ``/diff?a=&b=``), which is
decoded exactly once whatever sits between the browser and the app (a ``%2F`` in a path is
not: some servers decode it twice).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import quote, urlencode

_PLAIN_SEGMENT = re.compile(r"[A-Za-z0-9._~^@=:+-]+")
_PLAIN_PATH = re.compile(r"[A-Za-z0-9._~^@=:+/-]+")


def _query(pairs: Iterable[tuple[str, str]]) -> str:
    text = urlencode([(k, v) for k, v in pairs])
    return f"?{text}" if text else ""


def _in_path(text: str, *, slashes: bool) -> bool:
    """Whether ``text`` can go into a path as it is (quoted, but decoded the same everywhere)."""
    plain = (_PLAIN_PATH if slashes else _PLAIN_SEGMENT).fullmatch(text) is not None
    return plain and not any(part in ("", ".", "..") for part in text.split("/"))


def commit(rev: str) -> str:
    """The commit page of ``rev`` (any revision)."""
    return f"/commit/{quote(rev, safe='/')}" if _in_path(rev, slashes=True) else "/commit" + _query([("rev", rev)])


def tensor(name: str, along: str | None = None) -> str:
    """The history page of tensor ``name`` along ``along``'s first parents."""
    tail = [("along", along)] if along else []
    if _in_path(name, slashes=True):
        return f"/tensor/{quote(name, safe='/')}" + _query(tail)
    return "/tensor" + _query([("name", name), *tail])


def diff(a: str, b: str) -> str:
    """The diff page from revision ``a`` to ``b``."""
    if _in_path(a, slashes=False) and _in_path(b, slashes=False):
        return f"/diff/{quote(a, safe='')}/{quote(b, safe='')}"
    return "/diff" + _query([("a", a), ("b", b)])


def metrics(branches: Iterable[str] = (), names: Iterable[str] = ()) -> str:
    """The metrics page of these branches and metric names."""
    return "/metrics" + _query([*(("branch", b) for b in branches), *(("name", n) for n in names)])


def graph(branch: str | None = None) -> str:
    return "/" + _query([("branch", branch)] if branch else [])


def api_graph(branch: str | None = None) -> str:
    return "/api/graph" + _query([("branch", branch)] if branch else [])


def api_history(name: str, along: str | None = None, limit: int | None = None) -> str:
    pairs = [("name", name)]
    if along:
        pairs.append(("along", along))
    if limit is not None:
        pairs.append(("limit", str(limit)))
    return "/api/history" + _query(pairs)


def api_metrics(branches: Iterable[str], names: Iterable[str]) -> str:
    return "/api/metrics" + _query([*(("branch", b) for b in branches), *(("name", n) for n in names)])


def api_similar(rev: str) -> str:
    """The commits nearest to ``rev`` (``/api/similar``), from the catalog."""
    return "/api/similar" + _query([("rev", rev)])
