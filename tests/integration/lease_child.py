"""Child process of the lease tests: one commit or one repack, with faults from ``CKPT_FAULTS``.

    python lease_child.py commit REPO HOW SEED OUT   # HOW: blocking, async or file; the id goes to OUT
    python lease_child.py repack REPO

A test arms ``POINT=stop`` (the child stops itself there), runs ``gc`` meanwhile and resumes it
with SIGCONT, or ``POINT=kill`` to leave what a killed writer leaves.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import ckptrepo

CHUNK = 64 * 1024
PACK_TARGET = 4 * CHUNK


def state(seed: int) -> dict[str, torch.Tensor]:
    """12 chunks of new bytes (three packs of four), and a small tensor."""
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(12 * CHUNK // 4, generator=g), "b": torch.arange(seed, seed + 16, dtype=torch.float32)}


def commit(repo_path: Path, how: str, seed: int, out: Path) -> None:
    with ckptrepo.Repo.open(repo_path) as repo:
        if how == "file":
            from safetensors.torch import save_file

            source = out.with_suffix(".safetensors")
            save_file(state(seed), str(source))
            cid = repo.commit_file(source, step=seed).id
        else:
            cid = repo.commit(state(seed), step=seed, blocking=how == "blocking").wait().id
    out.write_text(cid)


def main() -> None:
    torch.set_num_threads(1)
    if sys.argv[1] == "commit":
        commit(Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), Path(sys.argv[5]))
    else:
        with ckptrepo.Repo.open(sys.argv[2]) as repo:
            repo.repack()


if __name__ == "__main__":
    main()
