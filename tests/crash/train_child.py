"""Crash-test child: a small training loop under a ``Checkpointer`` that resumes where it stopped.

The loop draws from every source of randomness a real one does: dropout (torch), a shuffled
``StatefulDataLoader`` with two workers, noise from numpy's global generator and a scale from
python's ``random``; AdamW and a step scheduler carry state. It commits every 5 steps (never at
an epoch's end: 8 batches per epoch) and prints ``step N`` after each step.

    python train_child.py REPO OUT STEPS
        Resume from REPO's ``main`` (a fresh run when it has no commit), train until STEPS
        completed steps, then save the model's state to OUT with torch.save.
"""

from __future__ import annotations

import random
import sys

import numpy as np
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from ckptrepo import Checkpointer
from ckptrepo.policy import Every


def main(repo: str, out: str, steps: int) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    random.seed(1)
    np.random.seed(2)
    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randn(64, 4))
    loader = StatefulDataLoader(data, batch_size=8, shuffle=True, num_workers=2)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)
    with Checkpointer(repo, model=model, optimizer=opt, scheduler=sched, dataloader=loader,
                      policy=Every(5)) as ckpt:
        step = ckpt.resume()
        while step < steps:
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


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
