"""Tensor ids: the direct canonical JSON of ``ids.tensor_id`` hashes the very text ``hash_json``
writes, so a tensor keeps the id it had before (ids are content addresses: one changed byte
would split every repository's deduplication)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as s

from ckptrepo.ids import hash_json, tensor_id
from ckptrepo.state import SUPPORTED_DTYPES

_hex_ids = s.lists(s.text("0123456789abcdef", min_size=0, max_size=64), max_size=6)
_names = s.sampled_from(sorted(SUPPORTED_DTYPES)) | s.text(max_size=12)


@given(dtype=_names, shape=s.lists(s.integers(0, 2**40), max_size=5), chunk_size=s.integers(1, 2**31),
       chunk_ids=_hex_ids | s.lists(s.text(max_size=8), max_size=3))
def test_tensor_id_is_the_hash_of_the_canonical_json(dtype: str, shape: list[int], chunk_size: int,
                                                     chunk_ids: list[str]) -> None:
    assert tensor_id(dtype, shape, chunk_size, chunk_ids) == hash_json([dtype, shape, chunk_size, chunk_ids])


def test_a_known_tensor_keeps_its_id() -> None:
    # The ids hash_json gave these tensors (repositories hold such ids: they must not change).
    cid = "ab" * 32
    assert tensor_id("float32", [320, 320], 1 << 20, [cid, cid]) == (
        "909a75524ed67d49b2be8cd5b53b7c6bba75c33247b34f4ef3899ecd98e40075")
    assert tensor_id("bool", [], 1 << 20, []) == "3ca0b33cbbf2b254f5a809bde2a272f828974784c48687057b6602eb678eb75b"
