"""Whole Hugging Face model folders: `ckpt commit DIR` keeps the non-weight files, `ckpt checkout
REV -o DIR --format hf` writes a folder from_pretrained loads (tensors, config, tokenizer)."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner, Result

import ckptrepo
from ckptrepo.cli.app import app
from ckptrepo.errors import IntegrityError, UnknownFile, UsageError

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

TEXT = "the cat sat on the mat"


def _tiny_model() -> Any:
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      bos_token_id=0, eos_token_id=1, pad_token_id=2)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def _tiny_tokenizer() -> Any:
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.WordLevelTrainer(special_tokens=["[BOS]", "[EOS]", "[PAD]", "[UNK]"])
    tok.train_from_iterator([TEXT, "hello world", "a dog ran"], trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="[BOS]", eos_token="[EOS]",
                                                pad_token="[PAD]", unk_token="[UNK]")


def _folder(path: Path) -> tuple[Any, Any]:
    model, tokenizer = _tiny_model(), _tiny_tokenizer()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "README.md").write_text("# tiny\n")
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}\n')
    (path / "modeling_tiny.py").write_text("raise SystemExit('never run')\n")
    (path / ".cache").mkdir()
    (path / ".cache" / "junk").write_text("x")
    return model, tokenizer


def _assert_same_model(expected: Any, folder: Path) -> None:
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder)
    a, b = expected.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key

    def config(c: Any) -> dict[str, Any]:  # where it was loaded from; an unsaved model's dtype is unset
        return {k: v for k, v in c.to_dict().items() if k not in ("_name_or_path", "dtype")}

    assert config(loaded.config) == config(expected.config)


def _assert_same_tokenizer(expected: Any, folder: Path) -> None:
    loaded = transformers.AutoTokenizer.from_pretrained(folder)
    assert loaded(TEXT).input_ids == expected(TEXT).input_ids
    assert loaded.special_tokens_map == expected.special_tokens_map
    assert loaded.get_vocab() == expected.get_vocab()


@pytest.fixture
def cli(tmp_path: Path, db_url: str) -> Any:
    runner = CliRunner()

    def invoke(*args: str, code: int = 0) -> Result:
        result = runner.invoke(app, ["--repo", str(tmp_path / "work"), *args])
        assert result.exit_code == code, (result.stdout, result.stderr)
        return result

    invoke("init", "--db", db_url)
    return invoke


def test_commit_folder_and_checkout_hf_round_trip(tmp_path: Path, cli: Any) -> None:
    model, tokenizer = _folder(tmp_path / "src")
    result = cli("commit", str(tmp_path / "src"), "--json")
    assert "modeling_tiny.py" in result.stderr and "--allow-code" in result.stderr
    commit_id = json.loads(result.stdout)["id"]
    shown = json.loads(cli("show", commit_id, "--json").stdout)
    assert set(shown["files"]) == {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                   "README.md", "1_Pooling/config.json"}
    assert shown["files"]["config.json"] == (tmp_path / "src" / "config.json").stat().st_size
    assert not any(t["name"].startswith("%file/") for t in shown["tensors"])

    cli("checkout", commit_id, "-o", str(tmp_path / "out"), "--format", "hf")
    assert not (tmp_path / "out" / "model.safetensors.index.json").exists()
    for name in ("model.safetensors", "config.json", "tokenizer.json", "README.md", "1_Pooling/config.json"):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "src" / name).read_bytes()
    assert not (tmp_path / "out" / "modeling_tiny.py").exists() and not (tmp_path / "out" / ".cache").exists()
    _assert_same_model(model, tmp_path / "out")
    _assert_same_tokenizer(tokenizer, tmp_path / "out")

    cli("checkout", commit_id, "-o", str(tmp_path / "sharded"), "--format", "hf", "--max-shard-size", "20KB")
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and all((tmp_path / "sharded" / s).stat().st_size <= 20_000 + 4096 for s in shards)
    _assert_same_model(model, tmp_path / "sharded")
    _assert_same_tokenizer(tokenizer, tmp_path / "sharded")

    refused = cli("checkout", commit_id, "-o", str(tmp_path / "sharded"), "--format", "hf", code=2)
    assert "not an empty folder" in refused.stderr


def test_files_are_stored_once_and_diffed(tmp_path: Path, db_url: str) -> None:
    _folder(tmp_path / "src")
    with ckptrepo.Repo.init(tmp_path / "r", db_url=db_url) as repo, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        first = repo.commit_file(tmp_path / "src", allow_code=True)
        assert "modeling_tiny.py" in repo.files(first.id)
        (tmp_path / "src" / "README.md").write_text("# changed\n")
        before = repo.stats().unique_bytes
        second = repo.commit_file(tmp_path / "src", allow_code=True)
        added = repo.stats().unique_bytes - before
        assert added == len("# changed\n")  # tensors, config and tokenizer bytes all deduplicated
        assert repo.read_file(second.id, "README.md") == b"# changed\n"
        assert repo.read_file(first.id, "README.md") == b"# tiny\n"
        diff = repo.diff(first.id, second.id)
        assert diff.files == {"README.md": "changed"}
        assert all(not t.name.startswith("%file/") for t in diff.tensors)
        assert not any(n.startswith("%file/") for n in repo.checkout(second.id))
        with pytest.raises(ckptrepo.errors.UnknownTensor):
            repo.load_tensor(second.id, "%file/README.md")
        with pytest.raises(UnknownFile):
            repo.read_file(second.id, "missing.json")


def test_a_flipped_byte_in_a_file_chunk_fails_reads_and_exports(tmp_path: Path, db_url: str) -> None:
    with ckptrepo.Repo.init(tmp_path / "r", db_url=db_url) as repo:
        data = bytes(range(256)) * 40
        commit = repo.commit({"w": torch.ones(4)}, files={"config.json": b"{}", "vocab.txt": data}).wait()
        assert repo.read_file(commit.id, "vocab.txt") == data
        _, _, items = repo._layout(commit.id, ["%file/vocab.txt"], files=True)
        loc = items["%file/vocab.txt"][1][0]
        pack = repo.repo_dir / "store" / "packs" / loc.pack_id[:2] / f"{loc.pack_id}.pack"
        raw = bytearray(pack.read_bytes())
        raw[loc.offset + loc.length // 2] ^= 0x40
        pack.write_bytes(bytes(raw))
        with pytest.raises(IntegrityError):
            repo.read_file(commit.id, "vocab.txt")
        with pytest.raises(IntegrityError):
            repo.export(commit.id, tmp_path / "out", format="hf")
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["../evil", "/etc/passwd", "a/../b", "a//b", "bad\x1b[31m", "tab\there", "a\\b", ""])
def test_bad_file_names_are_refused_before_anything_is_written(tmp_path: Path, name: str) -> None:
    with ckptrepo.Repo.init(tmp_path / "r") as repo:
        with pytest.raises(UsageError):
            repo.commit({"w": torch.ones(2)}, files={name: b"x"})
        assert repo.log() == []


def test_a_file_where_another_file_needs_a_folder_is_refused(tmp_path: Path) -> None:
    with ckptrepo.Repo.init(tmp_path / "r") as repo:
        with pytest.raises(UsageError, match="inside it"):
            repo.commit({"w": torch.ones(2)}, files={"tokenizer": b"x", "tokenizer/vocab.json": b"{}"})
        assert repo.log() == []


def test_limits_code_and_no_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _folder(tmp_path / "src")
    with ckptrepo.Repo.init(tmp_path / "r") as repo:
        monkeypatch.setenv("CKPT_MAX_FILE_BYTES", "100")
        with pytest.raises(UsageError, match="CKPT_MAX_FILE_BYTES") as caught:
            repo.commit_file(tmp_path / "src")
        assert "tokenizer.json" in str(caught.value) or "config.json" in str(caught.value)
        with pytest.raises(UsageError, match=r"big\.txt.*CKPT_MAX_FILE_BYTES"):
            repo.commit({"w": torch.ones(2)}, files={"big.txt": b"x" * 101})
        assert repo.log() == []
        monkeypatch.delenv("CKPT_MAX_FILE_BYTES")
        with pytest.warns(UserWarning, match="modeling_tiny.py"):
            commit = repo.commit_file(tmp_path / "src")
        assert "modeling_tiny.py" not in repo.files(commit.id)
        nested = repo.commit({"a": {"b": torch.ones(2)}}, files={"config.json": b"{}"}).wait()
        with pytest.raises(UsageError, match="no model weights"):
            repo.export(nested.id, tmp_path / "none", format="hf")
        bare = repo.commit({"w": torch.ones(2)}).wait()
        with pytest.warns(UserWarning, match="config"):
            repo.export(bare.id, tmp_path / "bare", format="hf")
        assert sorted(os.listdir(tmp_path / "bare")) == ["model.safetensors"]


def test_checkpointer_with_model_config_exports_hf(tmp_path: Path) -> None:
    model = _tiny_model()
    tokenizer = _tiny_tokenizer()
    tokenizer.save_pretrained(tmp_path / "tok")
    files = {p.name: p for p in (tmp_path / "tok").iterdir()}
    with ckptrepo.Checkpointer(tmp_path / "r", model=model, model_config=model.config, files=files,
                               rng=False) as ck:
        ck.commit_now(1)
    with ckptrepo.Repo.open(tmp_path / "r") as repo:
        repo.export("main", tmp_path / "out", format="hf")
    assert (tmp_path / "out" / "config.json").read_text() == model.config.to_json_string()
    _assert_same_model(model, tmp_path / "out")
    _assert_same_tokenizer(tokenizer, tmp_path / "out")


@pytest.mark.slow
def test_trainer_callback_commits_export_hf(tmp_path: Path) -> None:
    from ckptrepo.integrations.transformers import RepoCallback

    model, tokenizer = _tiny_model(), _tiny_tokenizer()
    ids = torch.tensor(tokenizer(TEXT).input_ids)
    data = [{"input_ids": ids, "labels": ids} for _ in range(4)]
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=2, save_steps=2,
                                          per_device_train_batch_size=2, report_to=[], use_cpu=True)
    callback = RepoCallback(tmp_path / "r")
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                                   callbacks=[callback])
    trainer.train()
    callback.close()
    with ckptrepo.Repo.open(tmp_path / "r") as repo:
        files = repo.files("main")
        assert "config.json" in files and "tokenizer.json" in files
        assert not any(p.endswith((".pt", ".pth", ".bin")) for p in files)
        repo.export("main", tmp_path / "out", format="hf")
    _assert_same_model(model, tmp_path / "out")
    _assert_same_tokenizer(tokenizer, tmp_path / "out")


def test_a_file_has_no_tensor_history(tmp_path: Path) -> None:
    with ckptrepo.Repo.init(tmp_path / "r") as repo:
        repo.commit({"w": torch.ones(2)}, files={"config.json": b"{}"}, blocking=True).wait()
        with pytest.raises(UsageError, match="names a file"):
            repo.history("%file/config.json")
        assert [p.commit_id for p in repo.history("w")] == [repo.resolve("main")]


def test_a_file_name_damaged_in_the_database_is_refused_at_export(tmp_path: Path) -> None:
    """A file's name was checked when committed; one that later reads as no plain relative path
    (a damaged or hand-edited database) fails the export, and nothing is written outside it."""
    import sqlite3

    with ckptrepo.Repo.init(tmp_path / "r") as repo:
        repo.commit({"w": torch.ones(2)}, files={"config.json": b"{}"}, blocking=True).wait()
    with sqlite3.connect(tmp_path / "r" / ".ckpt" / "db.sqlite") as db:
        db.execute("UPDATE entries SET name = '%file/../../escaped.json' WHERE name = '%file/config.json'")
    with ckptrepo.Repo.open(tmp_path / "r") as repo, pytest.raises(IntegrityError, match=r"escaped\.json"):
        repo.export("main", tmp_path / "out", format="hf")
    assert not (tmp_path / "out").exists() and not (tmp_path.parent / "escaped.json").exists()
