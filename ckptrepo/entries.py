"""Entry names: how a key path of a state names its tensor, without torch.

A tensor's *entry name* is its key path joined by ``join_path`` (``model/layer.0.weight``);
``state.flatten`` names every tensor so, and ``flat_skeleton`` gives the skeleton it writes for
a flat ``{str: tensor}`` dict (what a safetensors file holds), so a file's tensors can be
committed as bytes (``ingest.sources``) exactly as ``flatten`` would describe them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any


def escape(part: str | int) -> str:
    """One part of an entry name: ``%`` -> ``%25``, ``/`` -> ``%2F``."""
    text = str(part)
    return text.replace("%", "%25").replace("/", "%2F") if "%" in text or "/" in text else text


def join_path(parts: Sequence[str | int]) -> str:
    """Entry name of a key path: escaped parts joined by ``/``. Injective over non-empty part
    lists; ``[]`` and ``[""]`` both give ``""``."""
    return "/".join(map(escape, parts))


def split_path(name: str) -> list[str]:
    """The parts of an entry name (inverse of ``join_path``; int parts come back as str)."""
    return [re.sub("%(25|2F)", lambda m: "%" if m.group(1) == "25" else "/", p) for p in name.split("/")]


def flat_skeleton(keys: Iterable[str]) -> Any:
    """The skeleton ``state.flatten`` gives a dict of these string keys to distinct plain tensors,
    in this order; each tensor's entry name is ``escape(key)``."""
    items: list[Any] = []
    for key in keys:
        items += [key, {"t": escape(key)}]
    return {"d": items}


# A commit's non-tensor files (a model folder's config.json, tokenizer files, model card) are
# entries too: each file's bytes are a 1-D uint8 tensor stored like any other (chunked,
# deduplicated, verified, covered by the commit id), under a name no state's key path can give,
# since ``escape`` writes every ``%`` as ``%25``. ``state.unflatten`` never reaches them: the
# skeleton does not name them.
FILE_PREFIX = "%file/"
MAX_FILE_PATH = 512
_FILE_PART = re.compile(r"[^\x00-\x1f\x7f/\\]+")


def check_file_path(path: str) -> str | None:
    """Why ``path`` cannot name a file of a commit (None when it can): a relative POSIX path of at
    most ``MAX_FILE_PATH`` characters, whose parts are neither empty, ``.`` nor ``..`` and hold no
    control character or backslash."""
    if not path or len(path) > MAX_FILE_PATH:
        return f"a file path must have 1 to {MAX_FILE_PATH} characters"
    for part in path.split("/"):
        if part in ("", ".", "..") or not _FILE_PART.fullmatch(part):
            return f"{path!r} is not a relative path of plain names (no '', '.', '..', control characters or '\\\\')"
    return None


def file_entry(path: str) -> str:
    """The entry name of the commit file at relative POSIX ``path`` (ValueError when
    ``check_file_path`` refuses it)."""
    problem = check_file_path(path)
    if problem is not None:
        raise ValueError(problem)
    return FILE_PREFIX + path


def is_file_entry(name: str) -> bool:
    """Whether entry ``name`` holds a commit file rather than a tensor of the state."""
    return name.startswith(FILE_PREFIX)


def file_path(name: str) -> str:
    """The relative path of the commit file whose entry name is ``name`` (``is_file_entry``)."""
    return name[len(FILE_PREFIX):]
