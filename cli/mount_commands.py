"""``ckpt mount``: one commit, read-only, at a local folder (FUSE), in the foreground.

The files are those ``ckpt checkout REV -o DIR --format hf`` would write (or one
``model.safetensors``: ``--layout``), served from the chunks as they are read
(``ckptrepo.view.fuse_mount``). fusepy and libfuse 2 are loaded only when the command runs;
missing, it fails with how to install them (exit 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ckptrepo import errors

from . import render
from .session import current
from .terminal import one_line

MountPathsArg = Annotated[list[Path], typer.Argument(
    metavar="[REPO] DIR", help="The empty folder to mount at; with two paths, the repository first (else --repo, "
                               "or the nearest .ckpt/ at or above the working folder).", show_default=False)]
MountRevOpt = Annotated[str | None, typer.Option(
    "--rev", "-r", metavar="REV", show_default=False,
    help="The commit to show: commit id or prefix, branch or tag name, REV~N, REV^N or BRANCH@step=N (resolved "
         "once, when mounting). Default: the current branch.")]
LayoutOpt = Annotated[str, typer.Option(
    "--layout", metavar="LAYOUT", help="hf: the commit's files with the model's weights as safetensors shards and "
                                       "index; safetensors: one model.safetensors; auto: hf when the commit has a "
                                       "config.json.")]
MaxShardOpt = Annotated[str, typer.Option(
    "--max-shard-size", metavar="SIZE",
    help="Largest shard of an hf layout, as save_pretrained takes it (5GB, 500MB).")]


def mount(paths: MountPathsArg, rev: MountRevOpt = None, layout: LayoutOpt = "auto",
          max_shard_size: MaxShardOpt = "5GB") -> None:
    """Mount a commit read-only at an empty folder, as the files its export would hold.

    `ckpt mount DIR --rev REV` (or `ckpt mount REPO DIR`) serves the commit
    until the folder is unmounted (`fusermount -u DIR`) or Ctrl-C: programs
    load it in place (from_pretrained(DIR), safetensors' safe_open, DCP's
    HuggingFaceStorageReader), and only the chunks they read are decoded,
    each verified. Needs fusepy and libfuse 2 (the mount extra of ckptrepo;
    Debian: `apt-get install fuse libfuse2`).
    """
    from ckptrepo.view.fuse_mount import load_fuse, serve

    if len(paths) > 2:
        raise errors.UsageError("ckpt mount takes a folder, or a repository and a folder",
                                hint="`ckpt mount DIR --rev REV`, or `ckpt mount REPO DIR --rev REV`.")
    load_fuse()  # the missing package's fix before anything else
    repo, folder = (paths[0], paths[1]) if len(paths) == 2 else (current().location(), paths[0])

    def ready(commit_id: str) -> None:
        where, named = one_line(str(folder)), one_line(rev or "the current branch")
        render.err.print(f"ckpt mount: commit {commit_id[:10]} ({named}) at {where}, read-only; Ctrl-C or "
                         f"`fusermount -u {where}` unmounts", markup=False, soft_wrap=True)

    serve(repo, rev, folder, layout=layout, max_shard_size=max_shard_size, ready=ready)
