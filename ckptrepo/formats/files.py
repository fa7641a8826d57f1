"""The files a commit keeps beside its tensors (``Repo.commit(files=)``, ``ckpt commit DIR``).

A commit's file is an entry like a tensor (``entries.file_entry``): its bytes as a 1-D uint8
tensor, chunked, deduplicated, verified on read and covered by the commit id. Here: checking
and reading them before anything is written, and picking which files of a model folder to keep.

What is checked, whole, before a commit starts: every path (``entries.check_file_path``: relative,
plain names, no control characters), every size against ``CKPT_MAX_FILE_BYTES`` (a file that grows
while read is refused too), and that each is a regular file. Files are read as bytes and nothing
else: never imported, executed or unpickled. A folder keeps every regular file but hidden ones
(a part starting with ``.``: ``.git``, ``.cache``), the weight files the tensors were read from,
and code (``CODE_SUFFIXES`` or an executable mode bit) unless ``allow_code``; what it skips is
reported (``FolderFiles.skipped``) so that the caller can say so.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ckptrepo import knobs
from ckptrepo.entries import check_file_path, file_entry
from ckptrepo.errors import InvalidInput, UsageError

if TYPE_CHECKING:
    import torch

# Files that hold code someone would run: left out of a folder's commit unless asked for.
CODE_SUFFIXES = frozenset({
    ".py", ".pyc", ".pyo", ".pyd", ".pyx", ".so", ".dylib", ".dll", ".exe", ".sh", ".bash", ".zsh", ".bat",
    ".cmd", ".ps1", ".js", ".mjs", ".cjs", ".jar", ".whl",
})
# Pickles (torch.save files: a Trainer checkpoint's optimizer.pt, rng_state.pth, training_args.bin)
# are never kept: a commit's tensors come from weights it reads, and nothing here unpickles.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".joblib")
# Weight files of other formats beside the ones read (``pytorch_model.bin`` next to
# ``model.safetensors``): the tensors are the commit's, these would be second copies.
_OTHER_WEIGHTS = ("pytorch_model", "model", "tf_model", "flax_model", "adapter_model")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".h5", ".msgpack", ".safetensors.index.json", ".bin.index.json",
                    ".h5.index.json", ".msgpack.index.json")
CODE_HINT = "Pass allow_code=True (`ckpt commit --allow-code`) to keep them; they are stored, never run."


@dataclass
class FolderFiles:
    """What a folder's commit keeps (``kept``: relative POSIX path -> the file) and leaves
    (``skipped``: path -> why), both in path order."""

    kept: dict[str, Path] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def code(self) -> list[str]:
        """The code files left out for want of ``allow_code``."""
        return [p for p, why in self.skipped.items() if why == "code"]


def max_file_bytes() -> int:
    return knobs.get_int("MAX_FILE_BYTES")


def is_code(path: str, mode: int = 0) -> bool:
    """Whether the file at relative ``path`` (``mode``: its ``st_mode``) holds code."""
    name = path.rsplit("/", 1)[-1].lower()
    return any(name.endswith(s) for s in CODE_SUFFIXES) or bool(mode & 0o111)


def _is_other_weights(path: str) -> bool:
    if "/" in path:
        return False
    stem = path
    for suffix in _WEIGHT_SUFFIXES:
        if path.endswith(suffix):
            stem = path[: -len(suffix)]
            break
    else:
        return False
    return any(stem == base or stem.startswith(base + "-") for base in _OTHER_WEIGHTS)


def check_path(path: str) -> str:
    """``path`` when it can name a commit's file, else UsageError saying why."""
    problem = check_file_path(path) if isinstance(path, str) else "a file path must be a str"
    if problem is not None:
        raise UsageError(f"cannot keep file {path!r}: {problem}",
                         hint="Name files by relative paths such as config.json or 1_Pooling/config.json.")
    return path


def _too_big(path: str, size: int, limit: int) -> UsageError:
    return UsageError(f"file {path!r} has {size} bytes, more than CKPT_MAX_FILE_BYTES lets a commit keep ({limit})",
                      hint=f"Raise the limit with CKPT_MAX_FILE_BYTES={size} (or more), or leave the file out.")


def scan_folder(folder: Path, *, weights: Collection[str] = (), allow_code: bool = False) -> FolderFiles:
    """The files of ``folder`` (recursively) a commit of it keeps; ``weights``: the relative paths
    the tensors were read from (left out). UsageError, before any file is read, for a file over
    ``CKPT_MAX_FILE_BYTES`` or a name that cannot be kept; symbolic links to files are followed
    (a Hugging Face cache snapshot is made of them), links to folders and special files skipped."""
    out = FolderFiles()
    limit = max_file_bytes()
    root = folder.resolve()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        rel_dir = base.relative_to(root).as_posix()
        for d in sorted(dirnames):
            rel = d if rel_dir == "." else f"{rel_dir}/{d}"
            if d.startswith("."):
                out.skipped[rel + "/"] = "hidden"
                dirnames.remove(d)
            elif (base / d).is_symlink():
                out.skipped[rel + "/"] = "a link to a folder"
        dirnames.sort()
        for name in sorted(filenames):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if name.startswith("."):
                out.skipped[rel] = "hidden"
                continue
            if rel in weights:
                continue  # its tensors are the commit's
            if _is_other_weights(rel):
                out.skipped[rel] = "weights in another format"
                continue
            if rel.lower().endswith(PICKLE_SUFFIXES):
                out.skipped[rel] = "a pickle"
                continue
            try:
                info = os.stat(base / name)  # follows a link to the file it names
            except OSError:
                out.skipped[rel] = "a broken link"
                continue
            if not stat.S_ISREG(info.st_mode):
                out.skipped[rel] = "not a regular file"
                continue
            check_path(rel)
            if not allow_code and is_code(rel, info.st_mode):
                out.skipped[rel] = "code"
                continue
            if info.st_size > limit:
                raise _too_big(rel, info.st_size, limit)
            out.kept[rel] = base / name
    out.kept = dict(sorted(out.kept.items()))
    out.skipped = dict(sorted(out.skipped.items()))
    return out


def hf_folder_files(folder: Path, *, allow_code: bool = False) -> FolderFiles:
    """``scan_folder`` of a model folder, leaving out the weight files ``read_state`` reads its
    tensors from (``hf.weight_files``); nothing for a DCP folder (its files are its tensors)."""
    from ckptrepo.formats import is_dcp_folder
    from ckptrepo.formats.hf import weight_files

    if is_dcp_folder(folder):
        return FolderFiles()
    return scan_folder(folder, weights=weight_files(folder), allow_code=allow_code)


def skipped_note(found: FolderFiles) -> str | None:
    """What a user should hear about the files a folder's commit left out: the code files (and
    how to keep them), None when there are none."""
    if not found.code:
        return None
    return f"left out code files {', '.join(found.code)}. {CODE_HINT}"


def file_tensors(files: Mapping[str, bytes | bytearray | memoryview | str | os.PathLike[str]]
                 ) -> dict[str, torch.Tensor]:
    """``{entry name: uint8 tensor of the file's bytes}`` for ``files`` (relative path -> bytes or a
    path to read), every path and size checked before any file is read (UsageError naming the
    file; InvalidInput for one that cannot be read or that grew past the limit meanwhile)."""
    import torch

    limit = max_file_bytes()
    sizes: dict[str, int] = {}
    for path, value in files.items():
        check_path(path)
        if isinstance(value, (bytes, bytearray, memoryview)):
            sizes[path] = memoryview(value).nbytes
        elif isinstance(value, (str, os.PathLike)):
            try:
                info = os.stat(value)
            except OSError as exc:
                raise InvalidInput(path=str(value), reason=exc.strerror or str(exc)) from exc
            if not stat.S_ISREG(info.st_mode):
                raise InvalidInput(path=str(value), reason="it is not a regular file")
            sizes[path] = info.st_size
        else:
            raise UsageError(f"file {path!r} is given as {type(value).__name__}, not bytes or a path")
        if sizes[path] > limit:
            raise _too_big(path, sizes[path], limit)
    for path in files:
        parts = path.split("/")
        clash = next(("/".join(parts[:i]) for i in range(1, len(parts)) if "/".join(parts[:i]) in files), None)
        if clash is not None:  # a folder cannot be written where a file is
            raise UsageError(f"cannot keep both file {clash!r} and file {path!r}, which would be inside it",
                             hint="Rename one of them.")
    out: dict[str, torch.Tensor] = {}
    for path, value in files.items():
        data = bytes(value) if isinstance(value, (bytes, bytearray, memoryview)) else _read(Path(value), path, limit)
        out[file_entry(path)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else \
            torch.empty(0, dtype=torch.uint8)
    return out


def _read(source: Path, path: str, limit: int) -> bytes:
    try:
        with open(source, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise InvalidInput(path=str(source), reason=exc.strerror or str(exc)) from exc
    if len(data) > limit:
        raise _too_big(path, len(data), limit)
    return data
