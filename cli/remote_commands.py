"""Commands for remotes and tiers: ``remote add|list|remove``, ``push``, ``fetch``, ``pull``, ``clone``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

import ckptrepo
from ckptrepo import errors
from ckptrepo.types import FetchResult, PushResult, RefUpdate, short_id

from . import render, terminal
from .options import (
    CloneDataOpt,
    CloneDirArg,
    CloneUrlArg,
    FetchAllDataOpt,
    FetchDataOpt,
    JsonOpt,
    OptionalRemoteArg,
    PullBranchArg,
    PushAllOpt,
    PushForceOpt,
    PushRefsArg,
    RemoteNameArg,
    RemoteUrlArg,
    ReplicateOpt,
)
from .session import current

if TYPE_CHECKING:
    from ckptrepo.types import RemoteInfo


def remote_add(name: RemoteNameArg, url: RemoteUrlArg, replicate: ReplicateOpt = False,
               as_json: JsonOpt = False) -> None:
    """Add remote NAME at URL (nothing is read or written there until a push or fetch)."""
    with current().open() as repo:
        info = repo.add_remote(name, url, replicate=replicate)
    if as_json:
        render.emit_json(info.to_json())
    else:
        render.out.print(f"added remote {terminal.one_line(info.name)}: {_describe(info)}", markup=False)


def remote_list(as_json: JsonOpt = False) -> None:
    """List the remotes and where their branches were at the last fetch or push."""
    with current().open() as repo:
        remotes = repo.remotes
        tracking = repo.remote_branches()
    if as_json:
        render.emit_json([{**r.to_json(), "branches": {t.name.partition("/")[2]: t.commit_id for t in tracking
                                                       if t.name.startswith(f"{r.name}/")}} for r in remotes])
        return
    if not remotes:
        render.out.print("no remotes: `ckpt remote add NAME URL` adds one", markup=False)
    for r in remotes:
        render.out.print(f"{terminal.one_line(r.name)}\t{_describe(r)}", markup=False)
        for t in tracking:
            if t.name.startswith(f"{r.name}/"):
                render.out.print(f"  {terminal.one_line(t.name)}\t{short_id(t.commit_id)}", markup=False)


def remote_remove(name: RemoteNameArg, as_json: JsonOpt = False) -> None:
    """Remove remote NAME and its remote-tracking refs (nothing on the remote changes)."""
    with current().open() as repo:
        info = repo.remove_remote(name)
    if as_json:
        render.emit_json(info.to_json())
    else:
        render.out.print(f"removed remote {terminal.one_line(info.name)}", markup=False)


def _describe(info: RemoteInfo) -> str:
    marks = [m for m, on in (("replicates", info.replicate), ("lazy", info.lazy)) if on]
    return terminal.one_line(info.url) + (f" ({', '.join(marks)})" if marks else "")


def push(remote: OptionalRemoteArg = None, refs: PushRefsArg = None, all_refs: PushAllOpt = False,
         force: PushForceOpt = False, as_json: JsonOpt = False) -> None:
    """Send branches and tags, with every commit they reach, to REMOTE.

    Uploads only the chunks the remote lacks, then the manifests, then moves each remote ref by
    compare-and-swap: a branch that would not fast-forward, or that moved on the remote
    meanwhile, is refused (exit 4) unless --force, and nothing of it becomes visible there."""
    if all_refs and refs:
        raise errors.UsageError("--all and REF... do not go together", hint="Give refs, or --all for every one.")
    with current().open() as repo:
        result = repo.push(remote, refs or None, all=all_refs, force=force)
    if as_json:
        render.emit_json(result.to_json())
    else:
        _print_push(result)


def _print_push(result: PushResult) -> None:
    if not result.refs:
        render.out.print(f"Everything up to date on {terminal.one_line(result.remote)}", markup=False)
        return
    for line in _ref_lines(result.refs):
        render.out.print(line, markup=False)
    render.out.print(f"{result.commits} commit(s), {result.packs} pack(s), {result.chunks} chunk(s): "
                     f"{render.size(result.bytes_uploaded)} uploaded to {terminal.one_line(result.remote)} "
                     f"in {result.seconds:.1f} s", markup=False)


def _ref_lines(moved: tuple[RefUpdate, ...]) -> list[str]:
    lines = []
    for r in moved:
        name = terminal.one_line(r.name)
        if r.old is None:
            lines.append(f" * [new {r.kind}] {name} -> {short_id(r.new or '')}")
        elif r.new is None:
            lines.append(f" - [deleted] {name} (was {short_id(r.old)})")
        else:
            lines.append(f"   {short_id(r.old)}..{short_id(r.new)} {name}" + (" (forced)" if r.forced else ""))
    return lines


def fetch(remote: OptionalRemoteArg = None, data: FetchDataOpt = None, all_data: FetchAllDataOpt = False,
          as_json: JsonOpt = False) -> None:
    """Bring REMOTE's new commits (their lineage, checked) and set remote-tracking refs REMOTE/BRANCH.

    Tensor bytes stay on the remote until a commit is first read (then they are kept here);
    --data REV downloads a commit's now, --all-data every commit's."""
    with current().open() as repo:
        result = repo.fetch(remote, data=True if all_data else list(data or []))
    if as_json:
        render.emit_json(result.to_json())
    else:
        _print_fetch(result)


def _print_fetch(result: FetchResult) -> None:
    for line in _ref_lines(result.refs):
        render.out.print(line, markup=False)
    text = (f"{result.commits} new commit(s) from {terminal.one_line(result.remote)}, "
            f"{render.size(result.bytes_downloaded)} read in {result.seconds:.1f} s")
    if result.pruned:
        text += f"; {result.pruned} pruned there"
    if result.data_chunks:
        text += f"; {result.data_chunks} chunk(s) of tensor bytes kept ({render.size(result.data_bytes)})"
    render.out.print(text, markup=False)
    for why in result.skipped:
        render.err.print(f"skipped: {terminal.one_line(why)}", markup=False)
    if not result.ok:
        raise errors.IntegrityError(f"{len(result.skipped)} object(s) of the remote could not be used",
                                    hint="Everything else was fetched; `ckpt verify` on the remote's own repository "
                                    "or its owner can repair them.")


def pull(remote: OptionalRemoteArg = None, branch: PullBranchArg = None, as_json: JsonOpt = False) -> None:
    """Fetch REMOTE, then fast-forward BRANCH to REMOTE/BRANCH (diverged branches are refused, exit 4)."""
    with current().open() as repo:
        result = repo.pull(remote, branch)
    if as_json:
        render.emit_json(result.to_json())
        return
    _print_fetch(result.fetch)
    name = terminal.one_line(result.branch)
    if result.old == result.new:
        render.out.print(f"{name} is up to date", markup=False)
    else:
        old = short_id(result.old) if result.old else "(new)"
        render.out.print(f"{name}: {old}..{short_id(result.new or '')} (fast-forward)", markup=False)


def clone(url: CloneUrlArg, directory: CloneDirArg = None, data: CloneDataOpt = "lazy",
          as_json: JsonOpt = False) -> None:
    """Make a new repository in DIR holding the lineage of the remote at URL (its branches as origin/BRANCH).

    DIR defaults to the URL's last part (a trailing .ckpt left out) in the current folder, which
    must then be missing or empty. The remote's default branch (main, else the first) becomes the
    current branch. With --data lazy (the default) tensor bytes are read from the remote at their
    first use and kept; --data full downloads them all now."""
    if data not in ("lazy", "full"):
        raise errors.UsageError(f"--data {data!r} is neither lazy nor full",
                                hint="lazy reads tensor bytes from the remote at first use; full downloads them now.")
    target = directory if directory is not None else _default_target(url)
    with ckptrepo.Repo.clone(url, target, data=data) as repo:
        fetched = repo.fetched
        head, repo_dir = repo.head, repo.repo_dir
    assert fetched is not None
    if as_json:
        render.emit_json({"path": str(repo_dir.parent), "repo_dir": str(repo_dir), "branch": head,
                          "fetch": fetched.to_json()})
        return
    render.out.print(f"Cloned into {terminal.one_line(str(repo_dir.parent))}", markup=False)
    _print_fetch(fetched)
    render.out.print(f"on branch {terminal.one_line(head)}", markup=False)


def _default_dir(url: str) -> str:
    """The folder a clone of ``url`` goes to by default: the last part of its path (for
    ``s3://BUCKET/PREFIX`` the prefix's, else the bucket's), a last ``store`` and a repository's own
    ``.ckpt`` folder skipped and a trailing ``.ckpt`` left out: ``/data/run.ckpt`` -> ``run``,
    ``/work/proj/.ckpt`` -> ``proj``, ``s3://BUCKET/team/run7/store`` -> ``run7``."""
    parts = urlsplit(url) if "://" in url else None
    if parts is not None and parts.scheme.lower() != "file":
        path = Path(parts.netloc, parts.path.lstrip("/"))
    else:  # a folder: ``..`` and ``.`` count as the folders they name
        path = Path(os.path.abspath(Path(unquote(parts.path) if parts is not None else url).expanduser()))
    names = [p for p in path.parts if p not in (path.anchor, "", ".", "..")]
    if names[-1:] == ["store"]:  # a repository's store (PATH/.ckpt/store, s3://BUCKET/PROJECT/store)
        names.pop()
    if names[-1:] == [".ckpt"]:
        names.pop()
    name = names[-1].removesuffix(".ckpt") if names else ""
    if not name:
        raise errors.UsageError(f"cannot name a folder after {url!r}", hint="Give the clone's DIR.")
    return name


def _default_target(url: str) -> Path:
    """``_default_dir`` in the current folder, refused when it exists and is not empty (it may be
    the remote itself, or someone's work): an explicit DIR says where to clone then."""
    target = Path(_default_dir(url))
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise errors.UsageError(f"{target.resolve()} exists already and is not empty",
                                hint="Give the clone's DIR: `ckpt clone URL DIR`.")
    return target
