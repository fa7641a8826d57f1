"""A small lineage really trained on the CPU (seeded, well under a second), for the tests of lineage
from the weights: a base MLP pretrained from scratch, full fine-tunes of it, a transfer (the base's
body frozen under a new head for another task) and a fork of a fine-tune at another learning rate.

Each checkpoint is a ``torch.save`` file ``{"model": state_dict, "optimizer": Adam's state_dict}``, as
a training script writes it (the base: its body alone, as a released encoder is), under names that
say nothing of the lineage. ``TRUTH`` gives each one's true source and edge kind.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

# name -> (kind, source); the base is a root.
TRUTH: dict[str, tuple[str, str] | None] = {
    "base": None,
    "ft1": ("parent", "base"),
    "ft2": ("parent", "ft1"),
    "ft3": ("parent", "ft2"),
    "tr1": ("transfer", "base"),
    "tr2": ("parent", "tr1"),
    "fork1": ("parent", "ft1"),
    "fork2": ("parent", "fork1"),
}


class Body(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 48), nn.Linear(48, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.relu(self.fc2(torch.relu(self.fc1(x))))
        return out


class Net(nn.Module):
    """The body under a head: ``classifier`` for the first task, ``head`` (two layers) for the second."""

    def __init__(self, body: Body, *, transfer: bool = False) -> None:
        super().__init__()
        self.body = body
        if transfer:
            self.head = nn.Sequential(nn.Linear(48, 24), nn.ReLU(), nn.Linear(24, 3))
        else:
            self.classifier = nn.Linear(48, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = (self.head if hasattr(self, "head") else self.classifier)(self.body(x))
        return out


def _task(seed: int, classes: int) -> Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(16, classes, generator=g)

    def batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(64, 16, generator=gen)
        return x, (x @ w).argmax(1)

    return batch


def _train(model: nn.Module, opt: torch.optim.Optimizer, task: Callable[[torch.Generator], tuple[torch.Tensor, ...]],
           gen: torch.Generator, steps: int) -> None:
    for _ in range(steps):
        x, y = task(gen)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()


def make(folder: Path, *, steps: int = 6) -> dict[str, Path]:
    """Train the lineage and write one file per checkpoint into ``folder`` (random names); name -> path."""
    import copy

    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    names = iter(random.Random(7).sample(range(100, 1000), len(TRUTH)))
    paths: dict[str, Path] = {}

    def save(name: str, model: nn.Module, opt: torch.optim.Optimizer | None, prefix: str = "") -> None:
        path = folder / f"ckpt_{next(names)}.pt"
        weights = {k: v.clone() for k, v in model.state_dict().items() if k.startswith(prefix)}
        state: dict[str, object] = {"model": weights}
        if opt is not None:
            state["optimizer"] = copy.deepcopy(opt.state_dict())
        torch.save(state, path)
        paths[name] = path

    task_a, task_b = _task(1, 4), _task(2, 3)
    gen = torch.Generator().manual_seed(3)
    base = Net(Body())
    _train(base, torch.optim.SGD(base.parameters(), lr=0.1), task_a, gen, 40)  # "pretraining"
    save("base", base, None, "body.")  # released: the body alone, no optimizer state

    fine = Net(copy.deepcopy(base.body))
    opt = torch.optim.Adam(fine.parameters(), lr=2e-3)
    kept = None
    for i in (1, 2, 3):
        _train(fine, opt, task_a, gen, steps)
        save(f"ft{i}", fine, opt)
        if i == 1:
            kept = copy.deepcopy(fine.state_dict()), copy.deepcopy(opt.state_dict())

    probe = Net(copy.deepcopy(base.body), transfer=True)
    probe.body.requires_grad_(False)
    head_opt = torch.optim.Adam(probe.head.parameters(), lr=1e-2)
    for i in (1, 2):
        _train(probe, head_opt, task_b, gen, steps)
        save(f"tr{i}", probe, head_opt)

    assert kept is not None
    fork = Net(Body())
    fork.load_state_dict(kept[0])
    fork_opt = torch.optim.Adam(fork.parameters(), lr=2e-3)
    fork_opt.load_state_dict(kept[1])
    for group in fork_opt.param_groups:
        group["lr"] = 1e-2
    for i in (1, 2):
        _train(fork, fork_opt, task_a, gen, steps)
        save(f"fork{i}", fork, fork_opt)
    return paths
