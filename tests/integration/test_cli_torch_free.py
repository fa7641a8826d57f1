"""Which ``ckpt`` commands import torch: a command that needs no tensor must not (importing torch
costs seconds per process), ``ckpt commit FILE.safetensors`` included. Each command runs in a
process of its own that reports at exit whether ``torch`` (and ``numpy``) was ever imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import ckptrepo
from ckptrepo.restore.layout import layout_of
from ckptrepo.testing import assert_states_equal, parts

PROBE = """
import atexit, sys
loaded = lambda: ",".join(m for m in ("torch", "numpy") if m in sys.modules)
atexit.register(lambda: sys.stderr.write("\\nLOADED=" + loaded() + "\\n"))
sys.argv = ["ckpt", *sys.argv[1:]]
from ckptrepo.cli.app import main
main()
"""

TORCH_FREE = [
    ["--version"],
    ["log", "-n", "20"],
    ["log", "--graph", "--all"],
    ["show", "main"],
    ["branch"],
    ["branch", "side", "main~1"],
    ["tag", "v1", "main"],
    ["lineage", "ancestors", "main"],
    ["lineage", "descendants", "main~2"],
    ["lineage", "path", "main", "side"],
    ["lineage", "merge-base", "main", "side"],
    ["best", "--metric", "loss"],
    ["stats"],
    ["diff", "main~1", "main"],
    ["history", "w"],
    ["verify"],
    ["gc", "--dry-run"],
    ["repack", "--dry-run"],
    ["repack"],
    ["prune", "--keep-last", "3", "--dry-run"],
    ["prune", "--keep-last", "3"],
    ["gc"],
    ["commit", "{file}", "-m", "imported", "--step", "9"],
    ["checkout", "side"],
    ["ui", "--help"],
]
NEEDS_TORCH = [
    ["diff", "--exact", "main~1", "main"],
    ["checkout", "main", "-o", "{out}"],
]


def _ckpt(repo: Path, args: list[str], module: str = "torch") -> tuple[bool, str]:
    """Whether ``ckpt args`` imported ``module`` (torch or numpy), and its output."""
    done = subprocess.run([sys.executable, "-c", PROBE, "--repo", str(repo), *args], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    marker = done.stderr.rstrip().rsplit("\n", 1)[-1]
    assert marker.startswith("LOADED="), done.stderr
    return module in marker.removeprefix("LOADED=").split(","), done.stdout


@pytest.fixture(scope="module")
def repo_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("torchfree")
    with ckptrepo.Repo.init(root, chunk_size=64 << 10) as repo:
        w = torch.randn(256, 256)
        for step in range(4):
            w += 0.01 * torch.randn(256, 256)
            repo.commit({"w": w, "b": torch.zeros(256)}, step=step, metrics={"loss": 1.0 / (step + 1)}).wait()
    save_file({"w": torch.randn(128, 64), "emb": torch.randn(100, 16).bfloat16()}, str(root / "file.safetensors"))
    return root


def test_commands_that_need_no_tensor_never_import_torch(repo_path: Path) -> None:
    loaded = {}
    for args in TORCH_FREE:
        args = [a.format(file=repo_path / "file.safetensors") for a in args]
        loaded[" ".join(args)] = _ckpt(repo_path, args)[0]
    assert not any(loaded.values()), [cmd for cmd, yes in loaded.items() if yes]


def test_the_quickest_commands_do_not_import_numpy_either(repo_path: Path) -> None:
    """What a shell prompt or a script polls (log, show, branch, stats) starts without numpy."""
    quick = [["--version"], ["log", "-n", "20"], ["show", "main"], ["branch"], ["stats"]]
    assert [args for args in quick if _ckpt(repo_path, args, "numpy")[0]] == []
    assert _ckpt(repo_path, ["diff", "--exact", "main~1", "main"], "numpy")[0]  # the probe sees it where it is


def test_the_probe_sees_torch_where_tensors_are_read(repo_path: Path, tmp_path: Path) -> None:
    for args in NEEDS_TORCH:
        args = [a.format(out=tmp_path / "out.pt") for a in args]
        assert _ckpt(repo_path, args)[0], args


def test_a_torch_free_commit_equals_the_torch_one(repo_path: Path, tmp_path: Path) -> None:
    """``ckpt commit FILE.safetensors`` (bytes, no torch) stores what a commit of the state
    ``read_state`` gives would store: the same tensors (ids), names and skeleton."""
    from ckptrepo.formats import read_state

    path = repo_path / "file.safetensors"
    with ckptrepo.Repo.init(tmp_path / "a") as a, ckptrepo.Repo.init(tmp_path / "b") as b:
        via_bytes = a.commit_file(path)
        via_torch = b.commit(read_state(path), blocking=True).wait()
        assert [(t.name, t.tensor_id, t.stats) for t in a.tensors(via_bytes.id)] == \
               [(t.name, t.tensor_id, t.stats) for t in b.tensors(via_torch.id)]
        skeletons = [layout_of(parts(r).reading, c.id)[1] for r, c in ((a, via_bytes), (b, via_torch))]
        assert skeletons[0] == skeletons[1]
        restored = a.checkout(via_bytes.id)
        expected = read_state(path)
        assert_states_equal(restored, expected, ordered=True)
