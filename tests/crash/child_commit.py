"""Crash-test child: commits deterministic states to a repository in a loop until killed.

Every state is a function of a counter (``expected_state(n)``) and each commit records
``metrics={"counter": n}``, so a parent can recompute what any visible commit must hold.
A run opens the repository (creating it if missing, with 64 KiB chunks and 256 KiB packs so
one commit spans ~129 chunks and several packs) and continues after the head of ``main``:
counter = head's counter + 1, or 0 in an empty repository. After each durable commit it
appends ``committed <n> <id>`` to its log file with one unbuffered write, which a SIGKILL
cannot take back: the log lists what the child saw acknowledged.

Modes::

    python child_commit.py run REPO LOG [COMMITS]
        One run in this process (COMMITS commits, default: until killed). Faults come from
        CKPT_FAULTS, which ckptrepo reads when it is imported.
    python child_commit.py repack REPO
        One ``repo.repack()`` of an existing repository in this process (faults as above).
    python child_commit.py index REPO
        Index the pending layouts of an existing repository, two per transaction (faults as above).
    python child_commit.py serve
        Fork server, so that dozens of runs do not each pay for importing torch: imports
        ckptrepo once (and runs no torch op, so forking is safe), then for each JSON line
        {"repo", "log", "commits", "faults"} (or {"mode": "repack" or "index", "repo", "faults"}) on stdin
        forks a child that arms CKPT_FAULTS=faults
        exactly as a fresh process would (by re-reading the variable) and does one run.
        Writes one JSON line to stdout when the child started ({"pid"}) and one when it ended
        ({"pid", "exit"} or {"pid", "signal"}). Exits at the end of stdin.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch

import ckptrepo
from ckptrepo import faults
from ckptrepo.db import pending
from ckptrepo.testing import parts

CHUNK = 64 * 1024
PACK_TARGET = 256 * 1024
_F32_PER_CHUNK = CHUNK // 4


def expected_state(n: int) -> dict[str, Any]:
    """The state committed with counter ``n``: 8 MiB + 8 bytes of tensors in 129 chunks.

    ``frozen`` (48 chunks) changes every 4th counter, ``embed`` (48 chunks) differs from a
    fixed base in one chunk, ``head`` (32 chunks) is new every time; so commits share
    chunks with their parents and write 34 or 82 new ones (after the first).
    """
    frozen = torch.randn(48 * _F32_PER_CHUNK, generator=torch.Generator().manual_seed(10_000 + n // 4))
    embed = torch.randn(48 * _F32_PER_CHUNK, generator=torch.Generator().manual_seed(7))
    k = (n * 7) % 48
    embed[k * _F32_PER_CHUNK : (k + 1) * _F32_PER_CHUNK] += n
    head = torch.randn(32 * _F32_PER_CHUNK, generator=torch.Generator().manual_seed(20_000 + n))
    return {
        "frozen": frozen,
        "embed": embed,
        "head": head,
        "step": torch.tensor(n, dtype=torch.int64),
        "meta": {"counter": n, "name": f"state-{n}"},
    }


def run(repo_path: Path, log_path: Path, commits: int | None) -> None:
    """Commit ``commits`` states (None: until killed) after the head of main."""
    if (repo_path / ".ckpt" / "config.json").exists():
        repo = ckptrepo.Repo.open(repo_path)
    else:
        repo = ckptrepo.Repo.init(repo_path, chunk_size=CHUNK, pack_target=PACK_TARGET)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        heads = [b.commit_id for b in repo.branches() if b.name == "main"]
        n = int(repo.get_commit(heads[0]).metrics["counter"]) + 1 if heads else 0
        done = 0
        while commits is None or done < commits:
            commit = repo.commit(expected_state(n), step=n, metrics={"counter": n}, message=f"counter {n}").wait()
            os.write(log, f"committed {n} {commit.id}\n".encode())
            n += 1
            done += 1
    finally:
        os.close(log)
        repo.close()


def repack(repo_path: Path) -> None:
    """Encode what the commits of ``repo_path`` stored raw (see ``Repo.repack``)."""
    with ckptrepo.Repo.open(repo_path) as repo:
        repo.repack()


def index(repo_path: Path) -> None:
    """Index the pending layouts of ``repo_path`` (``db.pending``), two per transaction."""
    with ckptrepo.Repo.open(repo_path) as repo:
        pending.index_pending(parts(repo).sessions, batch=2)


def _serve() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the child: one run, then leave without running the server's exit hooks
            code = 0
            try:
                os.environ[faults.ENV] = request.get("faults") or ""
                importlib.reload(faults)  # arms CKPT_FAULTS the way a fresh import would
                if request.get("mode") == "repack":
                    repack(Path(request["repo"]))
                elif request.get("mode") == "index":
                    index(Path(request["repo"]))
                else:
                    run(Path(request["repo"]), Path(request["log"]), request.get("commits"))
            except BaseException as exc:
                print(f"child {os.getpid()} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                code = 1
            finally:
                os._exit(code)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            print(json.dumps({"pid": pid, "signal": os.WTERMSIG(status)}), flush=True)
        else:
            print(json.dumps({"pid": pid, "exit": os.WEXITSTATUS(status)}), flush=True)


def main(argv: list[str]) -> None:
    if argv[:1] == ["serve"]:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        _serve()
    elif argv[:1] == ["repack"] and len(argv) == 2:
        repack(Path(argv[1]))
    elif argv[:1] == ["index"] and len(argv) == 2:
        index(Path(argv[1]))
    elif argv[:1] == ["run"] and len(argv) in (3, 4):
        run(Path(argv[1]), Path(argv[2]), int(argv[3]) if len(argv) == 4 else None)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
