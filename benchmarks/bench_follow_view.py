"""``from_pretrained`` of a commit read in place (the FUSE mount of ``Repo.view``) against
``from_pretrained`` of the same commit exported as a folder: time.

Setup, outside every measurement: a Llama-shaped causal LM with random bf16 weights (~340 MB: 8
layers, hidden 1024, vocab 32,000, untied head; ~50 MB in quick mode) saved with
``save_pretrained``, committed with ``ckpt commit DIR`` (its config.json and generation_config.json
kept as files of the commit) and exported with ``ckpt checkout REV -o DIR --format hf``.

Peers, each ``AutoModelForCausalLM.from_pretrained(DIR)`` in a fresh process of its own every round
(transformers and torch imported before the clock starts), rounds in alternating order:

- view: DIR is the commit mounted read-only (``ckptrepo.view.mount``), a fresh mount every round
  (its chunk cache empty; the mount's own start, ~2 s of opening the repository and importing,
  is outside the clock: a mount serves many loads); every chunk read is decoded and verified.
- folder: DIR is the exported folder (in the page cache after the first round, as the
  repository's packs are).

Goal: time view / folder <= 1.3 (median over rounds, a 95% bootstrap interval beside it).

    python benchmarks/bench_follow_view.py [--quick] [--rounds 7] [--dir PATH]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bootstrap, goal_note, report, scratch_dir, wait_quiet


def setup(base: Path, quick: bool) -> int:
    """The model folder, the repository holding it (``ckpt commit``) and its export; returns the weights' bytes."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=8_000 if quick else 32_000, hidden_size=512 if quick else 1024,
                         intermediate_size=1408 if quick else 2816, num_hidden_layers=4 if quick else 8,
                         num_attention_heads=8 if quick else 16, num_key_value_heads=8 if quick else 16,
                         max_position_embeddings=256, tie_word_embeddings=False, torch_dtype="bfloat16")
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(base / "model")
    nbytes = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    ckpt = [sys.executable, "-m", "ckptrepo.cli.app", "--repo", str(base / "repo")]
    subprocess.run([*ckpt, "init", str(base / "repo")], check=True, capture_output=True)
    subprocess.run([*ckpt, "commit", str(base / "model"), "-m", "model"], check=True, capture_output=True)
    subprocess.run([*ckpt, "checkout", "main", "-o", str(base / "export"), "--format", "hf"], check=True,
                   capture_output=True)
    return nbytes


def child(folder: Path) -> None:
    """One measured load, in this fresh process: prints ``{"seconds", "checksum"}``."""
    import torch
    from transformers import AutoModelForCausalLM

    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder)
    seconds = time.perf_counter() - start
    checksum = sum(float(p.float().sum()) for p in model.parameters())  # after the clock: proves the load
    print(json.dumps({"seconds": seconds, "checksum": checksum, "dtype": str(next(model.parameters()).dtype),
                      "torch": torch.__version__}))


def _spawn(folder: Path) -> dict[str, float]:
    wait_quiet(0.15)
    done = subprocess.run([sys.executable, __file__, "--child", str(folder)], check=True, capture_output=True,
                          text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _view_round(base: Path, r: int) -> dict[str, float]:
    from ckptrepo.view import mount

    where = base / f"mnt-{r}"
    where.mkdir()
    with mount(base / "repo", "main", where):
        return _spawn(where)


def run(quick: bool, rounds: int | None = None, parent: Path | None = None) -> list[tuple[str, float, str]]:
    """The benchmark's rows (name, value, note): each peer's median load time and their ratio."""
    rounds = rounds or (1 if quick else 7)
    with scratch_dir(parent) as base:
        nbytes = setup(base, quick)
        _spawn(base / "export")  # warm-up, not counted: the export's pages and the interpreter's imports cached
        runs: dict[str, list[dict[str, float]]] = {"view": [], "folder": []}
        for r in range(rounds):
            for kind in (("view", "folder") if r % 2 == 0 else ("folder", "view")):
                runs[kind].append(_view_round(base, r) if kind == "view" else _spawn(base / "export"))
    sums = {x["checksum"] for v in runs.values() for x in v}
    if len(sums) != 1:
        raise AssertionError(f"the peers loaded different weights: checksums {sorted(sums)}")
    t = {k: statistics.median(x["seconds"] for x in v) for k, v in runs.items()}
    lo, hi = bootstrap(lambda idx: statistics.median(runs["view"][i]["seconds"] for i in idx)
                       / statistics.median(runs["folder"][i]["seconds"] for i in idx), rounds, random.Random(0))
    spread = {k: f"rounds {min(x['seconds'] for x in v):.2f}-{max(x['seconds'] for x in v):.2f} s"
              for k, v in runs.items()}
    ratio = t["view"] / t["folder"]
    return [
        ("model MB (bf16 weights)", nbytes / 1e6, f"{rounds} round(s), each load in a fresh process"),
        ("from_pretrained through the mount s", t["view"], spread["view"] + "; a fresh mount each round"),
        ("from_pretrained of the exported folder s", t["folder"], spread["folder"]),
        ("from_pretrained view / folder", ratio,
         goal_note(ratio, 1.3) + f"  [{lo:.2f}, {hi:.2f}] (95% bootstrap over rounds)"),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a ~50 MB model, one round")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir under /work)")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    rows = run(args.quick, args.rounds, args.dir)
    report("from_pretrained through the read-only view (FUSE mount) vs an exported folder", rows)
    for name, value, note in rows:
        if "/" in name:
            print(f"RATIO {name} = {value:.3f}  {note}")


if __name__ == "__main__":
    main()
