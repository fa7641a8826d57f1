"""``ckptrepo.testing``: the one equality of states fails on every kind of difference and names
where; ``parts`` gives a repository's own working parts and makes nothing."""

from __future__ import annotations

import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ckptrepo
from ckptrepo import errors
from ckptrepo.db.models import Commit
from ckptrepo.testing import assert_states_equal, parts


def _state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {
        "model": {"w": torch.randn(4, 6, generator=g), "b": torch.zeros(6, dtype=torch.bfloat16)},
        "optim": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 1e-3, "params": [0]}]},
        "rng": np.arange(5, dtype=np.uint32),
        "step": 3,
        "loss": 0.25,
        "name": "run",
        "shape": (4, 6),
    }


def _flipped(t: torch.Tensor, index: int, mask: int) -> torch.Tensor:
    """A copy of ``t`` with bits ``mask`` of element ``index`` flipped."""
    out = t.clone()
    out.view(torch.int32 if t.element_size() == 4 else torch.int16).view(-1)[index] ^= mask
    return out


def _differs(actual: Any, expected: Any, message: str, **kw: Any) -> None:
    with pytest.raises(AssertionError, match=re.escape(message)):
        assert_states_equal(actual, expected, **kw)


def test_equal_states_pass_whatever_the_strides_and_the_key_order() -> None:
    state = _state()
    again = _state()
    again["model"]["w"] = again["model"]["w"].t().contiguous().t()  # the same values, other strides
    again["model"] = dict(reversed(again["model"].items()))
    assert_states_equal(again, state)
    nan = torch.tensor([float("nan"), 1.0])
    assert_states_equal({"x": nan, "y": float("nan")}, {"x": nan.clone(), "y": float("nan")})
    assert_states_equal(torch.zeros(0, 3), torch.zeros(0, 3))


def test_a_flipped_bit_is_named_with_its_path_index_and_bits() -> None:
    state = _state()
    state["model"]["w"] = torch.ones(4, 6)
    changed = _state()
    changed["model"]["w"] = _flipped(state["model"]["w"], 7, 1)  # the lowest mantissa bit of element (1, 1)
    _differs(changed, state, "the states differ at ['model']['w']: 1 of 24 elements differ; the first, at (1, 1): "
                             "actual 1.0000001192092896 (0x3f800001), expected 1.0 (0x3f800000)")
    changed["model"]["w"] = state["model"]["w"]
    changed["model"]["b"] = _flipped(state["model"]["b"], 5, 0x8000)  # a bfloat16's sign
    _differs(changed, state, "at ['model']['b']: 1 of 6 elements differ; the first, at (5,): actual -0.0")


def test_nan_payloads_and_the_sign_of_zero_count() -> None:
    nan = torch.tensor([1.0, float("nan")])
    _differs(_flipped(nan, 1, 1), nan, "the first, at (1,): actual nan (0x7fc00001), expected nan (0x7fc00000)")
    _differs(torch.tensor(-0.0), torch.tensor(0.0), "actual -0.0 (0x80000000), expected 0.0 (0x00000000)")
    _differs({"loss": -0.0}, {"loss": 0.0}, "at ['loss']: actual -0.0, expected 0.0")
    _differs(np.float32(-0.0), np.float32(0.0), "numpy scalars, by their bytes")
    _differs(np.array([-0.0]), np.array([0.0]), "1 of 1 elements differ")


def test_dtype_shape_and_type_differences_are_named() -> None:
    w = torch.ones(2, 3)
    _differs({"w": w.double()}, {"w": w}, "at ['w']: actual dtype torch.float64, expected torch.float32")
    _differs({"w": w[:1]}, {"w": w}, "at ['w']: actual shape (1, 3), expected (2, 3)")
    _differs(np.zeros(3, np.float32), np.zeros(3, np.float64), "actual dtype float32, expected float64")
    _differs(w.numpy(), w, "actual a numpy.ndarray, expected a torch.Tensor")
    _differs(torch.nn.Parameter(w), w, "actual a torch.nn.parameter.Parameter, expected a torch.Tensor")
    assert_states_equal(OrderedDict(a=1), {"a": 1})  # dicts compare as mappings
    _differs(OrderedDict(a=1), {"a": 2}, "at ['a']: actual 1, expected 2")
    _differs([1, 2], (1, 2), "actual a list, expected a tuple")
    _differs({"step": 1.0}, {"step": 1}, "at ['step']: actual a float, expected a int")


def test_missing_extra_and_retyped_keys_are_named() -> None:
    state = _state()
    fewer = {k: v for k, v in state.items() if k != "rng"}
    _differs(fewer, state, "the states differ at the root: keys differ: missing ['rng']")
    _differs(state, fewer, "keys differ: unexpected ['rng']")
    _differs({"a": 1, "c": 2}, {"a": 1, "b": 2}, "keys differ: missing ['b'], unexpected ['c']")
    _differs({1: "x"}, {True: "x"}, "key True: actual a int, expected a bool")
    _differs({"b": 1, "a": 2}, {"a": 2, "b": 1}, "key order: actual ['b', 'a'], expected ['a', 'b']", ordered=True)


def test_differing_plain_values_are_named_with_the_path() -> None:
    state = _state()
    changed = _state()
    changed["optim"]["param_groups"][0]["lr"] = 1e-4
    _differs(changed, state, "at restored['optim']['param_groups'][0]['lr']: actual 0.0001, expected 0.001",
             path="restored")
    _differs({"shape": (4, 5)}, {"shape": (4, 6)}, "at ['shape'][1]: actual 5, expected 6")
    _differs({"shape": (4,)}, {"shape": (4, 6)}, "at ['shape']: actual length 1, expected 2")
    _differs({"name": "a" * 200}, {"name": "b"}, "actual 'aaaa")
    objects = np.array([{"k": 1}, {"k": 2}], dtype=object)
    _differs(np.array([{"k": 1}, {"k": 3}], dtype=object), objects, "at [1]['k']: actual 3, expected 2")


def test_parts_are_the_repositorys_own_and_make_no_commit_engine(tmp_path: Path) -> None:
    with ckptrepo.Repo.init(tmp_path / "work") as repo:
        before = parts(repo)
        assert before.writer is None  # made by the first write, not by parts()
        commit = repo.commit({"w": torch.ones(3)}, blocking=True).wait()
        after = parts(repo)
        assert after.writer is not None and after.backend is before.backend and after.reader is before.reader
        with after.sessions() as s, after.reading() as r:  # the repository's catalog
            assert s.get(Commit, commit.id) is not None and r.get(Commit, commit.id) is not None
    with pytest.raises(errors.UsageError, match="closed"):
        parts(repo)
    with ckptrepo.Repo.open(tmp_path / "work", read_only=True) as ro:
        assert ro.checkout("main")["w"].sum() == 3 and parts(ro).writer is None
