"""Adaptive from a cold start (issue 46): in a fresh process, with no commit before the loop,
the first commit's one-time costs must not set the interval.

The loop: a 2.1 M-parameter MLP with AdamW (a 25 MB state), one torch thread, steps padded to
about 23 ms by the batch size (calibrated before the loop, fixed in it), 300 steps, committed by
a ``Checkpointer`` to a new repository under ``Adaptive(max_overhead=0.05)``. It runs in a child
process (this file run as a script), so nothing in it is warm. The simulated-clock version of
the same loop is ``tests/unit/test_policy.py``'s ``test_adaptive_from_a_cold_start_...``.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

STEPS = 300
STEP_S = 0.023
BUDGET = 0.05


def child(repo: Path, out: Path) -> None:
    """Run the loop; write what the policy measured and the commits it made to ``out`` (JSON)."""
    import torch
    from torch import nn

    from ckptrepo import Checkpointer
    from ckptrepo.policy import Adaptive

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))  # 2,099,200 parameters
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def train(batch: torch.Tensor) -> None:
        loss = model(batch).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def seconds(rows: int) -> float:
        batch = torch.randn(rows, 1024)
        times = []
        for _ in range(10):
            start = time.perf_counter()
            train(batch)
            times.append(time.perf_counter() - start)
        return statistics.median(times[3:])  # the first steps at a new size allocate

    small, large = seconds(16), seconds(256)
    per_row = max((large - small) / 240, 1e-6)
    batch = torch.randn(min(1024, max(8, round(16 + (STEP_S - small) / per_row))), 1024)
    policy = Adaptive(max_overhead=BUDGET)
    commits: list[tuple[int, str]] = []
    with Checkpointer(repo, model=model, optimizer=opt, policy=policy) as ckpt:
        for step in range(1, STEPS + 1):
            train(batch)
            if ckpt.after_step(step) is not None:
                commits.append((step, ckpt.last_rule or ""))
    m = policy.meter
    out.write_text(json.dumps({"commits": commits, "overhead": policy.overhead, "step_s": m.step_s,
                               "cost_s": m.cost_s, "one_time_s": m.one_time_s, "loop_s": m.loop_s,
                               "spent_s": m.spent_s, "rows": batch.shape[0]}))


def test_adaptive_commits_often_within_budget_from_a_cold_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CKPT_IDLE_REPACK"}  # the defaults a user's process has
    for attempt in range(2):  # a second run when the first went over budget: a shared machine's noise
        out = tmp_path / f"out-{attempt}.json"
        subprocess.run([sys.executable, __file__, str(tmp_path / f"repo-{attempt}"), str(out)], check=True,
                       timeout=300, env=env)
        got = json.loads(out.read_text())
        if 0 < got["overhead"] <= BUDGET:
            break
    commits = len(got["commits"])
    assert [rule for _, rule in got["commits"][:2]] == ["warm-up", "probe"], got
    assert 0 < got["overhead"] <= BUDGET, got
    # The commits that 5% of the loop's time pays for at the mean cost measured. Adaptive leaves
    # part of the budget unspent (what it keeps for a dear commit, what cheaper commits saved
    # beyond that, the interval's rounding): up to about five commits' worth in this loop. So at
    # least 10 commits when a warm commit costs at most one step of the loop (half a step on an
    # idle machine here). On a machine so loaded that commits cost more (their background phase
    # then competes for a core), 10 do not fit the budget, and the test asks for those that do.
    paid_for = BUDGET * got["loop_s"] * commits / got["spent_s"] if got["spent_s"] else math.inf
    assert commits >= min(10, math.floor(paid_for) - 5), got


if __name__ == "__main__":
    child(Path(sys.argv[1]), Path(sys.argv[2]))
