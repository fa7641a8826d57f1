"""Crash-test child for retention: commits, prunes and collects pruned data until killed.

Every state is a function of a counter (``expected_state(n)``), recorded as the ``counter``
metric, so a parent can recompute what any commit that is not pruned must hold. Faults come
from ``CKPT_FAULTS``, which ckptrepo reads when it is imported (``ckptrepo.faults``).

    python child_prune.py commit REPO N   commit N states after the head of main (creating REPO)
    python child_prune.py prune REPO      prune(keep_last=2) once
    python child_prune.py gc REPO         gc(grace=0) once
    python child_prune.py loop REPO       commit, prune(keep_last=2), gc(grace=0), again, until killed
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import ckptrepo

CHUNK = 4096


def expected_state(n: int) -> dict[str, Any]:
    """16 chunks of new bytes per counter (``w``), one shared by all (``b``)."""
    import torch

    return {"w": torch.randn(16 * CHUNK // 4, generator=torch.Generator().manual_seed(n)),
            "b": torch.arange(64, dtype=torch.float32)}


def _open(path: Path) -> ckptrepo.Repo:
    if (path / ".ckpt" / "config.json").exists():
        return ckptrepo.Repo.open(path)
    return ckptrepo.Repo.init(path, chunk_size=CHUNK)


def commit(path: Path, count: int | None) -> None:
    with _open(path) as repo:
        heads = [b.commit_id for b in repo.branches() if b.name == "main"]
        n = int(repo.get_commit(heads[0]).metrics["counter"]) + 1 if heads else 0
        done = 0
        while count is None or done < count:
            repo.commit(expected_state(n), step=n, metrics={"counter": n}, blocking=True).wait()
            if count is None:  # the loop: retention after each commit
                repo.prune(keep_last=2)
                repo.gc(grace=0)
            n += 1
            done += 1


def main(argv: list[str]) -> None:
    mode, path = argv[0], Path(argv[1])
    if mode == "commit":
        commit(path, int(argv[2]))
    elif mode == "loop":
        commit(path, None)
    elif mode == "prune":
        with ckptrepo.Repo.open(path) as repo:
            repo.prune(keep_last=2)
    elif mode == "gc":
        with ckptrepo.Repo.open(path) as repo:
            repo.gc(grace=0)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
