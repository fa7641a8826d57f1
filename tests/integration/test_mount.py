"""A commit mounted read-only through FUSE (``ckptrepo.view.mount``, ``ckpt mount``): programs that
read plain files load it in place, bit for bit; writes are refused; damage fails reads."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import ckptrepo
from ckptrepo.errors import UnknownRevision, UsageError


def _fuse_unavailable() -> str | None:
    """Why no FUSE filesystem can be mounted here, or None."""
    try:
        from ckptrepo.view.fuse_mount import load_fuse

        load_fuse()
    except UsageError as exc:
        return f"FUSE is unavailable: {exc}"
    if shutil.which("fusermount") is None and shutil.which("fusermount3") is None:
        return "FUSE is unavailable: no fusermount (Debian package fuse)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"FUSE is unavailable: /dev/fuse cannot be opened ({exc.strerror})"
    return None


needs_fuse = pytest.mark.skipif(_fuse_unavailable() is not None, reason=str(_fuse_unavailable()))


def _tiny_model_folder(folder: Path) -> None:
    """A tiny Llama with random weights and a word-level tokenizer, both built here (no download)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(folder, max_shard_size="20KB")
    vocab = {"[UNK]": 0, "[PAD]": 1, **{f"w{i}": i + 2 for i in range(62)}}
    inner = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    inner.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(folder)


@pytest.fixture
def model_repo(tmp_path: Path) -> tuple[Path, Path, str]:
    """(repository, the model folder committed, the commit id)."""
    folder = tmp_path / "model"
    _tiny_model_folder(folder)
    with ckptrepo.Repo.init(tmp_path / "repo", chunk_size=4096) as repo:
        cid = repo.commit_file(folder).id
    return tmp_path / "repo", folder, cid


@pytest.fixture
def mounted(model_repo: tuple[Path, Path, str], tmp_path: Path) -> Iterator[tuple[Path, Path, str]]:
    from ckptrepo.view import mount

    root, folder, cid = model_repo
    (tmp_path / "mnt").mkdir()
    with mount(root, "main", tmp_path / "mnt", max_shard_size="20KB") as where:
        yield where, folder, cid


@needs_fuse
def test_from_pretrained_loads_the_mounted_commit_bit_for_bit(mounted: tuple[Path, Path, str]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, folder, cid = mounted
    shards = sorted(p.name for p in where.iterdir() if p.name.startswith("model-"))
    assert len(shards) > 1 and (where / "model.safetensors.index.json").is_file()
    original = AutoModelForCausalLM.from_pretrained(folder)
    loaded = AutoModelForCausalLM.from_pretrained(where)
    assert {**loaded.config.to_dict(), "_name_or_path": ""} == {**original.config.to_dict(), "_name_or_path": ""}
    mine, theirs = loaded.state_dict(), original.state_dict()
    assert mine.keys() == theirs.keys()
    for key, value in theirs.items():
        assert mine[key].dtype == value.dtype and torch.equal(mine[key].view(torch.uint8), value.view(torch.uint8)), key
    text = "w1 w2 w61 nope w7"
    assert AutoTokenizer.from_pretrained(where)(text)["input_ids"] == AutoTokenizer.from_pretrained(folder)(text)[
        "input_ids"]
    with ckptrepo.Repo.open(where.parent / "repo", read_only=True) as repo:
        repo.export(cid, where.parent / "export", format="hf", max_shard_size="20KB")
    exported = sorted(os.listdir(where.parent / "export"))
    assert sorted(os.listdir(where)) == exported
    for name in exported:  # every file is byte for byte what the export writes
        assert (where / name).read_bytes() == (where.parent / "export" / name).read_bytes(), name
    for name in os.listdir(folder):  # and the model's own files are the folder's
        if not name.endswith((".safetensors", ".index.json")):
            assert (where / name).read_bytes() == (folder / name).read_bytes(), name


@needs_fuse
def test_safe_open_maps_a_mounted_shard_and_dcp_reads_the_folder(mounted: tuple[Path, Path, str]) -> None:
    import torch.distributed.checkpoint as dcp
    from safetensors import safe_open
    from safetensors.torch import load_file

    where, folder, _ = mounted
    expected = {k: v for p in folder.glob("*.safetensors") for k, v in load_file(p).items()}
    seen = set()
    for shard in sorted(p.name for p in where.iterdir() if p.suffix == ".safetensors"):
        with safe_open(str(where / shard), "pt") as mine:  # memory-maps the file on the mount
            for key in mine.keys():  # noqa: SIM118 - safe_open is no dict
                seen.add(key)
                assert torch.equal(mine.get_tensor(key).view(torch.uint8), expected[key].view(torch.uint8)), key
    assert seen == expected.keys()
    target = {k: torch.empty_like(v) for k, v in expected.items()}
    dcp.load(target, storage_reader=dcp.HuggingFaceStorageReader(str(where)))
    for key, value in expected.items():
        assert torch.equal(target[key].view(torch.uint8), value.view(torch.uint8)), key


@needs_fuse
def test_the_mount_refuses_writes_and_fails_damaged_reads(model_repo: tuple[Path, Path, str], tmp_path: Path) -> None:
    from ckptrepo.view import mount

    root, folder, _ = model_repo
    with ckptrepo.Repo.open(root) as repo:
        view = repo.view("main", max_shard_size="20KB")
        loc = view._stream("%file/tokenizer.json").chunks[0]
    pack = root / ".ckpt" / "store" / "packs" / loc.pack_id[:2] / f"{loc.pack_id}.pack"
    raw = bytearray(pack.read_bytes())
    raw[loc.offset + loc.length // 2] ^= 0x01
    pack.write_bytes(bytes(raw))
    (tmp_path / "mnt").mkdir()
    with mount(root, "main", tmp_path / "mnt", max_shard_size="20KB") as where:
        for attempt in (lambda: open(where / "config.json", "r+b"), lambda: open(where / "new.txt", "wb"),  # noqa: SIM115
                        lambda: os.mkdir(where / "d"), lambda: os.remove(where / "config.json")):
            with pytest.raises(OSError) as caught:
                attempt()
            assert caught.value.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
        with pytest.raises(OSError) as damaged:
            (where / "tokenizer.json").read_bytes()
        assert damaged.value.errno == errno.EIO
        assert (where / "config.json").read_bytes() == (folder / "config.json").read_bytes()
    assert not os.path.ismount(tmp_path / "mnt") and not any((tmp_path / "mnt").iterdir())


@needs_fuse
def test_a_bad_revision_or_folder_fails_before_mounting(model_repo: tuple[Path, Path, str], tmp_path: Path) -> None:
    from ckptrepo.view import mount

    root, _, _ = model_repo
    (tmp_path / "mnt").mkdir()
    with pytest.raises(UnknownRevision), mount(root, "no-such", tmp_path / "mnt"):
        pass
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(UsageError, match="not empty"), mount(root, "main", tmp_path / "full"):
        pass
    assert not os.path.ismount(tmp_path / "mnt")


@needs_fuse
def test_ckpt_mount_serves_until_interrupted_and_escapes_what_it_prints(model_repo: tuple[Path, Path, str],
                                                                         tmp_path: Path) -> None:
    root, folder, cid = model_repo
    where = tmp_path / "mnt\x1b[2Jx"
    where.mkdir()
    child = subprocess.Popen([sys.executable, "-m", "ckptrepo.cli.app", "--repo", str(root), "mount", str(where),
                              "--max-shard-size", "20KB"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not os.path.ismount(where):
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()
            time.sleep(0.05)
        assert (where / "config.json").read_bytes() == (folder / "config.json").read_bytes()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert not os.path.ismount(where)
    assert cid[:10].encode() in err and b"\x1b" not in out + err and b"\\x1b[2Jx" in err


def test_a_missing_fusepy_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptrepo.view.fuse_mount import load_fuse

    monkeypatch.setitem(sys.modules, "fuse", None)  # import fuse -> ImportError
    with pytest.raises(UsageError, match="fusepy") as caught:
        load_fuse()
    assert "libfuse2" in caught.value.hint and "ckptrepo[mount]" in caught.value.hint
