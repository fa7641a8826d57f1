"""Bytes a follower reads per update / TRL's encoding of the same change (int32 index + bf16 value
of every changed element, 6 bytes each): goal <= 0.7.

The writer commits with ``CKPT_FOLLOW_DELTAS=1`` (each new chunk a delta against the parent's chunk,
encoded at commit time); a follower (``Repo.follow``) applies each commit and counts the stored
bytes it actually read (``FollowUpdate.bytes_read``). The changed elements are counted bit for bit
between consecutive states.

- synthetic: a bf16 model whose updates change 1%, 2% and 5% of the elements by one unit in the
  last place (what a small learning rate does to a bf16 weight), a few updates each, all within
  one delta chain (``max_delta_depth`` 8 by default);
- keyframes: the 1% run continued over a whole chain, so one update of the run stores each chunk
  standalone (bounded chains): the ratio averaged over every update of that run, keyframe included;
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


def _changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> int:
    return sum(int((before[k].view(torch.int16) != after[k].view(torch.int16)).sum())
               for k in after if after[k].dtype == torch.bfloat16)


def _ulp_step(state: dict[str, torch.Tensor], fraction: float, gen: torch.Generator) -> None:
    for x in state.values():
        bits = x.view(torch.int16).view(-1)
        idx = torch.randperm(bits.numel(), generator=gen)[: int(bits.numel() * fraction)]
        signs = torch.randint(0, 2, (idx.numel(),), generator=gen, dtype=torch.int16) * 2 - 1
        bits[idx] += signs  # one unit in the last place, up or down in magnitude


def _run_updates(path: Path, state: dict[str, torch.Tensor], updates: int,
                 step: object) -> tuple[int, int, list[int]]:
    """Commit ``state``, then ``updates`` times: ``step(state)``, commit, follower applies.
    Returns (bytes read by the follower, TRL bytes, per-update bytes read)."""
    moved = trl = 0
    per: list[int] = []
    with ckptrepo.Repo.init(path) as repo:
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
            moved += follower.last.bytes_read
            per.append(follower.last.bytes_read)
            trl += TRL_BYTES * _changed(before, state)
    return moved, trl, per


def _synthetic(root: Path, quick: bool) -> list[tuple[str, float, str]]:
    rows = []
    elements = (8 if quick else 64) << 20
    shapes = {"embed": (elements // 4 // 1024, 1024), "mlp": (elements // 2 // 2048, 2048),
              "attn": (elements // 4 // 1024, 1024)}
    for fraction in (0.01, 0.02, 0.05):
        gen = torch.Generator().manual_seed(int(fraction * 1000))
        state = {k: (torch.randn(s, generator=gen) * 0.02).to(torch.bfloat16) for k, s in shapes.items()}
        moved, trl, _ = _run_updates(root / f"syn{fraction}", state, 3,
                                     lambda st, f=fraction, g=gen: _ulp_step(st, f, g))
        pct = round(fraction * 100)
        rows.append((f"follow.bytes_vs_trl.synthetic_{pct}pct", moved / trl,
                     f"goal <= 0.7 (follower read {moved / 3 / 2**20:.2f} MiB/update, TRL {trl / 3 / 2**20:.2f} MiB;"
                     f" bf16 model of {elements / 2**20:.0f} Mi elements, {pct}% changed by 1 ulp)"))
    if not quick:  # a whole chain: the keyframe update included
        gen = torch.Generator().manual_seed(7)
        state = {k: (torch.randn(s, generator=gen) * 0.02).to(torch.bfloat16) for k, s in shapes.items()}
        moved, trl, per = _run_updates(root / "chain", state, 9, lambda st: _ulp_step(st, 0.01, gen))
        rows.append(("follow.bytes_vs_trl.synthetic_1pct_with_keyframe", moved / trl,
                     f"info: 9 updates, one of them the chain's keyframe ({max(per) / 2**20:.1f} MiB read; "
                     f"the others {sorted(per)[len(per) // 2] / 2**20:.2f} MiB)"))
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
    steps = 3 if quick else 5
    gen = torch.Generator().manual_seed(1)

    def train_step(state: dict[str, torch.Tensor]) -> None:
        tokens = torch.randint(0, config.vocab_size, (4, 64), generator=gen)
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    state = model.state_dict()  # live views of the parameters: a step changes them in place
    moved, trl, _ = _run_updates(root / "finetune", state, steps, train_step)
    changed = trl / TRL_BYTES / steps
    return [("follow.bytes_vs_trl.finetune_lr3e-6", moved / trl,
             f"goal <= 0.7 (Llama of {params / 1e6:.0f} M bf16 parameters, AdamW lr 3e-6, {steps} steps; "
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
