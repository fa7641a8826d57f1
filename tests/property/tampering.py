"""The tamper campaign's parts: a template repository, damage to its store, and the oracle that
says what the damage may break (``test_tamper_campaign.py`` runs them).

The template is small but has every kind of store object a real repository has: packs with
live chunks, delta chains across commits, dead copies in packs gc kept for their live chunks,
pruned commits, manifests, journal entries (branches made and deleted, a tag, a retention
setting, a prune) and the store's identity. Every commit's state is captured before anything
is pruned, so a checkout is compared bit for bit whatever the damage made of its marks.

The oracle (``Template.needs``): a commit's data depends on its manifest and on every pack
holding a copy of a chunk its tensors name, or of such a chunk's delta base, transitively (a
rebuild may index any copy). A damage is *inert* when it changes no information: a flipped bit
in a pack's gap (bytes no index entry names) or in a chunk payload that still decodes to the
chunk's id (a zstd frame flag), checked by decoding. Every other damage is *effective*, and
``verify --full`` must report it.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

import ckptrepo
from ckptrepo.chunks.pack import ENTRY, HEADER, TRAILER, read_index
from ckptrepo.chunks.store import ChunkReader
from ckptrepo.config import RepoConfig
from ckptrepo.errors import CkptError
from ckptrepo.ledger import identity, journal, manifest
from ckptrepo.locations import ChunkLocation
from ckptrepo.storage import LocalBackend

CHUNK = 16 * 1024
KINDS = ("pack", "manifest", "journal", "identity")
OPS = ("flip", "truncate", "delete", "swap", "rename")


def _state(step: int, g: torch.Generator) -> dict[str, Any]:
    """A training-like state: a 3-chunk weight changing in part, a bias, an int buffer."""
    w = torch.randn(3 * CHUNK // 4, generator=torch.Generator().manual_seed(7))
    w[: CHUNK // 4] += 0.01 * step  # its first chunk changes (a delta of the parent's), the rest dedups
    return {"model": {"w": w, "b": torch.randn(64, generator=g), "n": torch.arange(step, step + 16)},
            "step": step}


@dataclass
class Template:
    """A closed repository at ``root`` (SQLite inside, or on the PostgreSQL database ``db_url``),
    every commit's state (``expected``), which were pruned, and what each commit's data needs."""

    root: Path
    db_url: str | None
    expected: dict[str, dict[str, Any]]
    pruned: set[str]
    needs: dict[str, set[str]]
    copies: dict[str, list[ChunkLocation]] = field(default_factory=dict)


def build(root: Path, db_url: str | None) -> Template:
    g = torch.Generator().manual_seed(0)
    expected: dict[str, dict[str, Any]] = {}
    with ckptrepo.Repo.init(root, db_url=db_url, chunk_size=CHUNK, pack_target=4 * CHUNK) as repo:
        for step in range(6):
            state = _state(step, g)
            expected[repo.commit(state, step=step, metrics={"loss": 1.0 / (step + 1)}).wait().id] = state
        repo.branch("exp", "main~2")
        for step in range(10, 13):
            state = _state(step, g)
            expected[repo.commit(state, branch="exp", step=step).wait().id] = state
        repo.tag("v1", "main~1")
        repo.branch("tmp", "main~3")
        repo.delete_branch("tmp")
        repo.set_retention({"keep_last": 3})
        repo.set_retention(None)
        pruned = set(repo.prune(keep_last=2).pruned)
        repo.gc(grace=0)  # drops what only pruned commits used: packs kept for live chunks hold dead copies
        report = repo.verify(full=True)
        assert pruned and report.ok, report.to_json()
    store = LocalBackend(root / ".ckpt" / "store")
    copies = {key: read_index(store, key, pack_id=key.rpartition("/")[2][:-5]) for key in store.list("packs/")}
    by_id: dict[str, set[str]] = {}
    base_of: dict[str, set[str]] = {}
    for key, entries in copies.items():
        for loc in entries:
            by_id.setdefault(loc.chunk_id, set()).add(key)
            if loc.base_id is not None:
                base_of.setdefault(loc.chunk_id, set()).add(loc.base_id)
    needs: dict[str, set[str]] = {}
    for cid in expected:
        body = manifest.read(store, cid)
        todo = [c for record in body["tensors"].values() for c in manifest.chunk_ids(record)]
        seen: set[str] = set()
        while todo:
            c = todo.pop()
            if c not in seen:
                seen.add(c)
                todo.extend(base_of.get(c, ()))
        needs[cid] = {manifest.key_of(cid)} | {k for c in seen for k in by_id.get(c, ())}
    store.close()
    return Template(root, db_url, expected, pruned, needs, copies)


@dataclass(frozen=True)
class Damage:
    """One damage: ``op`` on the ``index``-th object of ``kind`` (modulo their number); ``where``
    in [0, 1) picks the byte (flip, truncate); ``other`` the second object (swap)."""

    op: str
    kind: str
    index: int
    where: float = 0.0
    bit: int = 0
    other: int = 0


def random_damages(rng: random.Random) -> list[Damage]:
    out = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        kind = rng.choices(KINDS, weights=(5, 3, 2, 0.5))[0]
        ops = ("flip", "truncate", "delete") if kind == "identity" else OPS
        out.append(Damage(rng.choice(ops), kind, rng.randrange(1 << 16), rng.random(), rng.randrange(8),
                          rng.randrange(1 << 16)))
    return out


def _keys(store: LocalBackend, kind: str) -> list[str]:
    if kind == "identity":
        return [identity.KEY] if store.exists(identity.KEY) else []
    prefix = {"pack": "packs/", "manifest": manifest.PREFIX, "journal": journal.PREFIX}[kind]
    return sorted(store.list(prefix))


@dataclass
class Applied:
    """What damaging a store did: the keys changed (``touched``), whether any damage changed
    information (``effective``), and a description of each damage."""

    touched: set[str] = field(default_factory=set)
    effective: bool = False
    described: list[str] = field(default_factory=list)


def apply(store_dir: Path, damages: list[Damage], template: Template) -> Applied:
    """Apply ``damages`` in order, then compare the store with the template's: the keys whose
    bytes differ (or that appeared or went) are ``touched``, and the damage is ``effective``
    unless every difference is an inert flip (two swaps of one pair undo each other, too)."""
    store = LocalBackend(store_dir)
    done = Applied()
    for d in damages:
        keys = _keys(store, d.kind)
        if not keys:
            continue
        key = keys[d.index % len(keys)]
        path = store_dir / key
        data = path.read_bytes()
        if d.op == "flip" and data:
            at = int(d.where * len(data))
            flipped = bytearray(data)
            flipped[at] ^= 1 << d.bit
            path.write_bytes(bytes(flipped))
            done.described.append(f"flip bit {d.bit} of byte {at} of {key}")
        elif d.op == "truncate" or (d.op == "flip" and not data):
            path.write_bytes(data[: int(d.where * len(data))])
            done.described.append(f"truncate {key} to {int(d.where * len(data))} bytes")
        elif d.op == "delete":
            path.unlink()
            done.described.append(f"delete {key}")
        elif d.op == "swap":
            other = keys[d.other % len(keys)]
            if other == key:
                other = keys[(d.other + 1) % len(keys)]
            if other == key:
                path.unlink()
                done.described.append(f"delete {key} (nothing to swap with)")
                continue
            other_data = (store_dir / other).read_bytes()
            path.write_bytes(other_data)
            (store_dir / other).write_bytes(data)
            done.described.append(f"swap {key} and {other}")
        else:  # rename
            target = _rename_target(keys, key, d)
            dest = store_dir / target
            dest.parent.mkdir(parents=True, exist_ok=True)
            path.rename(dest)
            done.described.append(f"rename {key} to {target}")
    store.close()  # cached descriptors would read the old files
    original = template.root / ".ckpt" / "store"
    names = {p.relative_to(store_dir).as_posix() for p in store_dir.rglob("*") if p.is_file()}
    names |= {p.relative_to(original).as_posix() for p in original.rglob("*") if p.is_file()}
    for key in sorted(n for n in names if not n.startswith((".staging/", "leases/"))):
        before, after = original / key, store_dir / key
        old = before.read_bytes() if before.is_file() else None
        new = after.read_bytes() if after.is_file() else None
        if old == new:
            continue
        done.touched.add(key)
        if not (old is not None and new is not None and len(old) == len(new) and key.startswith("packs/")
                and all(_inert_flip(store, key, at, template) for at, (x, y) in enumerate(zip(old, new, strict=True))
                        if x != y)):
            done.effective = True
    store.close()
    return done


def _rename_target(keys: list[str], key: str, d: Damage) -> str:
    """Another object's key (overwriting it) or a fresh well-formed name of the same kind."""
    others = [k for k in keys if k != key]
    if others and d.other % 2:
        return others[d.other % len(others)]
    fresh = f"{d.other:064x}"[-64:]
    if d.kind == "pack":
        return f"packs/{fresh[:2]}/{fresh}.pack"
    if d.kind == "manifest":
        return manifest.key_of(fresh)
    return f"{journal.PREFIX}{d.other:020d}-{fresh[:16]}.json"


def _inert_flip(store: LocalBackend, key: str, at: int, template: Template) -> bool:
    """Whether a flipped byte of pack ``key`` changes no information: it lies in a gap no index
    entry names, or in a payload that still decodes to its chunk's id (checked by decoding)."""
    entries = template.copies.get(key)
    if entries is None:
        return False
    size = (store.root / key).stat().st_size
    index_start = size - len(entries) * ENTRY.size - TRAILER.size
    if at < HEADER.size or at >= index_start:
        return False
    hit = [loc for loc in entries if loc.offset <= at < loc.offset + loc.length]
    if not hit:
        return True  # a gap: bytes nothing reads
    known = {loc.chunk_id: loc for locs in template.copies.values() for loc in locs}
    reader = ChunkReader(store, lambda ids: {i: known[i] for i in ids if i in known})
    for loc in hit:
        try:
            reader.read(loc)
        except CkptError:
            return False
        except Exception:  # the codec choked on it: information changed
            return False
    return True


def copy_for_case(template: Template, dest: Path) -> Path:
    """A copy of the template's folder at ``dest`` (with its SQLite file; a PostgreSQL template's
    copy names the same database); returns the copy's ``.ckpt``."""
    shutil.copytree(template.root, dest, symlinks=True)
    return dest / ".ckpt"


def replace_db_url(repo_dir: Path, db_url: str | None) -> None:
    """Point the repository at ``repo_dir`` at another database."""
    replace(RepoConfig.load(repo_dir), db_url=db_url).save(repo_dir)


def commits_of(repo: ckptrepo.Repo) -> Iterator[str]:
    yield from (c.id for c in repo.log())
