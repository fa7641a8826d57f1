"""Crash-test child: a small training loop under a ``Checkpointer`` that resumes where it stopped.

The loop draws from every source of randomness a real one does: dropout (torch), a shuffled
``StatefulDataLoader`` with two workers, noise from numpy's global generator and a scale from
python's ``random``; AdamW and a step scheduler carry state. It commits every 5 steps and
prints ``step N`` after each step.

    python train_child.py REPO OUT STEPS
        Resume from REPO's ``main`` (a fresh run when it has no commit), train until STEPS
        completed steps, then save the model's state to OUT with torch.save.

Run as one rank of several (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set), it
joins a gloo group, trains a DDP model on its ``DistributedSampler`` share (3 batches per
epoch: some commits fall on an epoch's end) with its own seeds, commits on every rank, and
saves to OUT with ``.rank<N>`` appended.
"""

from __future__ import annotations

import os
import random
import sys
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader

from ckptrepo import Checkpointer
from ckptrepo.policy import Every


def main(repo: str, out: str, steps: int) -> None:
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
        out = f"{out}.rank{rank}"
    torch.manual_seed(0)  # the same initial weights on every rank
    size = 48 if world > 1 else 64
    data = torch.utils.data.TensorDataset(torch.randn(size, 16), torch.randn(size, 4))
    model: torch.nn.Module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                                 torch.nn.Linear(32, 4))
    sampler = None
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
        sampler = torch.utils.data.distributed.DistributedSampler(data, shuffle=True, seed=3)
    torch.manual_seed(10 + rank)  # each rank's own dropout masks
    random.seed(1 + rank)
    np.random.seed(2 + rank)
    loader = StatefulDataLoader(data, batch_size=8, shuffle=sampler is None, sampler=sampler, num_workers=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)
    with Checkpointer(repo, model=model, optimizer=opt, scheduler=sched, dataloader=loader,
                      policy=Every(5)) as ckpt:
        step = ckpt.resume()
        while step < steps:
            if sampler is not None:
                sampler.set_epoch(step // len(loader))
            for x, y in loader:
                noise = torch.from_numpy(np.random.standard_normal(x.shape).astype(np.float32))
                x = x + random.random() * 0.1 * noise
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
                step += 1
                ckpt.after_step(step, {"loss": loss.item()})
                print(f"step {step}", flush=True)
                if step == steps:
                    break
    torch.save(model.state_dict(), out)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
