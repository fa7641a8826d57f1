"""Content ids: BLAKE3-256 in lowercase hex, and their short forms."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import blake3

ID_HEX_LEN = 64
SHORT_LEN = 10

# Inputs at least this large are hashed with blake3's own threads (it releases the GIL).
_PARALLEL_MIN = 4 << 20
_PLAIN = re.compile(r"[A-Za-z0-9_]+")
_HEX_RUN = re.compile(r"[0-9a-f]*")


def hash_bytes(data: bytes | bytearray | memoryview) -> str:
    """BLAKE3-256 of ``data`` as 64 lowercase hex characters."""
    if len(data) < _PARALLEL_MIN:
        return blake3.blake3(data).hexdigest()  # one thread (the default): a keyword argument costs ~1 µs
    return blake3.blake3(data, max_threads=blake3.blake3.AUTO).hexdigest()


def hash_json(value: Any) -> str:
    """BLAKE3-256 of the canonical JSON form of ``value`` (sorted keys, no spaces)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hash_bytes(text.encode("ascii"))


def tensor_id(dtype: str, shape: Sequence[int], chunk_size: int, chunk_ids: Sequence[str],
              boxes: Any = None) -> str:
    """The id of a tensor: ``hash_json([dtype, shape, chunk_size, chunk_ids])``, with its
    ``boxes`` appended to that list when it is stored as boxes (``models.Tensor.boxes``).

    A commit computes one per tensor on its background thread; for the names and ids ckptrepo
    makes (a dtype name of letters, digits and underscores; hex chunk ids) the canonical
    JSON is written directly, which costs half of ``json.dumps``; anything else goes through
    ``hash_json``. Both give the same text, hence the same id (tests/property/test_tensor_ids.py).
    """
    if boxes is not None:
        return hash_json([dtype, list(shape), chunk_size, list(chunk_ids), boxes])
    # Every chunk id is hex exactly when their concatenation is: one match instead of one each.
    if not (_PLAIN.fullmatch(dtype) and all(type(d) is int for d in shape)
            and _HEX_RUN.fullmatch("".join(chunk_ids))):
        return hash_json([dtype, list(shape), chunk_size, list(chunk_ids)])
    ids = '"' + '","'.join(chunk_ids) + '"' if chunk_ids else ""
    text = f'["{dtype}",[{",".join(map(str, shape))}],{int(chunk_size)},[{ids}]]'
    return hash_bytes(text.encode("ascii"))


def short(full_id: str, length: int = SHORT_LEN) -> str:
    """The id shown to people: its first ``length`` hex characters."""
    return full_id[:length]


_HEX = re.compile(r"[0-9a-f]+")


def is_hex(text: str) -> bool:
    """True when ``text`` is a non-empty run of lowercase hex digits."""
    return _HEX.fullmatch(text) is not None
