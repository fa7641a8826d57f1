"""Choosing delta bases for a commit: which earlier tensor each new tensor is a difference from.

A chunk's base is the base tensor's chunk at the same offset (policy ``parent``) or, by
default, that chunk's chain root (policy ``root``): the standalone keyframe it is itself
a delta against. With ``root`` every delta is one hop from a standalone chunk, so no read
decodes more than two chunks; ``depth`` then counts commits since the keyframe, and
``max_depth`` forces a new keyframe after that many.

By default a tensor's base is the tensor of the same name in the first parent. For a
transfer (a model initialised from another commit), a declared mapping
``{"dst.name": "src.name"}`` makes the source commit's ``src.name`` the base of
``dst.name``; without a parent, same-named tensors of the transfer source are the bases.
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy.orm import Session

from ckptrepo.chunks.store import ChunkReader
from ckptrepo.db import catalog
from ckptrepo.ingest.basecache import BaseCache
from ckptrepo.ingest.pipeline import BaseTensor, DeltaPlan


def base_sources(
    names: list[str], parent: str | None, transfer: tuple[str, dict[str, str] | None] | None
) -> dict[str, tuple[str, str]]:
    """``{name: (commit id, tensor name there)}`` for the tensors of a new commit that have a base."""
    sources: dict[str, tuple[str, str]] = {}
    if parent is not None:
        sources.update((n, (parent, n)) for n in names)
    if transfer is not None:
        source, mapping = transfer
        if mapping:
            wanted = set(names)
            sources.update((dst, (source, src)) for dst, src in mapping.items() if dst in wanted)
        elif parent is None:
            sources.update((n, (source, n)) for n in names)
    return sources


def delta_plan(
    session: Session,
    names: list[str],
    parent: str | None,
    transfer: tuple[str, dict[str, str] | None] | None,
    *,
    reader: ChunkReader,
    cache: BaseCache,
    max_depth: int,
    policy: str = "root",
    restore: bool = False,
) -> DeltaPlan:
    """The bases of ``names`` (see ``base_sources``) with their chunk locations, and every
    location their delta chains need, read in a few queries. ``restore``: a base at
    ``max_depth`` is stored again standalone instead of its new chunk (``DeltaPlan``)."""
    sources = base_sources(names, parent, transfer)
    by_commit: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for name, (commit, there) in sources.items():
        by_commit[commit][there].append(name)
    tensors: dict[str, BaseTensor] = {}
    for commit, wanted in by_commit.items():
        for there, (row, chunks) in catalog.tensors_of(session, commit, sorted(wanted)).items():
            base = BaseTensor(row.dtype, row.chunk_size, chunks, boxed=row.boxes is not None)
            for name in wanted[there]:
                tensors[name] = base
    chain = reader.bases_for(loc for base in tensors.values() for loc in base.chunks)
    return DeltaPlan(tensors=tensors, reader=reader, chain=chain, cache=cache, max_depth=max_depth, policy=policy,
                     restore=restore)
