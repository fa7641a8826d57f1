"""Optimizer state keys after a trip through ``torch.distributed.checkpoint``.

An optimizer's ``state_dict()`` keys its per-parameter ``state`` by the parameters' positions,
ints, which its ``param_groups`` list under ``"params"``; ``load_state_dict`` matches the two,
and DCP's ``get_state_dict`` looks the ints up. DCP flattens a state by key paths of *strings*
(``optim.state.0.exp_avg``), so a nested state rebuilt from its flatten mappings has ``"0"``
where the optimizer had ``0``: loaded as is, the optimizer keeps the moments under keys no
parameter has (``get_state_dict`` then fails with ``KeyError: '0'``).

``int_keys`` puts the ints back in every optimizer state dict of a state: a distributed commit's
state (``writer.ShareWriter``) is so recorded as a single process's commit of the same objects
is, and a checkout of a commit recorded before that (``Repo.checkout``) or the targets of a
distributed load (``native.load``) are mended the same way. An optimizer state dict keyed by
parameter *name* (DCP's ``get_state_dict``: ``"params"`` lists strings) is left as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def int_keys(node: Any) -> Any:
    """``node`` with the digit-string keys of each optimizer state dict's ``state`` (in dicts and
    lists, at any depth) made the ints its ``param_groups`` list; a ``"0"`` beside a ``0`` is merged
    into it (its values win). The very same object when nothing changes (containers on the way to
    a change are copied, never changed)."""
    if isinstance(node, dict):
        fixed = _optimizer_state(node)
        if fixed is not None:
            return fixed
        out = {k: int_keys(v) for k, v in node.items()}
        return node if all(out[k] is v for k, v in node.items()) else out
    if isinstance(node, list) and type(node) is list:
        items = [int_keys(v) for v in node]
        return node if all(a is b for a, b in zip(items, node, strict=True)) else items
    return node


def _optimizer_state(sd: dict[Any, Any]) -> dict[Any, Any] | None:
    """``sd`` mended when it is an optimizer state dict keyed by position with string keys in its
    ``state``, else None."""
    state, groups = sd.get("state"), sd.get("param_groups")
    if not isinstance(state, Mapping) or not isinstance(groups, list) or not groups:
        return None
    ids: set[int] = set()
    for group in groups:
        params = group.get("params") if isinstance(group, Mapping) else None
        if not isinstance(params, list) or not all(type(p) is int for p in params):
            return None  # keyed by name (get_state_dict), or not an optimizer's
        ids.update(params)
    strays = [k for k in state if isinstance(k, str) and _as_int(k) in ids]
    if not strays:
        return None
    mended: dict[Any, Any] = {k: v for k, v in state.items() if k not in strays}
    for k in strays:
        at, value = _as_int(k), state[k]
        before = mended.get(at)
        mended[at] = {**before, **value} if isinstance(before, Mapping) and isinstance(value, Mapping) else value
    return {**sd, "state": mended}


def _as_int(key: str) -> int | None:
    return int(key) if key.isdecimal() and key.isascii() and (key == "0" or not key.startswith("0")) else None
