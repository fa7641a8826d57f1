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
