"""File helpers of the formats: atomic whole-file output and one-line error summaries."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

from ckptrepo.errors import UsageError


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """Yield a fresh temporary path beside ``path`` for the caller to write; then publish it.

    When the block succeeds the temporary file is fsynced, renamed over ``path`` and the
    folder fsynced; when it raises the temporary file is removed and ``path`` is untouched.
    OS errors become UsageError naming ``path``.
    """
    if not path.parent.is_dir():
        raise UsageError(f"cannot write {path}: folder {path.parent} does not exist")
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        yield tmp
        # The bytes must be durable before the name points at them, or a crash leaves a torn file.
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from e
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    # The rename itself is only durable once the folder's entry list is on disk.
    with contextlib.suppress(OSError):
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def summarize(error: BaseException) -> str:
    """A library error as one readable line (first line, ANSI escapes and padding removed)."""
    text = str(error).replace("\x1b[1m", "").replace("\x1b[0m", "").strip()
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(error).__name__)
    line = line.rstrip(".")
    return line if len(line) <= 300 else line[:297] + "..."
