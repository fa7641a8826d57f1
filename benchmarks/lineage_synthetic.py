"""The storage benchmark's synthetic lineage (``--lineage synthetic``): a transformer trained from scratch.

A transformer encoder (d_model 512, 6 layers, ffn 2048, vocab 8192, untied masked-LM head: 27.3M
parameters) is really trained on the CPU (2 threads) with fused AdamW on masked-token prediction
over synthetic sequences (motifs chained by a Markov process, 5% noise tokens, so every token
row sees gradients). Checkpoints are safetensors files of the model state plus the AdamW state
(``model.<param>``, ``optim.<param>.exp_avg`` / ``.exp_avg_sq`` / ``.step``):
  - ``base``: pretraining (``pretrain_steps``), with its optimizer state;
  - ``finetune``: full fine-tune continuing base's weights and optimizer on another data
    distribution, lr 1e-4, ``commits`` commits ``steps`` steps apart;
  - ``transfer``: base's encoder frozen under a NEW classification head (new tensor names,
    optimizer state for the head only), committed with ``transfer_from=`` base;
  - ``fork``: from finetune's 2nd commit with lr 3e-4.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _lineage import Entry, Writer, cached, set_lr, train, with_adamw_state
from torch import nn

MASK = 0  # token id reserved for masked positions; data tokens are 1..vocab-1


@dataclass(frozen=True)
class TrainConfig:
    d_model: int = 512
    layers: int = 6
    ffn: int = 2048
    heads: int = 8
    vocab: int = 8192
    seq: int = 32
    batch: int = 4
    classes: int = 8
    pretrain_steps: int = 30
    steps: int = 4  # training steps between two commits of a branch
    commits: int = 5  # commits per branch
    lr_pretrain: float = 5e-4
    lr_finetune: float = 1e-4
    lr_fork: float = 3e-4
    lr_transfer: float = 1e-3
    weight_decay: float = 0.01


QUICK = TrainConfig(d_model=256, layers=2, ffn=1024, vocab=4096, pretrain_steps=6, steps=2, commits=3)


class Source:
    """Synthetic sequences: motifs of ``motif_len`` tokens chained by a per-class Markov
    process, 5% of tokens replaced by noise. Learnable (motifs and transitions), and another
    seed is another distribution. With n_classes > 1 the class picks the transition matrix
    (the first class's equals the one-class source of the same seed)."""

    def __init__(self, seed: int, cfg: TrainConfig, n_classes: int = 1, motifs: int = 64, motif_len: int = 8) -> None:
        g = torch.Generator().manual_seed(seed)
        self.motifs = torch.randint(1, cfg.vocab, (motifs, motif_len), generator=g)
        self.trans = torch.softmax(3.0 * torch.randn(n_classes, motifs, motifs, generator=g), dim=-1)
        self.cfg = cfg

    def sample(self, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, (n_motifs, motif_len) = self.cfg, self.motifs.shape
        labels = torch.randint(self.trans.shape[0], (cfg.batch,), generator=g)
        n = -(-cfg.seq // motif_len)
        idx = torch.empty(cfg.batch, n, dtype=torch.long)
        idx[:, 0] = torch.randint(n_motifs, (cfg.batch,), generator=g)
        for i in range(1, n):
            idx[:, i] = torch.multinomial(self.trans[labels, idx[:, i - 1]], 1, generator=g).squeeze(1)
        tokens = self.motifs[idx].reshape(cfg.batch, -1)[:, : cfg.seq]
        noise = torch.rand(tokens.shape, generator=g) < 0.05
        tokens = torch.where(noise, torch.randint(1, cfg.vocab, tokens.shape, generator=g), tokens)
        return tokens, labels


class Encoder(nn.Module):
    def __init__(self, cfg: TrainConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Parameter(0.02 * torch.randn(cfg.seq, cfg.d_model))
        layer = nn.TransformerEncoderLayer(
            cfg.d_model, cfg.heads, cfg.ffn, dropout=0.0, batch_first=True, norm_first=True
        )
        self.layers = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(cfg.d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.norm(self.layers(self.embed(tokens) + self.pos[: tokens.shape[1]]))
        return out


class MaskedLM(nn.Module):
    def __init__(self, cfg: TrainConfig) -> None:
        super().__init__()
        self.encoder = Encoder(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab)

    def loss(self, tokens: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        mask = torch.rand(tokens.shape, generator=g) < 0.15
        mask[:, 0] = True  # never an empty selection
        hidden = self.encoder(tokens.masked_fill(mask, MASK))
        return F.cross_entropy(self.lm_head(hidden[mask]), tokens[mask])


class Classifier(nn.Module):
    """The transfer model: the (frozen) encoder under a new head with new tensor names."""

    def __init__(self, cfg: TrainConfig) -> None:
        super().__init__()
        self.encoder = Encoder(cfg)
        d = cfg.d_model
        self.cls_head = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, cfg.classes))

    def loss(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            pooled = self.encoder(tokens).mean(dim=1)
        return F.cross_entropy(self.cls_head(pooled), labels)


def adamw(params: Iterator[nn.Parameter], lr: float, cfg: TrainConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay, fused=True)


def checkpoint(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Model state (``model.`` prefix) plus AdamW state for the parameters the optimizer holds."""
    return with_adamw_state({f"model.{k}": v for k, v in model.state_dict().items()}, model.named_parameters(), opt)


def make_lineage(data: Path, cfg: TrainConfig) -> tuple[list[Entry], dict[str, Any]]:
    """Train the lineage and write its files and manifest into ``data`` (or reuse them)."""
    config = {"lineage": "synthetic", **asdict(cfg)}
    found = cached(data, config)
    if found is not None:
        return found
    torch.set_num_threads(2)
    torch.manual_seed(0)
    out = Writer(data, config)

    def train_lm(model: MaskedLM, opt: torch.optim.Optimizer, src: Source, g: torch.Generator, steps: int) -> float:
        return train(opt, lambda: model.loss(src.sample(g)[0], g), steps)

    lm = MaskedLM(cfg)
    n_params = sum(p.numel() for p in lm.parameters())
    print(f"data: training a {n_params / 1e6:.1f}M-parameter transformer encoder (d_model {cfg.d_model}, "
          f"{cfg.layers} layers, ffn {cfg.ffn}, vocab {cfg.vocab}) on 2 CPU threads into {data}", flush=True)
    pre, fine = Source(1, cfg), Source(2, cfg)
    opt = adamw(lm.parameters(), cfg.lr_pretrain, cfg)
    loss = train_lm(lm, opt, pre, torch.Generator().manual_seed(10), cfg.pretrain_steps)
    step = cfg.pretrain_steps
    out.save("base", "main", None, None, step, loss, checkpoint(lm, opt))
    base_model = copy.deepcopy(lm.state_dict())

    # finetune: continues base's weights and optimizer on another distribution, lower lr
    set_lr(opt, cfg.lr_finetune)
    g = torch.Generator().manual_seed(20)
    fork_at: tuple[dict[str, Any], dict[str, Any], int] | None = None
    parent = "base"
    for i in range(1, cfg.commits + 1):
        loss = train_lm(lm, opt, fine, g, cfg.steps)
        step += cfg.steps
        out.save(f"finetune_{i}", "finetune", parent, None, step, loss, checkpoint(lm, opt))
        parent = f"finetune_{i}"
        if i == 2:
            fork_at = copy.deepcopy(lm.state_dict()), copy.deepcopy(opt.state_dict()), step

    # transfer: base's encoder, frozen, under a new head; optimizer state for the head only
    clf = Classifier(cfg)
    clf.encoder.load_state_dict({k.removeprefix("encoder."): v for k, v in base_model.items()
                                 if k.startswith("encoder.")})
    clf.encoder.requires_grad_(False)
    topt = adamw(clf.cls_head.parameters(), cfg.lr_transfer, cfg)
    src, g = Source(1, cfg, n_classes=cfg.classes), torch.Generator().manual_seed(30)
    step = cfg.pretrain_steps
    parent_t: str | None = None
    transfer: str | None = "base"
    for i in range(1, cfg.commits + 1):
        loss = train(topt, lambda: clf.loss(*src.sample(g)), cfg.steps)
        step += cfg.steps
        out.save(f"transfer_{i}", "transfer", parent_t, transfer, step, loss, checkpoint(clf, topt))
        parent_t, transfer = f"transfer_{i}", None

    # fork: from finetune's 2nd commit, another learning rate
    assert fork_at is not None
    lm.load_state_dict(fork_at[0])
    opt.load_state_dict(fork_at[1])
    set_lr(opt, cfg.lr_fork)
    g, step, parent = torch.Generator().manual_seed(40), fork_at[2], "finetune_2"
    for i in range(1, cfg.commits + 1):
        loss = train_lm(lm, opt, fine, g, cfg.steps)
        step += cfg.steps
        out.save(f"fork_{i}", "fork", parent, None, step, loss, checkpoint(lm, opt))
        parent = f"fork_{i}"
    return out.finish(n_params)
