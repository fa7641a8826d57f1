"""The training loop both training-overhead benchmarks run: a small decoder-only transformer
(``nn.TransformerEncoder`` with a causal mask) on synthetic tokens, AdamW, on the CPU."""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn

import ckptrepo
from ckptrepo import state as st

MIB = 1 << 20


class TinyLM(nn.Module):
    """Decoder-only transformer: token + position embeddings, pre-norm causal encoder layers, LM head."""

    def __init__(self, vocab: int, d: int, layers: int, ff: int, ctx: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(ctx, d))
        layer = nn.TransformerEncoderLayer(d, d // 64, ff, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(ctx), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens) + self.pos[: tokens.shape[1]]
        h = self.blocks(h, mask=self.mask, is_causal=True)
        return self.head(self.norm(h))  # type: ignore[no-any-return]


class Trainer:
    """The model, its AdamW optimizer and a fixed pool of synthetic token batches."""

    def __init__(self, args: argparse.Namespace) -> None:
        torch.manual_seed(0)
        self.vocab = args.vocab
        self.model = TinyLM(args.vocab, args.d_model, args.layers, 4 * args.d_model, args.ctx)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4, weight_decay=0.1)
        gen = torch.Generator().manual_seed(1)
        self.batches = [torch.randint(0, args.vocab, (args.batch, args.ctx + 1), generator=gen) for _ in range(32)]
        self.n = 0

    @classmethod
    def warmed(cls, args: argparse.Namespace, steps: int = 5) -> Trainer:
        """A trainer after ``steps`` untimed steps: AdamW's state exists, allocator and kernels warm."""
        trainer = cls(args)
        for _ in range(steps):
            trainer.step()
        return trainer

    def step(self) -> None:
        batch = self.batches[self.n % len(self.batches)]
        self.n += 1
        logits = self.model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, self.vocab), batch[:, 1:].reshape(-1))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    @property
    def state(self) -> dict[str, Any]:
        return {"model": self.model, "optim": self.opt}

    def params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def state_mib(self) -> float:
        """Bytes of the checkpointed state (model and AdamW state), MiB."""
        model = sum(t.numel() * t.element_size() for t in self.model.state_dict().values())
        optim = sum(v.numel() * v.element_size() for s in self.opt.state.values() for v in s.values()
                    if isinstance(v, torch.Tensor))
        return float(model + optim) / MIB


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """The model's size options (defaults: ~10M parameters, state ~117 MiB with AdamW)."""
    ap.add_argument("--d-model", type=int, default=320)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--ctx", type=int, default=32)
    ap.add_argument("--batch", type=int, default=2)


def prefill(repo: ckptrepo.Repo, trainer: Trainer, commits: int) -> None:
    """``commits`` commits on branch ``prefill`` of the state's tensors cut to 256 elements each
    (the same names and dtypes, one chunk each, every tensor changed each time), then a repack:
    the catalog then holds about as many rows as after that many commits of the real state
    (the largest tensors span a few chunks there), while the packs stay small."""
    tiny = {name: t.detach().reshape(-1)[:256].clone() for name, t in st.flatten(trainer.state).tensors.items()}
    for i in range(commits):
        with torch.no_grad():
            for t in tiny.values():
                t.add_(1e-3 if t.is_floating_point() else 1)
        repo.commit(tiny, branch="prefill", step=i).wait()
    if commits:
        repo.repack()
