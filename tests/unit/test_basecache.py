"""The delta-base cache: a byte budget, first come first kept, two generations."""

from __future__ import annotations

from ckptrepo.ingest.basecache import BaseCache


def test_budget_generations_and_clear() -> None:
    cache = BaseCache(budget=10)
    cache.put("a", b"12345")
    cache.put("b", memoryview(b"6789"))
    cache.put("c", b"too big")  # over the budget: not kept, earlier entries stay
    assert cache.get("a") == b"12345" and cache.get("b") == b"6789" and cache.get("c") is None
    cache.rotate()  # the kept chunks become the bases of the next commit
    assert cache.get("a") == b"12345"
    cache.put("c", b"1234567")
    assert cache.get("c") == b"1234567" and cache.nbytes == 16
    cache.rotate()  # two generations at most
    assert cache.get("a") is None and cache.get("c") == b"1234567"
    cache.clear()
    assert cache.get("c") is None and cache.nbytes == 0


def test_zero_budget_keeps_nothing() -> None:
    cache = BaseCache(budget=0)
    cache.put("a", b"x")
    assert cache.get("a") is None
