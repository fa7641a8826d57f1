"""The README is executed: every Python and shell block of README.md runs, in order, in one fresh
folder, so a snippet that stops working fails the suite (``./scripts/test``).

A block may be preceded, on the line just above its opening fence, by a directive in an HTML
comment (invisible on GitHub)::

    <!-- readme-test: skip (REASON) -->            not run; the reason is required
    <!-- readme-test: prelude=NAME -->             run after PRELUDES[NAME]
    <!-- readme-test: torchrun N prelude=A|B -->   run on N ranks under torchrun (gloo, CPU), once
                                                   per prelude, each in a folder of its own; then
                                                   the block made exactly one commit per step

A block without a directive runs as it is. A Python block runs in a fresh interpreter, after its
prelude in the same namespace, compiled with README.md's line numbers (a traceback points at the
README line). A shell block runs with ``bash -ex`` after its prelude (Python, run first in the
folder, making the input files the block names), with this interpreter's ``ckpt`` first on PATH.

Preludes create only what a block takes as given (a ``model``, an optimizer, a ``train_step``,
input files); they never patch ckptrepo. Each runnable block is a test of its own, in README
order, all sharing the module's folder (the README's blocks do not depend on one another, so a
single one also runs alone with ``-k``). Together they take about a minute (slow).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
TIMEOUT_S = 240
LANGUAGES = ("python", "bash")
DIRECTIVE = re.compile(r"^<!--\s*readme-test:\s*(?P<body>.*?)\s*-->$")
FENCE = re.compile(r"^```(?P<lang>\S*)\s*$")

# A small model whose state holds the tensor names the tour reads (model/layer.0.weight,
# model/layer.4.attn.q.weight).
_MODEL = """
import torch
from torch import nn

torch.manual_seed(0)


class Attention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        weights = torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2), dim=-1)
        return weights @ self.v(x)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.attn, self.mlp = Attention(d), nn.Linear(d, d)

    def forward(self, x):
        return x + self.mlp(torch.relu(self.attn(x)))


class Net(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.layer = nn.ModuleList([nn.Linear(8, d), *(Block(d) for _ in range(4))])  # layer.0: input
        self.head = nn.Linear(d, 1)

    def forward(self, x):
        for layer in self.layer:
            x = layer(x)
        return self.head(x).squeeze(-1)
"""

# The multi-rank preludes' last lines: three training steps before the README's block runs.
_THREE_STEPS = """

def train_step():
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


step = 0
for _ in range(3):
    train_step()
    step += 1
"""

PRELUDES: dict[str, str] = {
    # The Python tour: the model, an optimizer with state, a scheduler, 3200 steps (commits at 0,
    # 500, ..., 3000 and 3200) of a train_step that sets `loss`, a distilled model's state and a
    # released safetensors file.
    "tour": _MODEL + """
from safetensors.torch import save_file

model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1000, gamma=0.5)
loss = nn.functional.mse_loss(model(torch.randn(4, 2, 8)), torch.randn(4, 2))
loss.backward()
opt.step()  # the optimizer has state from here on
opt.zero_grad()
steps = 3200


def train_step():  # cheap, as 3200 steps must be: a nudge of every weight stands in for training
    global loss
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=1e-3)
        loss = loss * 0.999
    sched.step()


new_state = {"model": Net(d=8)}
save_file(Net().state_dict(), "released.safetensors")
""",
    # The training loop: the tour's model, a dataset of 4 batches of 32, two epochs.
    "loop": _MODEL + """
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1000, gamma=0.5)
dataset = torch.utils.data.TensorDataset(torch.randn(128, 8), torch.randn(128))
total = 8
loss = torch.tensor(1.0)
""",
    # A model the Trainer takes (a module returning its loss, as the integration test's), four
    # steps with a save every two, on the CPU.
    "transformers": """
import torch
from transformers import TrainingArguments


class Regressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def forward(self, x, labels):
        return {"loss": torch.nn.functional.mse_loss(self.net(x).squeeze(-1), labels)}


model = Regressor()
args = TrainingArguments(output_dir="hf-out", max_steps=4, save_steps=2, per_device_train_batch_size=8,
                         report_to=[], use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
g = torch.Generator().manual_seed(0)
data = [{"x": x, "labels": y} for x, y in zip(torch.randn(32, 8, generator=g), torch.randn(32, generator=g))]
""",
    # A LightningModule and a loader long enough that the README's 2,000 steps take one epoch.
    "lightning": """
import lightning as L
import torch


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-2)


model = Regressor()
g = torch.Generator().manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(4096, 8, generator=g), torch.randn(4096, generator=g))
loader = torch.utils.data.DataLoader(data, batch_size=2)
""",
    # The command-line tour's inputs: a pretrained model, its later states on main and lr-high,
    # a fine-tuned Hugging Face folder and an older run's files (tensor names as in a model file).
    "cli": """
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

g = torch.Generator().manual_seed(0)
base = {"embed.weight": torch.randn(64, 16, generator=g)}
for i in range(6):
    base[f"layer.{i}.attn.q.weight"] = torch.randn(16, 16, generator=g)
    base[f"layer.{i}.mlp.weight"] = torch.randn(16, 16, generator=g)


def later(scale, names=None):
    return {k: v + scale * torch.randn(v.shape, generator=g) if names is None or k in names else v
            for k, v in base.items()}


save_file(base, "model.safetensors")
save_file(later(0.01), "step-1000.safetensors")
save_file(later(0.02), "step-3000.safetensors")
save_file(later(0.05, {"layer.4.attn.q.weight", "layer.5.mlp.weight"}), "lr-high-2000.safetensors")
Path("hf-model-folder").mkdir(exist_ok=True)
save_file(later(0.01), "hf-model-folder/model.safetensors")
Path("hf-model-folder/config.json").write_text(json.dumps({"model_type": "toy", "hidden_size": 16}))
Path("old-run").mkdir(exist_ok=True)
for n in (1, 2, 3):
    save_file(later(0.01 * n), f"old-run/ckpt-{n}.safetensors")
diverged = later(0.03)
diverged["layer.2.mlp.weight"][3, 5] = float("nan")
save_file(diverged, "step-4000.safetensors")
# A user's evaluation script: reads a safetensors file, prints its results as JSON on its last line.
Path("eval.py").write_text('''import json, sys
from safetensors.numpy import load_file
w = load_file(sys.argv[1])["embed.weight"]
print(json.dumps({"eval/loss": float(abs(w).mean())}))
''')
""",
    # A tiny causal LM and its tokenizer, built here (no download), saved as a Hugging Face folder.
    "hf": """
import torch
import tokenizers
import transformers

config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
torch.manual_seed(0)
transformers.LlamaForCausalLM(config).save_pretrained("tiny-model")
tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
tok.train_from_iterator(["the cat sat on the mat"], tokenizers.trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained("tiny-model")
""",
    # Every rank: a gloo group, the repository the README says exists (made by rank 0 first), a
    # DDP model and AdamW trained three steps, `step` counting them.
    "ddp": """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import ckptrepo

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    ckptrepo.Repo.init("runs/exp5").close()
dist.barrier()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
torch.manual_seed(1 + dist.get_rank())  # each rank its own batches; DDP averages the gradients
""" + _THREE_STEPS,
    # The same with FSDP2 (fully_shard on a 1-D CPU mesh): parameters and optimizer state are DTensors.
    "fsdp2": """
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import ckptrepo

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    ckptrepo.Repo.init("runs/exp5").close()
dist.barrier()
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
for layer in (model[0], model[2]):
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
torch.manual_seed(1 + dist.get_rank())
""" + _THREE_STEPS,
}

# After a block on every torchrun rank: leave the group together. gloo's threads may still hold
# a tensor when the interpreter finalizes and abort a rank that succeeded (see
# tests/distributed/dist_workers.py), so a rank leaves without the exit handlers; the README's
# block closed its repository, so nothing is pending then.
TORCHRUN_EPILOGUE = """
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
"""


@dataclass(frozen=True)
class Block:
    """A fenced block of README.md: its language, the README line of its first code line, its
    source and what its directive says (``skip``: the reason; ``preludes``: one run each;
    ``nproc``: ranks under torchrun, 0 for a plain run)."""

    index: int
    lang: str
    line: int
    source: str
    skip: str | None = None
    preludes: tuple[str | None, ...] = (None,)
    nproc: int = 0

    def test_id(self, prelude: str | None) -> str:
        return f"line{self.line}-{self.lang}" + (f"-{prelude}" if prelude else "")


def parse_directive(body: str, where: str) -> tuple[str | None, tuple[str | None, ...], int]:
    """A directive's ``(skip reason, preludes, ranks)``, as ``Block`` holds them; ValueError for
    anything else."""
    if body.startswith("skip"):
        reason = re.fullmatch(r"skip\s*\((?P<reason>.+)\)", body)
        if reason is None:
            raise ValueError(f"{where}: `skip` needs a reason in parentheses: {body!r}")
        return reason["reason"], (None,), 0
    preludes: tuple[str | None, ...] = (None,)
    nproc = 0
    words = body.split()
    while words:
        word = words.pop(0)
        if word == "torchrun" and words and words[0].isdigit():
            nproc = int(words.pop(0))
        elif word.startswith("prelude="):
            names = word.removeprefix("prelude=").split("|")
            unknown = [n for n in names if n not in PRELUDES]
            if unknown:
                raise ValueError(f"{where}: no prelude named {unknown} (known: {sorted(PRELUDES)})")
            preludes = tuple(names)
        else:
            raise ValueError(f"{where}: unknown directive {word!r} in {body!r}")
    if nproc and preludes == (None,):
        raise ValueError(f"{where}: a torchrun block needs a prelude that joins a process group")
    return None, preludes, nproc


def parse_readme(text: str) -> list[Block]:
    """Every fenced block of ``text`` in order, with the directive on the line above its fence.
    ValueError for a directive that is malformed or precedes no fence, and for an unclosed fence."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        directive = DIRECTIVE.match(lines[i].strip())
        if directive is not None and not (i + 1 < len(lines) and FENCE.match(lines[i + 1])):
            raise ValueError(f"README.md:{i + 1}: a readme-test directive must be just above a fence")
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"README.md:{i + 1}: the fence is never closed")
        above = DIRECTIVE.match(lines[i - 1].strip()) if i > 0 else None
        skip, preludes, nproc = parse_directive(above["body"], f"README.md:{i}") if above else (None, (None,), 0)
        source = "\n".join(lines[i + 1:end]) + "\n"
        blocks.append(Block(index=len(blocks), lang=fence["lang"], line=i + 2, source=source, skip=skip,
                            preludes=preludes, nproc=nproc))
        i = end + 1
    return blocks


BLOCKS = parse_readme(README.read_text(encoding="utf-8"))
RUNS = [pytest.param(block, prelude, id=block.test_id(prelude))
        for block in BLOCKS if block.skip is None and block.lang in LANGUAGES for prelude in block.preludes]


def test_every_block_runs_or_says_why_not() -> None:
    """Every fence is Python or bash, every directive is well formed (parse_readme raised on
    import otherwise), every skip has a reason, and the README's tours and its multi-rank block
    run (not skipped): a block cannot drop out of the test unnoticed."""
    assert BLOCKS, "README.md has no fenced blocks"
    for block in BLOCKS:
        assert block.lang in LANGUAGES, f"README.md:{block.line - 1}: {block.lang!r} is neither {LANGUAGES}"
    ran = [b for b in BLOCKS if b.skip is None]
    assert len(ran) >= len(BLOCKS) - 2, [(b.line, b.skip) for b in BLOCKS if b.skip]
    assert any(b.nproc for b in ran) and any(b.lang == "bash" for b in ran)
    assert any("Repo.init" in b.source for b in ran) and any("Checkpointer" in b.source for b in ran)


def test_directive_format() -> None:
    """How directives read: a skip with its reason, a torchrun block with its preludes, a block
    without one; a malformed or stray directive, an unknown prelude and an unclosed fence are
    errors, never a block silently run or skipped."""
    text = ("<!-- readme-test: skip (installs) -->\n```bash\npip install x\n```\n\n```python\nprint(1)\n```\n"
            "<!-- readme-test: torchrun 2 prelude=ddp|fsdp2 -->\n```python\nstep\n```\n")
    skipped, plain, ranks = parse_readme(text)
    assert (skipped.skip, skipped.lang, skipped.line) == ("installs", "bash", 3)
    assert (plain.skip, plain.preludes, plain.nproc, plain.line, plain.source) == (None, (None,), 0, 7, "print(1)\n")
    assert (ranks.preludes, ranks.nproc) == (("ddp", "fsdp2"), 2)
    for bad in ("<!-- readme-test: skip -->\n```bash\n```\n", "<!-- readme-test: prelude=nope -->\n```python\n```\n",
                "<!-- readme-test: torchrun 2 -->\n```python\n```\n", "<!-- readme-test: often -->\n```python\n```\n",
                "<!-- readme-test: skip (x) -->\n\n```python\n```\n", "```python\nx\n"):
        with pytest.raises(ValueError):
            parse_readme(bad)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fresh folder the README's blocks run in, one after another."""
    return tmp_path_factory.mktemp("readme")


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the generated scripts go (outside the README's folder)."""
    return tmp_path_factory.mktemp("readme-scripts")


def environment() -> dict[str, str]:
    """This interpreter's ``ckpt`` first on PATH; one thread per process on this small machine."""
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "ckpt").exists():
        pytest.fail(f"no ckpt beside {sys.executable}: install the package (pip install -e .)")
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1",
            "CKPT_IDLE_REPACK": "0", "PYTHONUNBUFFERED": "1"}


def python_script(block: Block, prelude: str | None) -> str:
    """The prelude, then the block compiled as README.md from its own line on."""
    code = "\n" * (block.line - 1) + block.source
    # A block that hangs prints every thread's stack and exits before the test's timeout.
    parts = ["import faulthandler, os, sys", f"faulthandler.dump_traceback_later({TIMEOUT_S - 30}, exit=True)",
             PRELUDES[prelude] if prelude else "",
             f"exec(compile({code!r}, {str(README)!r}, 'exec'))"]
    if block.nproc:
        parts.append(TORCHRUN_EPILOGUE)
    return "\n".join(parts) + "\n"


def run(cmd: list[str], cwd: Path, what: str) -> None:
    """Run ``cmd`` in ``cwd`` in a session of its own; fail with its output if it fails, or kill
    the whole session (torchrun's ranks too) and fail if it outlasts TIMEOUT_S."""
    with subprocess.Popen(cmd, cwd=cwd, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"{what} did not finish in {TIMEOUT_S} s\nstdout:\n{tail(out)}\nstderr:\n{tail(err)}")
    if proc.returncode != 0:
        pytest.fail(f"{what} exited {proc.returncode}\nstdout:\n{tail(out)}\nstderr:\n{tail(err)}")


def tail(text: str) -> str:
    return textwrap.indent(text[-6000:], "  ")


SAVES = ("dcp.save(", "dcp.async_save(", "repo.commit(")


def one_commit_per_step(repo_dir: Path, saves: int) -> Iterator[str]:
    """What is wrong with the commits in ``repo_dir`` after a block that saves ``saves`` times,
    each at a step of its own: a step committed more than once, a commit off main, a count of
    commits other than ``saves`` (each save is one commit of all ranks, on main)."""
    import ckptrepo

    with ckptrepo.Repo.open(repo_dir, read_only=True) as repo:
        every = repo.log()
        main = repo.log("main")
    if len(every) != len(main):
        yield f"{len(every)} commits in all, {len(main)} on main"
    steps = [c.step for c in main]
    for step in sorted(set(steps), key=lambda s: -1 if s is None else s):
        if steps.count(step) != 1:
            yield f"step {step} has {steps.count(step)} commits"
    if len(steps) != saves:
        yield f"main has steps {steps[::-1]}; the block saves {saves} times"


@pytest.mark.parametrize(("block", "prelude"), RUNS)
def test_readme_block(block: Block, prelude: str | None, folder: Path, scripts: Path) -> None:
    """The block runs to its end without an error in the README's folder (after its prelude);
    a torchrun block, once per prelude on its ranks, makes exactly one commit per step."""
    what = f"README.md:{block.line} ({block.lang}{f', {prelude}' if prelude else ''})"
    script = scripts / f"block{block.index}{f'-{prelude}' if prelude else ''}"
    if block.lang == "bash":
        if prelude is not None:
            script.with_suffix(".py").write_text(PRELUDES[prelude])
            run([sys.executable, str(script.with_suffix(".py"))], folder, f"the prelude {prelude} of {what}")
        script.with_suffix(".sh").write_text(block.source)
        run(["bash", "-ex", str(script.with_suffix(".sh"))], folder, what)
        return
    script.with_suffix(".py").write_text(python_script(block, prelude))
    if not block.nproc:
        run([sys.executable, str(script.with_suffix(".py"))], folder, what)
        return
    cwd = folder / f"torchrun-{prelude}"
    cwd.mkdir()
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={block.nproc}",
         str(script.with_suffix(".py"))], cwd, what)
    problems = list(one_commit_per_step(cwd / "runs" / "exp5", sum(block.source.count(s) for s in SAVES)))
    assert not problems, f"{what}: " + "; ".join(problems)
