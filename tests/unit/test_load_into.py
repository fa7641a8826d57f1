"""Loading a commit into live objects is all or nothing (issue 45): everything is checked before
anything is written, and StateMismatch names every key that differs, with a hint."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ckptrepo import Repo
from ckptrepo.errors import StateMismatch, UsageError
from ckptrepo.state import load_into


@pytest.fixture
def repo(tmp_path: Path) -> Iterator[Repo]:
    with Repo.init(tmp_path / "repo") as r:
        yield r


def _model(out: int = 3, seed: int = 0, *, extra: bool = False) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, out)]
    if extra:
        layers.append(torch.nn.Linear(out, out))
    return torch.nn.Sequential(*layers)


def _bytes_of(*objs: Any) -> list[bytes]:
    """Every tensor each object holds, as bytes (a module's state_dict, an optimizer's state, a tensor)."""
    out: list[bytes] = []
    for obj in objs:
        if isinstance(obj, torch.Tensor):
            flat = obj.detach().contiguous().reshape(-1)
            out.append(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
        elif isinstance(obj, np.ndarray):
            out.append(obj.tobytes())
        elif isinstance(obj, torch.nn.Module):
            out.extend(_bytes_of(*obj.state_dict().values()))
        elif isinstance(obj, torch.optim.Optimizer):
            sd = obj.state_dict()
            out.append(repr(sd["param_groups"]).encode())
            out.extend(_bytes_of(*(v for s in sd["state"].values() for v in s.values())))
    return out


def _trained(model: torch.nn.Module) -> torch.optim.Optimizer:
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(16, 4)).pow(2).mean().backward()
    opt.step()
    return opt


def test_a_mismatched_last_layer_loads_nothing_and_names_the_key(repo: Repo) -> None:
    source = _model(3, seed=1)
    repo.commit({"model": source, "optim": _trained(source), "w": torch.ones(5)}, blocking=True).wait()
    target = _model(5, seed=2)  # the last layer has 5 outputs, the commit's 3
    opt = _trained(target)
    w = torch.zeros(5)
    before = _bytes_of(target, opt, w)
    with pytest.raises(StateMismatch) as caught:
        repo.checkout("main", into={"w": w, "optim": opt, "model": target})
    err = caught.value
    assert "'model': '3.weight' has shape [3, 8] in the commit, [5, 8] in the module" in str(err)
    assert "'3.bias'" in str(err) and "0.weight" not in str(err)
    assert err.hint and "Nothing was loaded" in err.hint and err.exit_code == 2
    assert isinstance(err, UsageError)  # callers catching UsageError still do
    assert _bytes_of(target, opt, w) == before  # the earlier layers, the optimizer and the tensor too


def test_missing_and_unexpected_keys_are_listed(repo: Repo) -> None:
    repo.commit({"model": _model(3)}, blocking=True).wait()
    bigger = _model(3, seed=3, extra=True)
    before = _bytes_of(bigger)
    with pytest.raises(StateMismatch, match=r"2 key\(s\) missing from the commit: '4.weight', '4.bias'"):
        repo.checkout("main", into={"model": bigger})
    assert _bytes_of(bigger) == before
    smaller = torch.nn.Sequential(torch.nn.Linear(4, 8))
    with pytest.raises(StateMismatch, match=r"key\(s\) the module does not have: '1.weight', '1.bias'"):
        repo.checkout("main", into={"model": smaller})
    with pytest.raises(StateMismatch, match=r"the commit has no 'optimizer' to load; at that level it has: 'model'"):
        repo.checkout("main", into={"model": _model(3), "optimizer": {}})
    with pytest.raises(StateMismatch, match=r"'model': '3.bias' is a str in the commit, a tensor in the module"):
        load_into({"model": _model(3)}, {"model": {**_model(3).state_dict(), "3.bias": "x"}})


def test_an_optimizer_of_other_parameters_loads_nothing(repo: Repo) -> None:
    source = _model(3)
    repo.commit({"model": source, "optim": _trained(source)}, blocking=True).wait()
    model = _model(3, seed=4)
    fewer = torch.optim.AdamW(list(model.parameters())[:2], lr=0.5)  # 2 parameters, the commit's 6
    before = _bytes_of(model, fewer)
    with pytest.raises(StateMismatch, match=r"'optim': parameter group 0 has 6 parameter\(s\) in the commit, 2 in"):
        repo.checkout("main", into={"model": model, "optim": fewer})
    assert _bytes_of(model, fewer) == before
    groups = torch.optim.AdamW([{"params": list(model.parameters())[:2]}, {"params": list(model.parameters())[2:]}])
    with pytest.raises(StateMismatch, match=r"1 parameter group\(s\) in the commit, 2 in the optimizer"):
        repo.checkout("main", into={"optim": groups})
    with pytest.raises(StateMismatch, match="not an optimizer's state_dict"):
        load_into({"optim": fewer}, {"optim": {"lr": 1}})


def test_a_bare_tensor_commit_into_a_dict_is_a_state_mismatch(repo: Repo) -> None:
    repo.commit(torch.arange(6.0), blocking=True).wait()
    w = torch.zeros(6)
    with pytest.raises(StateMismatch, match=r"a tensor \(torch.float32 \[6\]\) at the top level.*a dict"):
        repo.checkout("main", into={"w": w})
    assert torch.equal(w, torch.zeros(6))
    assert torch.equal(repo.checkout("main"), torch.arange(6.0))  # without into: the tensor
    with pytest.raises(UsageError, match="not a dict of them") as caught:
        load_into(torch.nn.Linear(2, 2), {"weight": torch.zeros(2, 2)})  # type: ignore[arg-type]
    assert caught.value.hint


def test_every_difference_is_counted_and_the_first_ones_shown() -> None:
    targets = {f"t{i}": torch.zeros(2) for i in range(12)}
    with pytest.raises(StateMismatch) as caught:
        load_into(targets, {f"t{i}": torch.zeros(3) for i in range(12)})
    assert "(12 difference(s))" in str(caught.value) and "; and 2 more" in str(caught.value)
    assert len(caught.value.fields["differences"]) == 12


def test_a_load_that_fits_loads_everything(repo: Repo) -> None:
    model = _model(3, seed=5)
    opt = _trained(model)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    opt.step()
    sched.step()
    arr = np.arange(6, dtype=np.int32).reshape(2, 3)
    repo.commit({"model": model, "optim": opt, "sched": sched, "nested": {"w": torch.full((2, 2), 7.0), "a": arr},
                 "step": 3}, blocking=True).wait()
    model2 = _model(3, seed=6)
    opt2 = _trained(model2)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=1, gamma=0.5)
    w, a = torch.zeros(2, 2), np.zeros((2, 3), dtype=np.int32)
    restored = repo.checkout("main", into={"model": model2, "optim": opt2, "sched": sched2,
                                           "nested": {"w": w, "a": a}})
    assert restored["step"] == 3
    assert _bytes_of(model2, opt2) == _bytes_of(model, opt)
    assert sched2.state_dict() == sched.state_dict()
    assert torch.equal(w, torch.full((2, 2), 7.0)) and a.tolist() == arr.tolist()
    lazy = torch.nn.LazyLinear(3)  # takes the commit's shapes, as load_state_dict gives them
    load_into({"m": lazy}, {"m": model[3].state_dict()})
    assert torch.equal(lazy.weight, model[3].weight)
    half = _model(3, seed=7).half()  # dtypes are cast, as load_state_dict does
    load_into({"m": half}, {"m": model.state_dict()})
    assert torch.equal(half[0].weight, model[0].weight.half())
