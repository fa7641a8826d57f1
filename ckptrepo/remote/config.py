"""A repository's remotes: ``.ckpt/remotes.json``, written atomically.

``{"remotes": {NAME: {"url": URL, "replicate": bool, "lazy": bool}}}``. The file, not the
database, holds them: a database rebuilt from the store keeps its remotes (a lazy clone needs its
remote to read tensor bytes it never fetched). Names are short identifiers (letters, digits,
``.``, ``_``, ``-``; no ``/``, which separates a remote-tracking ref's remote from its branch).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ckptrepo.atomic import write_atomic
from ckptrepo.errors import FormatError, RemoteExists, UnknownRemote, UsageError, did_you_mean
from ckptrepo.types import RemoteInfo

FILE_NAME = "remotes.json"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_MAX_BYTES = 1 << 20


def check_name(name: str) -> str:
    """``name`` if it can name a remote, else UsageError saying what a name may hold."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name.endswith(".lock") or ".." in name:
        raise UsageError(f"{name!r} cannot name a remote",
                         hint="Use letters, digits, '.', '_' and '-' (up to 63, first a letter or digit), e.g. origin.")
    return name


def load(repo_dir: Path) -> dict[str, RemoteInfo]:
    """The remotes of the repository in ``repo_dir``, by name (none when there is no file);
    FormatError for a file that is not one this code wrote."""
    path = repo_dir / FILE_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise FormatError(detail=f"{path} is unreadable ({exc})") from exc
    try:
        if len(data) > _MAX_BYTES:
            raise ValueError("it is larger than 1 MiB")
        raw = json.loads(data)
        found: dict[str, RemoteInfo] = {}
        for name, spec in dict(raw["remotes"]).items():
            check_name(name)
            if not isinstance(spec, dict) or not isinstance(spec.get("url"), str):
                raise ValueError(f"remote {name!r} has no URL")
            found[name] = RemoteInfo(name=name, url=spec["url"], replicate=bool(spec.get("replicate", False)),
                                     lazy=bool(spec.get("lazy", False)))
        return found
    except (ValueError, KeyError, TypeError, UsageError) as exc:
        raise FormatError(detail=f"{path} is damaged ({exc})",
                          hint=f"Fix or delete {path}, then add the remotes again (`ckpt remote add`).") from exc


def _save(repo_dir: Path, remotes: dict[str, RemoteInfo]) -> None:
    body: dict[str, Any] = {"remotes": {name: {"url": r.url, "replicate": r.replicate, "lazy": r.lazy}
                                        for name, r in sorted(remotes.items())}}
    write_atomic(repo_dir / FILE_NAME, (json.dumps(body, indent=2, sort_keys=True) + "\n").encode())


def add(repo_dir: Path, info: RemoteInfo) -> None:
    """Add remote ``info``; RemoteExists when the name is taken."""
    check_name(info.name)
    remotes = load(repo_dir)
    if info.name in remotes:
        raise RemoteExists(name=info.name, url=remotes[info.name].url)
    remotes[info.name] = info
    _save(repo_dir, remotes)


def remove(repo_dir: Path, name: str) -> RemoteInfo:
    """Remove remote ``name`` and return what it was; UnknownRemote when there is none."""
    remotes = load(repo_dir)
    info = get(remotes, name)
    del remotes[name]
    _save(repo_dir, remotes)
    return info


def get(remotes: dict[str, RemoteInfo], name: str) -> RemoteInfo:
    """Remote ``name`` of ``remotes``; UnknownRemote (with the names there are) otherwise."""
    info = remotes.get(name)
    if info is None:
        raise UnknownRemote(name=name, hint=did_you_mean("remote", name, remotes, "`ckpt remote list`"))
    return info
