"""A one-minute tour of ckptrepo on the CPU: train, commit, branch, restore, inspect.

A small classifier head trains on a frozen random-feature encoder (synthetic data made
here, nothing downloaded). After its first step the loop maps the staging memory
(``repo.reserve``); every ``every`` steps it commits
``{"model": model, "optim": opt, "sched": sched}`` with its step and metrics; then a
branch ``lr-high`` starts from the middle commit of ``main``, restores that state into
fresh objects with ``checkout(into=...)``, checks it is bit-identical to what was
committed, and trains on with a higher learning rate. The log of both branches and
the repository's sizes, after ``repack`` has encoded what the commits stored raw, close the
tour.

Run it with ``python -m ckptrepo.demo [--dir PATH] [--steps N]`` or ``ckpt demo``.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from rich import box
from rich.console import Console
from rich.table import Table
from torch import nn

from ckptrepo import Repo
from ckptrepo.ids import short
from ckptrepo.types import Commit

BRANCH = "lr-high"
LR = 1e-3
LR_HIGH = 5e-3
BATCH = 128
FEATURES, HIDDEN, CLASSES = 32, 512, 8


class Run:
    """Model, optimizer and scheduler of one training run, plus the synthetic data it learns."""

    def __init__(self, lr: float, total_steps: int) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(
            # A frozen encoder (random features): its tensors never change, so every commit after
            # the first stores none of its bytes again.
            nn.Linear(FEATURES, HIDDEN),
            nn.GELU(),
            nn.Linear(HIDDEN, HIDDEN),
            nn.GELU(),
            # The trained head.
            nn.Linear(HIDDEN, 256),
            nn.GELU(),
            nn.Linear(256, CLASSES),
        )
        for layer in list(self.model)[:4]:
            layer.requires_grad_(False)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.01)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=max(1, total_steps // 4), gamma=0.5)
        self.x, self.y = _dataset()

    def state(self) -> dict[str, Any]:
        return {"model": self.model, "optim": self.opt, "sched": self.sched}

    def train_step(self, step: int) -> float:
        """One optimizer step on a batch chosen by ``step`` (so a resumed run sees the same data)."""
        train_n = len(self.x) - 512
        idx = torch.randint(train_n, (BATCH,), generator=torch.Generator().manual_seed(step))
        loss = nn.functional.cross_entropy(self.model(self.x[idx]), self.y[idx])
        self.opt.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        self.opt.step()
        self.sched.step()
        return loss.item()

    def evaluate(self) -> float:
        """Accuracy on the held-out last 512 examples."""
        with torch.no_grad():
            return float((self.model(self.x[-512:]).argmax(1) == self.y[-512:]).float().mean())

    def set_lr(self, lr: float) -> None:
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.sched.base_lrs = [lr for _ in self.opt.param_groups]


def _dataset(n: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian points labelled by a fixed random linear teacher (the same data on every call)."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, FEATURES, generator=g)
    return x, (x @ torch.randn(FEATURES, CLASSES, generator=g)).argmax(1)


def _train(
    repo: Repo, run: Run, steps: range, every: int, *, branch: str, lr: float, keep: int | None = None
) -> tuple[list[Commit], dict[str, torch.Tensor]]:
    """Train over ``steps``, committing every ``every`` steps without waiting for each commit.

    Returns the commits and a copy of the model's tensors as committed at step ``keep``.
    """
    handles = []
    kept: dict[str, torch.Tensor] = {}
    losses: list[float] = []
    for step in steps:
        losses.append(run.train_step(step))
        if step == steps[0]:
            # The state has its final layout once the optimizer has stepped (AdamW's moments
            # exist from then on): map the staging memory now, not inside the first commit.
            repo.reserve(run.state())
        if step % every == 0:
            metrics = {"loss": sum(losses) / len(losses), "val_acc": run.evaluate()}
            losses.clear()
            if step == keep:
                kept = {name: t.detach().clone() for name, t in run.model.state_dict().items()}
            handles.append(
                repo.commit(
                    run.state(),
                    branch=branch,
                    step=step,
                    metrics=metrics,
                    message=f"{branch} step {step}",
                    config={"lr": lr, "batch": BATCH},
                )
            )
    return [handle.wait() for handle in handles], kept


def _same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _log_table(title: str, commits: Sequence[Commit]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name in ("commit", "branch", "step", "loss", "val_acc", "new", "stored", "stall"):
        table.add_column(name, justify="left" if name in ("commit", "branch") else "right")
    for c in commits:
        table.add_row(
            c.short_id,
            c.branch or "",
            str(c.step),
            f"{c.metrics['loss']:.3f}",
            f"{c.metrics['val_acc']:.3f}",
            _mib(c.new_bytes),
            _mib(c.stored_bytes),
            f"{c.stall_s * 1e3:.1f} ms",
        )
    return table


def main(
    directory: str | Path | None = None,
    *,
    steps: int = 400,
    every: int | None = None,
    console: Console | None = None,
) -> Path:
    """Run the tour in a new repository at ``directory`` (default: a new temporary folder).

    ``main`` trains ``steps`` steps committing every ``every`` (default ``steps // 8``);
    ``lr-high`` forks at the middle commit and trains up to ``steps`` too. Returns the
    folder holding the repository's ``.ckpt``, which is kept for exploring with ``ckpt``.
    """
    every = every or max(1, steps // 8)
    if steps < 2 or not 1 <= every <= steps:
        raise ValueError(f"the demo needs steps >= 2 and 1 <= every <= steps, got steps={steps}, every={every}")
    console = console or Console()
    root = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="ckpt-demo-"))
    with Repo.init(root) as repo:
        console.print(f"[bold]ckpt demo[/] in {repo.repo_dir}", highlight=False)

        commit_steps = range(every, steps + 1, every)
        fork_step = commit_steps[(len(commit_steps) - 1) // 2]
        run = Run(LR, steps)
        main_commits, at_fork = _train(repo, run, range(1, steps + 1), every, branch="main", lr=LR, keep=fork_step)
        console.print(
            f"main     {steps} steps at lr {LR:g}: {len(main_commits)} commits, one every {every} steps",
            highlight=False,
        )

        fork = repo.branch(BRANCH, at=f"main@step={fork_step}")
        console.print(f"branch   {BRANCH} at main@step={fork_step} ({short(fork.commit_id)})")

        resumed = Run(LR, steps)
        repo.checkout(BRANCH, into=resumed.state())
        restored = dict(resumed.model.state_dict())
        same = _same_tensors(at_fork, restored)
        console.print(
            f"restore  {BRANCH} into a fresh model: {len(restored)} tensors "
            + ("[green]bit-identical[/] to step" if same else "[red]DIFFERENT from step[/]")
            + f" {fork_step}",
            highlight=False,
        )
        if not same:
            raise RuntimeError("checkout(into=...) did not restore the committed model")

        resumed.set_lr(LR_HIGH)
        branch_steps = range(fork_step + 1, steps + 1)
        branch_commits, _ = _train(repo, resumed, branch_steps, every, branch=BRANCH, lr=LR_HIGH)
        console.print(
            f"{BRANCH}  {len(branch_steps)} more steps at lr {LR_HIGH:g}: {len(branch_commits)} commits",
            highlight=False,
        )

        console.print()
        console.print(_log_table("log main", repo.log("main")))
        console.print()
        console.print(_log_table(f"log {BRANCH}", repo.log(BRANCH)))
        # Commits from the loop store their chunks raw; the encoding (byte-grouped zstd,
        # deltas against the parent) runs later, between commits when a core is spare, or here.
        packed = repo.repack()
        console.print()
        console.print(
            f"repack   encoded the {packed.chunks_encoded} chunks the commits stored raw "
            f"({packed.delta_chunks} as deltas against their parent): "
            f"{_mib(packed.bytes_before)} -> {_mib(packed.bytes_after)}",
            highlight=False,
        )
        stats = repo.stats()
        console.print(
            f"repo     {stats.commits} commits on {stats.branches} branches: {_mib(stats.logical_bytes)} of state\n"
            f"         {_mib(stats.unique_bytes)} unique (dedup {stats.dedup_ratio:.2f}x), "
            f"{_mib(stats.stored_bytes)} stored (compression {stats.compression_ratio:.2f}x)\n"
            f"         saved: {_mib(stats.dedup_saved_bytes)} by dedup, {_mib(stats.compression_saved_bytes)} "
            f"by compression, {_mib(stats.delta_saved_bytes)} by delta encoding",
            highlight=False,
        )
    console.print(f"explore  ckpt --repo {root} log {BRANCH}", highlight=False, soft_wrap=True)
    return root


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ckptrepo.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="folder for the new repository (default: temporary)")
    parser.add_argument("--steps", type=int, default=400, help="training steps on main (default: 400)")
    parser.add_argument("--every", type=int, default=None, help="commit every N steps (default: steps // 8)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = _parse(None)
    main(args.dir, steps=args.steps, every=args.every)
