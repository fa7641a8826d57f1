"""The ``ckptrepo://`` URL grammar: ``ckptrepo://PATH@REV/FILE``.

``PATH`` is the repository's folder (the one holding ``.ckpt``, or ``.ckpt`` itself), absolute
(``ckptrepo:///data/runs@main/config.json``, three slashes) or relative to the working directory
(``ckptrepo://runs@main/config.json``). The first ``@`` ends it, so an ``@`` in the folder's
name is written ``%40`` and a ``%`` as ``%25``. ``REV`` is any revision (``main``, ``v1``,
``main~2``, ``run@step=500``, an id prefix) up to the next ``/``: a ``/`` inside it (a branch
``team/exp``) is written ``%2F`` and a ``%`` as ``%25``; an ``@`` needs no escape. ``FILE`` is the
file's path inside the view, as it is (``tokenizer/vocab.json``); empty for the top folder.
``url`` writes these escapes, ``parse`` reads them (nothing else is decoded).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ckptrepo.errors import UsageError

PROTOCOL = "ckptrepo"
_ESCAPE = re.compile("%(25|2F|2f|40)")


class Location(NamedTuple):
    """A parsed ``ckptrepo`` path: repository folder, revision, file inside the view (``""``: its top)."""

    repo: str
    rev: str
    file: str


def strip(path: str) -> str:
    """``path`` without ``ckptrepo://`` (or ``ckptrepo::``) in front and ``/`` at the end."""
    for prefix in (PROTOCOL + "://", PROTOCOL + "::"):
        if path.startswith(prefix):
            path = path[len(prefix):]
            break
    return path.rstrip("/") or path[:1]


def _decode(text: str) -> str:
    return _ESCAPE.sub(lambda m: {"25": "%", "2F": "/", "2f": "/", "40": "@"}[m.group(1)], text)


def parse(path: str) -> Location:
    """The repository, revision and file a ``ckptrepo`` URL (or the same without ``ckptrepo://``)
    names; UsageError when it names no revision."""
    body = strip(path)
    repo, at, rest = body.partition("@")
    rev, _, file = rest.partition("/")
    if not at or not repo or not rev:
        raise UsageError(f"{path!r} is not a ckptrepo URL", hint="Write ckptrepo://PATH@REV/FILE, e.g. "
                         "ckptrepo:///data/runs@main/config.json (%2F for a / in REV, %40 for an @ in PATH).")
    return Location(_decode(repo), _decode(rev), file.strip("/"))


def url(repo: str, rev: str, file: str = "", *, protocol: bool = True) -> str:
    """The ``ckptrepo`` URL of ``file`` in the view of ``rev`` of the repository at ``repo``
    (``protocol=False``: without ``ckptrepo://``, as fsspec names paths)."""
    body = repo.replace("%", "%25").replace("@", "%40") + "@" + rev.replace("%", "%25").replace("/", "%2F")
    if file:
        body += "/" + file
    return (PROTOCOL + "://" + body) if protocol else body
