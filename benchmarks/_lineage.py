"""Shared pieces of the storage benchmark's lineages: entries, the manifest cache, AdamW checkpoints.

A lineage is a list of safetensors files written into one directory, with ``manifest.json``
naming each file's branch, parent and transfer source. A directory whose manifest says it is
complete and was made with the same configuration is reused, so reruns skip training.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

MIB = 1 << 20
MANIFEST = "manifest.json"


@dataclass
class Entry:
    """One checkpoint file of the lineage; parent / transfer_from name earlier entries."""

    name: str
    file: str
    branch: str
    parent: str | None
    transfer_from: str | None
    step: int
    loss: float
    bytes: int = 0


def cached(data: Path, config: dict[str, Any]) -> tuple[list[Entry], dict[str, Any]] | None:
    """The lineage in ``data`` if its manifest is complete, made with ``config``, and every file is
    there (saying so); None when it has to be made."""
    try:
        info = json.loads((data / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not info.get("complete") or info.get("config") != config:
        return None
    entries = [Entry(**e) for e in info["entries"]]
    if not all((data / e.file).is_file() and (data / e.file).stat().st_size == e.bytes for e in entries):
        return None
    print(f"data: reusing {data} (trained in {info['train_s']:.0f} s; delete it to retrain)")
    return entries, info


class Writer:
    """Writes the lineage's files in order and, at the end, its manifest."""

    def __init__(self, data: Path, config: dict[str, Any]) -> None:
        data.mkdir(parents=True, exist_ok=True)
        (data / MANIFEST).unlink(missing_ok=True)
        self.data, self.config = data, config
        self.entries: list[Entry] = []
        self.started = time.perf_counter()

    def save(self, name: str, branch: str, parent: str | None, transfer: str | None, step: int, loss: float,
             state: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
        file = f"{len(self.entries):02d}_{name}.safetensors"
        save_file(state, str(self.data / file), metadata=metadata or {"format": "pt"})
        self.add(Entry(name, file, branch, parent, transfer, step, loss))

    def add(self, entry: Entry) -> None:
        """Record a file already written into the data directory."""
        entry.bytes = (self.data / entry.file).stat().st_size
        self.entries.append(entry)
        print(f"  {entry.name:<12} step {entry.step:5d}  loss {entry.loss:6.3f}  {entry.bytes / MIB:7.1f} MiB"
              f"  ({time.perf_counter() - self.started:5.0f} s)", flush=True)

    def finish(self, params: int, **extra: Any) -> tuple[list[Entry], dict[str, Any]]:
        info = {"complete": True, "config": self.config, "params": params,
                "train_s": time.perf_counter() - self.started, "entries": [asdict(e) for e in self.entries], **extra}
        (self.data / MANIFEST).write_text(json.dumps(info, indent=1))
        print(f"data: trained and saved in {info['train_s']:.0f} s", flush=True)
        return self.entries, info


def with_adamw_state(model_state: dict[str, torch.Tensor], named: Iterable[tuple[str, nn.Parameter]],
                     opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """``model_state`` plus the AdamW state of the named parameters the optimizer holds state for,
    as ``optim.<name>.exp_avg`` / ``.exp_avg_sq`` / ``.step``."""
    out = {k: v.detach() for k, v in model_state.items()}
    for name, p in named:
        st = opt.state.get(p)
        if st:
            out[f"optim.{name}.exp_avg"] = st["exp_avg"]
            out[f"optim.{name}.exp_avg_sq"] = st["exp_avg_sq"]
            out[f"optim.{name}.step"] = torch.as_tensor(st["step"], dtype=torch.float32).reshape(())
    return out


def train(opt: torch.optim.Optimizer, loss_of: Callable[[], torch.Tensor], steps: int) -> float:
    """``steps`` optimizer steps on ``loss_of()``; the mean loss."""
    losses = []
    for _ in range(steps):
        loss = loss_of()
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        losses.append(loss.item())
    return sum(losses) / len(losses)


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr
