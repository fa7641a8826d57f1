"""Bytes a follower reads / TRL's encoding of the same changes (int32 index + bf16 value of every
changed element, 6 bytes each), totalled over a run of updates: goal <= 0.7.

The writer commits with ``CKPT_FOLLOW_DELTAS=1`` (each new chunk a delta against the parent's chunk,
encoded at commit time); a follower (``Repo.follow``) applies each commit and counts the stored
bytes it actually read (``FollowUpdate.bytes_read``). The changed elements are counted bit for bit
between consecutive states. Each run is ``2 * max_delta_depth + 2`` updates (the default depth, 8:
18 updates), so every chunk's chain fills up twice: the figure is the sum over the whole run,
the updates where a chain is full included (the base is then stored again standalone and the
follower still reads only the delta: ``ingest.pipeline``); the largest single update's ratio is
given beside it.

- synthetic: a bf16 model whose updates change 1%, 2% and 5% of the elements by one unit in the
  last place (what a small learning rate does to a bf16 weight);
- fine-tune: a small Llama (transformers config, random init, bf16) trained on random tokens
  on the CPU with AdamW at lr 3e-6, a commit after every step.

    python benchmarks/bench_follow_delta.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

os.environ["CKPT_FOLLOW_DELTAS"] = "1"  # before any repository is opened: the writer reads it once

import torch

import ckptrepo

TRL_BYTES = 6  # int32 index + bf16 value per changed element
DEPTH = 8  # max_delta_depth of the repositories (the default); --quick: QUICK_DEPTH
QUICK_DEPTH = 2


def _updates(depth: int) -> int:
    """Updates per run: every chain fills up twice."""
    return 2 * depth + 2


def _changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> int:
    return sum(int((before[k].view(torch.int16) != after[k].view(torch.int16)).sum())
               for k in after if after[k].dtype == torch.bfloat16)


def _ulp_step(state: dict[str, torch.Tensor], fraction: float, gen: torch.Generator) -> None:
    for x in state.values():
        bits = x.view(torch.int16).view(-1)
        idx = torch.randperm(bits.numel(), generator=gen)[: int(bits.numel() * fraction)]
        signs = torch.randint(0, 2, (idx.numel(),), generator=gen, dtype=torch.int16) * 2 - 1
        bits[idx] += signs  # one unit in the last place, up or down in magnitude


def _run_updates(path: Path, state: dict[str, torch.Tensor], updates: int, step: object,
                 depth: int) -> tuple[int, int, float]:
    """Commit ``state``, then ``updates`` times: ``step(state)``, commit, follower applies.
    Returns (bytes read by the follower, TRL bytes, the largest single update's ratio)."""
    moved = trl = 0
    worst = 0.0
    with ckptrepo.Repo.init(path, max_delta_depth=depth) as repo:
        repo.commit(state).wait()
        into = {k: torch.empty_like(v) for k, v in state.items()}
        follower = repo.follow("main", into=into, timeout=0)
        next(follower)
        for _ in range(updates):
            before = {k: v.clone() for k, v in state.items()}
            step(state)  # type: ignore[operator]
            commit = repo.commit(state).wait()
            assert next(follower).id == commit.id and follower.last is not None
            assert all(torch.equal(into[k].view(torch.int16), state[k].view(torch.int16)) for k in state)
            changed = TRL_BYTES * _changed(before, state)
            moved += follower.last.bytes_read
            trl += changed
            worst = max(worst, follower.last.bytes_read / max(1, changed))
    return moved, trl, worst


def _synthetic(root: Path, quick: bool) -> list[tuple[str, float, str]]:
    rows = []
    elements = (8 if quick else 64) << 20
    depth = QUICK_DEPTH if quick else DEPTH
    n = _updates(depth)
    shapes = {"embed": (elements // 4 // 1024, 1024), "mlp": (elements // 2 // 2048, 2048),
              "attn": (elements // 4 // 1024, 1024)}
    for fraction in (0.01, 0.02, 0.05):
        gen = torch.Generator().manual_seed(int(fraction * 1000))
        state = {k: (torch.randn(s, generator=gen) * 0.02).to(torch.bfloat16) for k, s in shapes.items()}
        moved, trl, worst = _run_updates(root / f"syn{fraction}", state, n,
                                         lambda st, f=fraction, g=gen: _ulp_step(st, f, g), depth)
        pct = round(fraction * 100)
        rows.append((f"follow.bytes_vs_trl.synthetic_{pct}pct", moved / trl,
                     f"goal <= 0.7 (total over {n} updates, max_delta_depth {depth}; largest update {worst:.2f}; "
                     f"follower read {moved / n / 2**20:.2f} MiB/update, TRL {trl / n / 2**20:.2f} MiB;"
                     f" bf16 model of {elements / 2**20:.0f} Mi elements, {pct}% changed by 1 ulp)"))
    return rows


def _finetune(root: Path, quick: bool) -> list[tuple[str, float, str]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=8000, hidden_size=256 if quick else 512, intermediate_size=688 if quick else 1376,
                         num_hidden_layers=2 if quick else 8, num_attention_heads=8, num_key_value_heads=8,
                         max_position_embeddings=256, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-6)
    depth = QUICK_DEPTH if quick else DEPTH
    steps = _updates(depth)
    gen = torch.Generator().manual_seed(1)

    def train_step(state: dict[str, torch.Tensor]) -> None:
        tokens = torch.randint(0, config.vocab_size, (4, 64), generator=gen)
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    state = model.state_dict()  # live views of the parameters: a step changes them in place
    moved, trl, worst = _run_updates(root / "finetune", state, steps, train_step, depth)
    changed = trl / TRL_BYTES / steps
    return [("follow.bytes_vs_trl.finetune_lr3e-6", moved / trl,
             f"goal <= 0.7 (total over {steps} steps, max_delta_depth {depth}; largest step {worst:.2f}; "
             f"Llama of {params / 1e6:.0f} M bf16 parameters, AdamW lr 3e-6; "
             f"{changed / params:.2%} of the elements changed per step; follower read "
             f"{moved / steps / 2**20:.2f} MiB/step, TRL {trl / steps / 2**20:.2f} MiB)")]


def run(quick: bool) -> list[tuple[str, float, str]]:
    with tempfile.TemporaryDirectory(prefix="bench-follow-") as tmp:
        return _synthetic(Path(tmp), quick) + _finetune(Path(tmp), quick)


def main() -> None:
    from _common import report

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    report("bench_follow_delta", run(parser.parse_args().quick))


if __name__ == "__main__":
    main()
