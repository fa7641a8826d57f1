"""A commit read in place (``Repo.view``, the ``ckptrepo://`` fsspec filesystem): the files its
export writes, byte for byte, any range of them, only through verified chunks, never written."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs

import ckptrepo
from ckptrepo.errors import IntegrityError, ReadOnlyView, UnknownFile, UnknownRevision, UsageError
from ckptrepo.restore.view import CommitView, box_spans
from ckptrepo.view import CkptrepoFileSystem, parse, url

CHUNK = 4096


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {"embed.weight": torch.randn(64, 48, generator=g), "layers.0.w": torch.randn(40, 33, generator=g).half(),
            "layers.0.b": torch.randn(7, generator=g).bfloat16(), "mask": torch.rand(9, 5, generator=g) > 0.5,
            "steps": torch.arange(5, dtype=torch.int64), "empty": torch.zeros(0, 3)}


FILES = {"config.json": json.dumps({"model_type": "toy", "hidden": 48}).encode(),
         "tokenizer/vocab.txt": "\n".join(f"tok{i}" for i in range(900)).encode(), "README.md": b"# toy\n"}


@pytest.fixture
def made(tmp_path: Path, db_url: str) -> tuple[Path, str, Path]:
    """A repository whose ``main`` holds ``_state()`` and ``FILES`` (4 KiB chunks), and its HF export."""
    root = tmp_path / "repo"
    with ckptrepo.Repo.init(root, db_url=db_url, chunk_size=CHUNK) as repo:
        cid = repo.commit(_state(), files=FILES, message="toy").wait().id
        repo.export(cid, tmp_path / "export", format="hf", max_shard_size="8KB")
    return root, cid, tmp_path / "export"


def _exported(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_fsspec_lists_and_reads_exactly_the_exported_folder(made: tuple[Path, str, Path]) -> None:
    root, cid, export = made
    files = _exported(export)
    assert any(n.startswith("model-00001-of-") for n in files) and "model.safetensors.index.json" in files
    fs = CkptrepoFileSystem(max_shard_size="8KB", skip_instance_cache=True)
    base = url(str(root), "main")
    listed = {e["name"]: e for e in fs.find(base, detail=True).values()}
    assert {parse(n).file for n in listed} == set(files)
    for name, data in files.items():
        assert fs.cat_file(url(str(root), "main", name)) == data, name
        assert fs.info(url(str(root), "main", name))["size"] == len(data)
        with fs.open(url(str(root), cid[:12], name), "rb") as f:  # any revision: an id prefix too
            assert f.read() == data
    assert fs.info(url(str(root), "main", "tokenizer"))["type"] == "directory"
    vocab = url(str(root), "main", "tokenizer/vocab.txt", protocol=False)
    assert fs.ls(url(str(root), "main", "tokenizer"), detail=False) == [vocab]
    shard = next(n for n in files if n.startswith("model-"))  # negative offsets count from the end, as in fsspec
    assert fs.cat_file(url(str(root), "main", shard), -10) == files[shard][-10:]


def test_fsspec_is_registered_under_its_protocol(made: tuple[Path, str, Path]) -> None:
    root, _, export = made
    with fsspec.open(url(str(root), "main", "config.json"), "rb") as f:
        assert f.read() == (export / "config.json").read_bytes()
    fs = fsspec.filesystem("ckptrepo", repo=str(root), rev="main")  # plain paths of one view
    assert fs.cat_file("tokenizer/vocab.txt") == (export / "tokenizer" / "vocab.txt").read_bytes()


def test_safetensors_layout_is_the_flat_export(tmp_path: Path, db_url: str) -> None:
    state = _state()
    with ckptrepo.Repo.init(tmp_path / "repo", db_url=db_url, chunk_size=CHUNK) as repo:
        repo.commit(state).wait()
        repo.export("main", tmp_path / "model.safetensors")
        view = repo.view("main")  # auto: no config.json, so one model.safetensors
        assert view.layout == "safetensors" and list(view.files) == ["model.safetensors"]
        assert view.read("model.safetensors") == (tmp_path / "model.safetensors").read_bytes()
        with pytest.raises(UsageError, match="unknown view layout"):
            repo.view("main", layout="zip")


@settings(max_examples=150, deadline=None)
@given(data=hs.data())
def test_any_range_reads_the_exported_bytes(data: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    view, files = _shared_view(tmp_path_factory)
    name = data.draw(hs.sampled_from(sorted(files)))
    size = len(files[name])
    start = data.draw(hs.integers(0, size + 5))
    end = data.draw(hs.integers(start, size + 5 + 3 * CHUNK))
    assert view.read(name, start, end) == files[name][start:end]


_SHARED: dict[str, Any] = {}


def _shared_view(factory: pytest.TempPathFactory) -> tuple[CommitView, dict[str, bytes]]:
    if "view" not in _SHARED:  # one repository for every example (hypothesis reruns the body)
        tmp = factory.mktemp("ranges")
        repo = ckptrepo.Repo.init(tmp / "repo", chunk_size=CHUNK)
        repo.commit(_state(), files=FILES).wait()
        repo.export("main", tmp / "export", format="hf", max_shard_size="8KB")
        _SHARED.update(view=repo.view("main", max_shard_size="8KB", layout="hf"), files=_exported(tmp / "export"),
                       repo=repo)
    return _SHARED["view"], _SHARED["files"]


def test_sequential_small_reads_decode_each_chunk_once(tmp_path: Path) -> None:
    big = {"w": torch.randn(256, 1024)}  # 1 MiB in 16 chunks of 64 KiB
    with ckptrepo.Repo.init(tmp_path / "repo", chunk_size=64 << 10) as repo:
        repo.commit(big).wait()
        repo.export("main", tmp_path / "w.safetensors")
        expected = (tmp_path / "w.safetensors").read_bytes()
        view = repo.view("main", layout="safetensors")
        got = b"".join(view.read("model.safetensors", at, at + 8192) for at in range(0, len(expected), 8192))
        assert got == expected
        chunks = math.ceil(256 * 1024 * 4 / (64 << 10))
        assert view.cache.decoded == chunks  # read-ahead and the reads share each decode
        whole = repo.view("main", layout="safetensors")  # one large read: interior chunks straight into it
        assert whole.read("model.safetensors") == expected and whole.cache.decoded <= 2


def test_a_view_reads_on_after_repack_and_gc_at_grace_0_moved_its_chunks(tmp_path: Path, db_url: str) -> None:
    # The view looked its chunks up when it opened; repack then moved them out of a pack half
    # dead after a prune, and gc at grace 0 deleted that pack: reads go where the index says now.
    g = torch.Generator().manual_seed(5)
    kept, dropped = torch.randn(64, 256, generator=g), torch.randn(64, 256, generator=g)
    with ckptrepo.Repo.init(tmp_path / "repo", db_url=db_url, chunk_size=CHUNK) as repo:
        repo.commit({"w": kept, "v": dropped}).wait()
        repo.commit({"w": kept, "u": torch.randn(64, 256, generator=g)}).wait()
        repo.export("main", tmp_path / "m.safetensors")
        expected = (tmp_path / "m.safetensors").read_bytes()
        view = repo.view("main", layout="safetensors")
        before = {loc.pack_id for loc in view._stream("w").chunks}
        assert len(repo.prune(keep_last=1).pruned) == 1
        assert repo.repack(compact_below=0.9).packs_retired > 0
        repo.gc(grace=0)
        packs = {p.stem for p in (repo.repo_dir / "store" / "packs").rglob("*.pack")}
        assert not before & packs  # the view's places are gone from the store
        assert view.read("model.safetensors") == expected
        assert b"".join(view.read("model.safetensors", at, at + 5000) for at in range(0, len(expected), 5000)) \
            == expected


def _flip_a_chunk(repo: ckptrepo.Repo, view: CommitView, entry: str) -> None:
    loc = view._stream(entry).chunks[0]
    pack = repo.repo_dir / "store" / "packs" / loc.pack_id[:2] / f"{loc.pack_id}.pack"
    raw = bytearray(pack.read_bytes())
    raw[loc.offset + loc.length // 2] ^= 0x40
    pack.write_bytes(bytes(raw))


def test_a_tampered_chunk_raises_instead_of_returning_bytes(tmp_path: Path, db_url: str) -> None:
    root = tmp_path / "repo"
    with ckptrepo.Repo.init(root, db_url=db_url, chunk_size=CHUNK) as repo:
        repo.commit(_state(), files=FILES).wait()
        view = repo.view("main", layout="hf")
        name = "model.safetensors"
        piece = next(p for p in view.files[name].pieces if p.entry == "embed.weight")
        _flip_a_chunk(repo, view, "embed.weight")
        _flip_a_chunk(repo, view, "%file/tokenizer/vocab.txt")
        with pytest.raises(IntegrityError, match=r"embed\.weight"):
            view.read(name, piece.start + 10, piece.start + 20)
        with pytest.raises(IntegrityError):
            view.read(name)  # the large-read path too
        fs = CkptrepoFileSystem(skip_instance_cache=True)
        with pytest.raises(IntegrityError):
            fs.cat_file(url(str(root), "main", "tokenizer/vocab.txt"))
        assert view.read(name, 0, 8) != b""  # the header is not stored: it reads
        assert fs.cat_file(url(str(root), "main", "config.json")) == FILES["config.json"]


def test_writes_are_refused_and_unknown_names_are_errors(made: tuple[Path, str, Path]) -> None:
    root, _, _ = made
    fs = CkptrepoFileSystem(skip_instance_cache=True)
    target = url(str(root), "main", "config.json")
    for write in (lambda: fs.open(target, "wb"), lambda: fs.open(target, "ab"), lambda: fs.pipe_file(target, b"x"),
                  lambda: fs.rm(target), lambda: fs.mkdir(url(str(root), "main", "new")), lambda: fs.touch(target),
                  lambda: fs.mv(target, target + ".bak"), lambda: fs.put_file(__file__, target)):
        with pytest.raises(ReadOnlyView) as caught:
            write()
        assert isinstance(caught.value, PermissionError) and "read-only" in str(caught.value)
    with pytest.raises(UnknownRevision):
        fs.ls(url(str(root), "no-such-branch"))
    with pytest.raises(UnknownFile) as missing:
        fs.cat_file(url(str(root), "main", "nope.bin"))
    assert isinstance(missing.value, FileNotFoundError)
    assert not fs.exists(url(str(root), "main", "nope.bin")) and fs.exists(url(str(root), "main", "config.json"))
    with pytest.raises(UsageError, match="not a ckptrepo URL"):
        fs.ls("ckptrepo:///no/revision/here")
    with pytest.raises(FileNotFoundError):
        fs.ls(url(str(root), "main", "../config.json"))


def test_urls_escape_slashes_in_revisions_and_ats_in_paths(tmp_path: Path) -> None:
    root = tmp_path / "a@b%c" / "repo"
    root.parent.mkdir()
    with ckptrepo.Repo.init(root, chunk_size=CHUNK) as repo:
        first = repo.commit({"x": torch.ones(3)}, branch="team/exp", step=5, files={"config.json": b"{}"}).wait().id
        repo.commit({"x": torch.zeros(3)}, branch="team/exp", step=6, files={"config.json": b"{}"}).wait()
    link = url(str(root), "team/exp@step=5", "config.json")
    assert "%40b%25c" in link and "team%2Fexp@step=5/config.json" in link
    assert parse(link) == (str(root), "team/exp@step=5", "config.json")
    fs = CkptrepoFileSystem(skip_instance_cache=True)
    assert fs.info(link)["commit"] == first
    assert fs.info(url(str(root), "team/exp", "config.json"))["commit"] != first


def test_a_moving_branch_stays_pinned_until_the_cache_is_invalidated(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    fs = CkptrepoFileSystem(skip_instance_cache=True)
    with ckptrepo.Repo.init(root, chunk_size=CHUNK) as repo:
        a = repo.commit({"x": torch.ones(3)}).wait().id
        assert fs.info(url(str(root), "main", "model.safetensors"))["commit"] == a
        b = repo.commit({"x": torch.zeros(3)}).wait().id
    assert fs.info(url(str(root), "main", "model.safetensors"))["commit"] == a
    fs.invalidate_cache()
    assert fs.info(url(str(root), "main", "model.safetensors"))["commit"] == b


def test_forged_file_names_never_reach_a_listing(made: tuple[Path, str, Path]) -> None:
    root, cid, _ = made
    with ckptrepo.Repo.open(root, read_only=True) as repo:
        _, skeleton, items = repo._layout(cid, files=True)
        row, chunks = items["%file/config.json"]
        for bad in ("\x1b[2J\x1b]0;owned\x07", "../../etc/passwd", "a/../../b", "/abs", "x\ny"):
            forged = {**items, "%file/" + bad: (row, chunks)}
            with pytest.raises(IntegrityError) as caught:
                CommitView(cid, skeleton, forged, repo._reader, repo._pool, layout="hf")
            assert "\x1b" not in str(caught.value) and "\n" not in str(caught.value)


@settings(max_examples=200, deadline=None)
@given(data=hs.data())
def test_box_spans_map_c_order_bytes_to_the_boxes_stream(data: Any) -> None:
    rows, cols = data.draw(hs.integers(1, 6)), data.draw(hs.integers(1, 7))
    itemsize = data.draw(hs.sampled_from([1, 2, 4]))
    row_cuts = sorted(set(data.draw(hs.lists(hs.integers(1, rows - 1), max_size=3)))) if rows > 1 else []
    col_cuts = sorted(set(data.draw(hs.lists(hs.integers(1, cols - 1), max_size=3)))) if cols > 1 else []
    boxes = [[[r0, c0], [r1 - r0, c1 - c0]] for r0, r1 in zip([0, *row_cuts], [*row_cuts, rows], strict=True)
             for c0, c1 in zip([0, *col_cuts], [*col_cuts, cols], strict=True)]
    random.Random(data.draw(hs.integers(0, 99))).shuffle(boxes)
    full = torch.arange(rows * cols * itemsize, dtype=torch.uint8).reshape(rows, cols * itemsize)
    stream = b"".join(bytes(full[r0:r0 + nr, c0 * itemsize:(c0 + nc) * itemsize].contiguous().numpy())
                      for (r0, c0), (nr, nc) in boxes)
    c_order = bytes(full.numpy())
    lo = data.draw(hs.integers(0, len(c_order) - 1))
    hi = data.draw(hs.integers(lo + 1, len(c_order)))
    got = b"".join(stream[a:b] for a, b in box_spans([rows, cols], itemsize, boxes, lo, hi))
    assert got == c_order[lo:hi]
