"""Repository settings, stored in ``.ckpt/config.json``: fixed at ``init``, they travel with the
repository. Settings of one process (environment variables ``CKPT_*``) are ``knobs``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ckptrepo.atomic import write_atomic
from ckptrepo.errors import FormatError, UsageError

FORMAT_VERSION = 1
REPO_DIRNAME = ".ckpt"
CONFIG_NAME = "config.json"
SQLITE_NAME = "db.sqlite"

DEFAULT_CHUNK_SIZE = 1 << 20
DEFAULT_PACK_TARGET = 64 << 20
ENCODE_MODES = ("auto", "inline", "deferred")


@dataclass
class RepoConfig:
    """What a repository is: its format, layout and where its data lives.

    ``db_url`` None means the embedded SQLite file ``.ckpt/db.sqlite``; ``store_url``
    None means the local pack store ``.ckpt/store``. ``compression`` False stores every
    chunk raw (no zstd, byte grouping or delta); ``delta`` False keeps standalone
    compression but no delta encoding; ``max_delta_depth`` bounds delta chains (a chunk
    whose base is already that deep is stored standalone, starting a new chain).
    ``delta_base`` ``"root"`` takes deltas against the parent chunk's keyframe (reads decode at
    most two chunks), ``"parent"`` against the parent chunk itself (chains of up to
    ``max_delta_depth`` hops: slightly smaller, slower to read).
    ``encode`` says when new chunks are encoded (only with ``compression``): ``"inline"``
    while committing; ``"deferred"``: commits store them raw and ``repack`` encodes them
    later; ``"auto"`` (default): asynchronous commits (from a training loop) store them raw,
    are durable at the cost of hashing and writing, and an idle-priority repack encodes
    them while the committing process has nothing else to do; blocking commits encode inline.
    """

    format_version: int = FORMAT_VERSION
    repo_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    chunk_size: int = DEFAULT_CHUNK_SIZE
    pack_target: int = DEFAULT_PACK_TARGET
    zstd_level: int = 1
    compression: bool = True
    delta: bool = True
    max_delta_depth: int = 8
    delta_base: str = "root"
    encode: str = "auto"
    db_url: str | None = None
    store_url: str | None = None

    @classmethod
    def of(cls, **settings: Any) -> RepoConfig:
        """The settings given, the default for each one given as None or left out."""
        return cls(**{name: value for name, value in settings.items() if value is not None})

    def validate(self) -> None:
        """Raise UsageError for settings no repository can work with."""
        if self.chunk_size < 4096 or self.chunk_size > (1 << 30):
            raise UsageError(f"chunk size {self.chunk_size} is out of range", hint="Use 4 KiB to 1 GiB.")
        if self.chunk_size % 64:
            raise UsageError(
                f"chunk size {self.chunk_size} is not a multiple of 64 bytes",
                hint="Pick a multiple of 64 so every dtype's elements align with chunk cuts.",
            )
        if self.pack_target < self.chunk_size:
            raise UsageError("pack target is smaller than the chunk size", hint="Raise --pack-size.")
        if not 1 <= self.max_delta_depth <= 64:
            raise UsageError(f"delta depth {self.max_delta_depth} is out of range", hint="Use 1..64.")
        if self.delta_base not in ("root", "parent"):
            raise UsageError(f"delta base {self.delta_base!r} is unknown", hint="Use 'root' or 'parent'.")
        if self.encode not in ENCODE_MODES:
            raise UsageError(f"encode mode {self.encode!r} is unknown", hint="Use 'auto', 'inline' or 'deferred'.")
        if not 1 <= self.zstd_level <= 22:
            raise UsageError(f"zstd level {self.zstd_level} is out of range", hint="Use 1..22.")

    def save(self, repo_dir: Path) -> None:
        """Write the settings to ``config.json``, atomically and durably (``atomic``)."""
        write_atomic(repo_dir / CONFIG_NAME, (json.dumps(asdict(self), indent=2, sort_keys=True) + "\n").encode())

    @classmethod
    def load(cls, repo_dir: Path) -> RepoConfig:
        """Read ``config.json``; refuse formats newer than this code."""
        path = repo_dir / CONFIG_NAME
        try:
            raw: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise FormatError(detail=f"{path} is missing") from exc
        except (OSError, ValueError) as exc:
            raise FormatError(detail=f"{path} is unreadable ({exc})") from exc
        version = raw.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise FormatError(detail=f"format version {version!r}, this ckptrepo reads up to {FORMAT_VERSION}")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})


