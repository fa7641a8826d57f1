"""Weight-space merges of committed models (``Repo.merge_weights``, ``ckpt merge``) and the line
between two commits' weights (``Repo.interpolate``, ``ckpt interpolate``).

What is checked, on a small model (fp32, bf16, fp16 and fp64 tensors, a frozen tensor, integer
and bool tensors, a non-tensor skeleton) committed as a base and two fine-tunes of it: a merge
commit has its inputs as parents in order (first parent, then merge edges), a transfer edge from
the base, the method and its parameters in its config, the first input's skeleton, and tensors
equal to the formulas applied to the loaded inputs (bit for bit for the average); the frozen,
integer and bool tensors keep their tensor ids (they deduplicate); a mismatch (a tensor missing,
another shape or dtype, an integer tensor that differs) is refused naming the tensor, and nothing
is written; a branch whose head is not an input, or an input given twice, is refused; ``ckpt
merge`` commits and encodes (``--no-repack`` leaves it raw); ``ckpt interpolate`` runs a real
command on each point's file and prints t -> metrics (the endpoints the commits themselves,
nothing committed); ``interpolate(fn=)`` gets the states.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner, Result

import ckptrepo
from ckptrepo.cli.app import app
from ckptrepo.errors import EvaluationFailed, MergeMismatch, UsageError
from ckptrepo.explore import merge as m
from ckptrepo.testing import assert_states_equal

FLOATS = ("embed.weight", "layer.weight", "layer.bias", "head.weight")


def _model(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(64, 48, generator=g),
        "layer.weight": torch.randn(48, 48, generator=g).to(torch.bfloat16),
        "layer.bias": torch.randn(48, generator=g).to(torch.float16),
        "head.weight": torch.randn(8, 48, generator=g).to(torch.float64),
        "frozen.weight": torch.randn(96, 48, generator=g),
        "position_ids": torch.arange(128, dtype=torch.int64),
        "mask": torch.rand(40, generator=g) > 0.5,
    }


def _tuned(base: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """A fine-tune: every float tensor but the frozen one moved by small noise."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, x in base.items():
        if name in FLOATS:
            x = (x.double() + 0.01 * torch.randn(x.shape, generator=g, dtype=torch.float64)).to(x.dtype)
        out[name] = x.clone()
    return out


def _state(model: dict[str, torch.Tensor], tag: str) -> dict[str, Any]:
    return {"model": model, "meta": {"tag": tag, "layers": 1}}


class Lineage:
    """base on main; ft-a and ft-b fine-tuned from it (children of it, on their own branches)."""

    def __init__(self, repo: ckptrepo.Repo) -> None:
        self.repo = repo
        self.base = _model(0)
        self.a, self.b = _tuned(self.base, 1), _tuned(self.base, 2)
        self.base_id = repo.commit(_state(self.base, "base"), message="base", blocking=True).wait().id
        repo.branch("ft-a", self.base_id)
        repo.branch("ft-b", self.base_id)
        self.a_id = repo.commit(_state(self.a, "a"), branch="ft-a", blocking=True).wait().id
        self.b_id = repo.commit(_state(self.b, "b"), branch="ft-b", blocking=True).wait().id


@pytest.fixture
def lineage(tmp_path: Path, db_url: str) -> Iterator[Lineage]:
    with ckptrepo.Repo.init(tmp_path / "r", db_url=db_url, chunk_size=4096) as repo:
        yield Lineage(repo)


def _ids(repo: ckptrepo.Repo, rev: str) -> dict[str, str]:
    return {info.name: info.tensor_id for info in repo.tensors(rev)}


def _store_files(repo: ckptrepo.Repo) -> set[Path]:
    return {p for p in (repo.repo_dir / "store").rglob("*") if p.is_file() and "leases" not in p.parts}


# -- merge_weights ----------------------------------------------------------------------------------


def test_average_merge_commit(lineage: Lineage) -> None:
    repo = lineage.repo
    commit = repo.merge_weights(["ft-a", "ft-b"], method="average", branch="merged")
    assert [(p.id, p.kind) for p in commit.parents] == [(lineage.a_id, "parent"), (lineage.b_id, "merge")]
    assert commit.config == {"merge": {"method": "average", "inputs": [lineage.a_id, lineage.b_id]}}
    assert repo.resolve("merged") == commit.id
    assert "average" in commit.message and "ft-a" in commit.message
    got = repo.checkout(commit.id)
    assert got["meta"] == {"tag": "a", "layers": 1}  # the first input's skeleton
    expected = {name: ((x.double() + lineage.b[name].double()) / 2).to(x.dtype) if x.dtype == torch.float64
                else ((x.float() + lineage.b[name].float()) / 2).to(x.dtype) if name in FLOATS else x
                for name, x in lineage.a.items()}
    assert_states_equal(got["model"], expected)  # bit for bit: the formula, in fp32 (fp64 for fp64)
    merged, a = _ids(repo, commit.id), _ids(repo, "ft-a")
    for name in ("model/frozen.weight", "model/position_ids", "model/mask"):
        assert merged[name] == a[name]  # copied: the same stored tensor
    for name in FLOATS:
        assert merged[f"model/{name}"] != a[f"model/{name}"]
    assert commit.new_bytes <= sum(x.numel() * x.element_size() for n, x in lineage.a.items() if n in FLOATS)


def test_methods_equal_their_formulas_on_the_loaded_inputs(lineage: Lineage) -> None:
    repo = lineage.repo
    a, b, base = (repo.checkout(r)["model"] for r in ("ft-a", "ft-b", "main"))
    cases: list[tuple[dict[str, Any], Any]] = [
        ({"method": "weighted", "weights": [1.0, 3.0]},
         lambda n: (0.25 * a[n].float() + 0.75 * b[n].float())),
        ({"method": "task-arithmetic", "base": "main", "weights": [0.5, 1.0], "lam": 0.8},
         lambda n: base[n].float() + 0.8 * (0.5 * (a[n].float() - base[n].float())
                                           + (b[n].float() - base[n].float()))),
        ({"method": "ties", "base": "main", "density": 0.3, "lam": 1.2},
         lambda n: m.ties(base[n], [a[n], b[n]], [1.0, 1.0], 0.3, 1.2)),
        ({"method": "slerp", "t": 0.3},
         lambda n: m.linear([a[n], b[n]], m.slerp_coefficients(a[n], b[n], 0.3), normalize=False)),
    ]
    for i, (kwargs, formula) in enumerate(cases):
        commit = repo.merge_weights(["ft-a", "ft-b"], branch=f"m{i}", **kwargs)
        got = repo.checkout(commit.id)["model"]
        for name in FLOATS:
            torch.testing.assert_close(got[name], formula(name).to(a[name].dtype), rtol=1e-5, atol=1e-6)
        assert torch.equal(got["frozen.weight"], a["frozen.weight"])
        config = commit.config["merge"]
        assert config["method"] == kwargs["method"] and config["inputs"] == [lineage.a_id, lineage.b_id]
        kinds = [(p.id, p.kind) for p in commit.parents]
        if "base" in kwargs:
            assert config["base"] == lineage.base_id and config["lambda"] == kwargs["lam"]
            assert kinds[2:] == [(lineage.base_id, "transfer")]
            transfer = commit.parents[2].mapping or {}
            assert transfer.get("model/frozen.weight") == "model/frozen.weight"  # byte-identical to the base's
        else:
            assert len(kinds) == 2
    assert repo.get_commit("m2").config["merge"]["density"] == 0.3
    assert repo.get_commit("m3").config["merge"]["t"] == 0.3


def test_a_merge_stored_raw_writes_its_packs_through_the_page_cache(lineage: Lineage,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Its raw packs are read back soon by the repack that encodes them; a commit's are not."""
    from ckptrepo.ingest import writer

    made: list[bool] = []
    real = writer.PackSink

    def sink(*args: Any, direct: bool = True, **kwargs: Any) -> Any:
        made.append(direct)
        return real(*args, direct=direct, **kwargs)

    monkeypatch.setattr(writer, "PackSink", sink)
    lineage.repo.merge_weights(["ft-a", "ft-b"], method="average", branch="soup")
    assert made == [False]
    lineage.repo.commit(_state(_tuned(lineage.base, 9), "d"), branch="soup", blocking=True).wait()
    assert made == [False, True]


def test_chunk_by_chunk_and_whole_tensor_merges_agree(lineage: Lineage, monkeypatch: pytest.MonkeyPatch) -> None:
    """Elementwise methods merge chunk by chunk as the inputs are decoded (``explore.fused``); the
    whole-tensor path (``explore.merge.merged``, what the other methods take) gives the same bits."""
    from ckptrepo.explore import fused

    repo = lineage.repo
    cases: list[dict[str, Any]] = [{"method": "average"}, {"method": "weighted", "weights": [0.3, 1.1]},
                                   {"method": "task-arithmetic", "base": "main", "weights": [0.7, 0.4], "lam": 1.3}]
    calls: list[str] = []
    real = fused.fused_tensor

    def counted(spec: Any, commits: Any, name: str, *args: Any) -> Any:
        calls.append(name)
        return real(spec, commits, name, *args)

    monkeypatch.setattr(fused, "fused_tensor", counted)
    chunked = [repo.merge_weights(["ft-a", "ft-b"], branch=f"c{i}", **kw) for i, kw in enumerate(cases)]
    assert sorted(set(calls)) == sorted(f"model/{n}" for n in FLOATS)  # every merged tensor went chunk by chunk
    monkeypatch.setattr(fused, "fusable", lambda spec, commits, name: False)
    whole = [repo.merge_weights(["ft-a", "ft-b"], branch=f"w{i}", **kw) for i, kw in enumerate(cases)]
    for c, w in zip(chunked, whole, strict=True):
        assert _ids(repo, c.id) == _ids(repo, w.id)


def test_chunks_merged_chunk_by_chunk_are_hashed_once(lineage: Lineage, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk-by-chunk merge hands the ingest each result chunk's id and moments, taken as it was
    merged (``LazySource.digests``): the ingest hashes none of those chunks again, and the commit's
    tensors (ids, statistics) equal those of the same merge hashed by the ingest (in a repository
    of its own: a tensor row stored once keeps its first statistics)."""
    from ckptrepo.ingest import pipeline

    repo = lineage.repo
    adopted: list[int] = []
    real = pipeline._digests_of

    def spied(src: Any, spans: Any) -> Any:
        found = real(src, spans)
        adopted.append(0 if found is None else len(found))
        return found

    monkeypatch.setattr(pipeline, "_digests_of", spied)
    taken = repo.merge_weights(["ft-a", "ft-b"], method="weighted", weights=[0.3, 1.1], branch="digested")
    chunks = sum(-(-lineage.a[n].numel() * lineage.a[n].element_size() // 4096) for n in FLOATS)
    assert sum(adopted) == chunks  # every merged tensor's chunks, none of the copied ones
    monkeypatch.setattr(pipeline, "_digests_of", lambda src, spans: None)
    with ckptrepo.Repo.init(tmp_path / "hashed", chunk_size=4096) as other:
        hashed = Lineage(other).repo.merge_weights(["ft-a", "ft-b"], method="weighted", weights=[0.3, 1.1],
                                                   branch="hashed")
        expected = {i.name: (i.tensor_id, i.stats) for i in other.tensors(hashed.id)}
        expected_state = other.checkout(hashed.id)["model"]
    assert {i.name: (i.tensor_id, i.stats) for i in repo.tensors(taken.id)} == expected
    assert_states_equal(repo.checkout(taken.id)["model"], expected_state)


def test_a_damaged_input_fails_the_merge_naming_it(lineage: Lineage) -> None:
    repo = lineage.repo
    packs = repo.repo_dir / "store" / "packs"
    before = set(packs.rglob("*.pack"))
    repo.branch("ft-c", lineage.base_id)
    damaged = repo.commit(_state(_tuned(lineage.base, 3), "c"), branch="ft-c", blocking=True).wait().id
    for pack in set(packs.rglob("*.pack")) - before:  # the packs only ft-c's chunks are in
        data = bytearray(pack.read_bytes())
        for at in range(64, len(data) // 2, 512):
            data[at] ^= 0xFF
        pack.write_bytes(bytes(data))
    commits = len(repo.log())
    with pytest.raises(ckptrepo.errors.IntegrityError) as err:
        repo.merge_weights(["ft-a", "ft-c"], method="average", branch="merged")
    assert f"of commit {damaged[:10]}" in err.value.message
    assert len(repo.log()) == commits and "merged" not in {b.name for b in repo.branches()}


def test_an_input_that_is_the_base_adds_no_transfer_edge(lineage: Lineage) -> None:
    commit = lineage.repo.merge_weights(["main", "ft-a"], method="task-arithmetic", base="main")
    assert [(p.id, p.kind) for p in commit.parents] == [(lineage.base_id, "parent"), (lineage.a_id, "merge")]
    assert lineage.repo.resolve("main") == commit.id  # main's head was an input: it moves


@pytest.mark.parametrize(("change", "message"), [
    ("shape", "'model/layer.bias' has shape [48] in ft-a but [47] in odd"),
    ("dtype", "'model/embed.weight' is float32 in ft-a but float16 in odd"),
    ("missing", "'model/head.weight' is in ft-a but not in odd"),
    ("extra", "'model/extra' is in odd but not in ft-a"),
    ("ints", "'model/position_ids' is a int64 tensor, which is copied, not merged, and it differs between ft-a "
             "and odd"),
])
def test_mismatches_name_the_tensor_and_write_nothing(lineage: Lineage, change: str, message: str) -> None:
    repo = lineage.repo
    odd = {k: v.clone() for k, v in lineage.b.items()}
    if change == "shape":
        odd["layer.bias"] = odd["layer.bias"][:47].clone()
    elif change == "dtype":
        odd["embed.weight"] = odd["embed.weight"].half()
    elif change == "missing":
        del odd["head.weight"]
    elif change == "extra":
        odd["extra"] = torch.zeros(3)
    else:
        odd["position_ids"] = odd["position_ids"] + 1
    repo.branch("odd", lineage.base_id)
    repo.commit(_state(odd, "odd"), branch="odd", blocking=True).wait()
    commits, files = len(repo.log()), _store_files(repo)
    with pytest.raises(MergeMismatch) as err:
        repo.merge_weights(["ft-a", "odd"], method="average", branch="merged")
    assert message in err.value.message and err.value.exit_code == 2
    assert len(repo.log()) == commits and _store_files(repo) == files
    assert "merged" not in {b.name for b in repo.branches()}


def test_bad_merges_are_refused_before_anything_is_written(lineage: Lineage) -> None:
    repo = lineage.repo
    commits, files = len(repo.log()), _store_files(repo)
    with pytest.raises(UsageError, match=r"branch 'main' is at \w+, which is not among the merged commits"):
        repo.merge_weights(["ft-a", "ft-b"], method="average")  # main's head is the base
    with pytest.raises(UsageError, match="is given twice"):
        repo.merge_weights(["ft-a", lineage.a_id], method="average", branch="x")
    with pytest.raises(UsageError, match="ties needs a base"):
        repo.merge_weights(["ft-a", "ft-b"], method="ties", branch="x")
    with pytest.raises(UsageError, match="revs must be a list"):
        repo.merge_weights("ft-a", method="average", branch="x")  # type: ignore[arg-type]
    with pytest.raises(ckptrepo.errors.UnknownRevision):
        repo.merge_weights(["ft-a", "nope"], method="average", branch="x")
    assert len(repo.log()) == commits and _store_files(repo) == files


# -- the command line -------------------------------------------------------------------------------


def _cli(repo: ckptrepo.Repo, *args: str) -> Result:
    return CliRunner().invoke(app, ["--repo", str(repo.repo_dir.parent), *args], catch_exceptions=False)


def test_cli_merge(lineage: Lineage) -> None:
    repo = lineage.repo
    result = _cli(repo, "merge", "ft-a", "ft-b", "--method", "weighted", "--weights", "0.25,0.75", "-b", "m",
                  "-m", "blend", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    commit = repo.get_commit("m")
    assert doc["id"] == commit.id and commit.message == "blend"
    assert commit.config["merge"]["weights"] == [0.25, 0.75]
    assert repo.repack_pending() == (0, 0)  # stored raw, then encoded before the command returned
    got = repo.checkout("m")["model"]
    torch.testing.assert_close(got["embed.weight"], 0.25 * lineage.a["embed.weight"] + 0.75 * lineage.b["embed.weight"])
    result = _cli(repo, "merge", "ft-a", "ft-b", "--method", "slerp", "-t", "0.5", "-b", "s", "--no-repack")
    assert result.exit_code == 0, result.stderr
    assert "merged" in result.stdout and "slerp of 2" in result.stdout
    assert repo.repack_pending()[0] > 0
    result = _cli(repo, "merge", "ft-a", "ft-b", "--method", "weighted", "--weights", "1,x", "-b", "w")
    assert result.exit_code == 2 and "'x' is not a number" in result.stderr
    result = _cli(repo, "merge", "ft-a", "ft-b", "--method", "mean", "-b", "w")
    assert result.exit_code == 2 and "unknown merge method 'mean'" in result.stderr


# -- interpolate ------------------------------------------------------------------------------------

# Reads a safetensors file with the standard library alone: the sum and first value of tensor "w".
SCRIPT = r'''
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    body = f.read()
begin, end = header["w"]["data_offsets"]
values = struct.unpack(f"<{(end - begin) // 4}f", body[begin:end])
if values[0] < -100:
    sys.exit("refusing a state with w[0] < -100")
print(json.dumps({"wsum": sum(values), "w0": values[0]}))
'''


@pytest.fixture
def flat(tmp_path: Path) -> Iterator[tuple[ckptrepo.Repo, str]]:
    """A repository of two flat states (A: w = 1, B: w = 3, an unchanged b and steps), and the command."""
    script = tmp_path / "score.py"
    script.write_text(SCRIPT)
    with ckptrepo.Repo.init(tmp_path / "flat", chunk_size=4096) as repo:
        for name, value in (("a", 1.0), ("b", 3.0)):
            repo.commit({"w": torch.full((3000,), value), "b": torch.arange(5.0), "steps": torch.tensor([7])},
                        branch=name, blocking=True).wait()
        yield repo, f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {{path}}"


def test_cli_interpolate_runs_a_command_on_each_point(flat: tuple[ckptrepo.Repo, str]) -> None:
    repo, command = flat
    commits = len(repo.log())
    result = _cli(repo, "interpolate", "a", "b", "--points", "5", "--run", command, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["a"] == repo.resolve("a") and doc["b"] == repo.resolve("b")
    assert [p["t"] for p in doc["points"]] == [0, 0.25, 0.5, 0.75, 1]
    for p in doc["points"]:
        assert p["error"] is None
        assert p["metrics"]["w0"] == pytest.approx(1 + 2 * p["t"])
        assert p["metrics"]["wsum"] == pytest.approx(3000 * (1 + 2 * p["t"]))
    assert len(repo.log()) == commits  # nothing committed
    table = _cli(repo, "interpolate", "a", "b", "--points", "3", "--run", command)
    assert table.exit_code == 0, table.stderr
    assert "not committed" in table.stdout and "wsum" in table.stdout and "0.5" in table.stdout


def test_a_failing_point_is_reported_and_the_others_go_on(flat: tuple[ckptrepo.Repo, str]) -> None:
    repo, command = flat
    repo.commit({"w": torch.full((3000,), -150.0), "b": torch.arange(5.0), "steps": torch.tensor([7])},
                branch="c", blocking=True).wait()
    found = repo.interpolate("a", "c", points=3, run=command)
    assert [p.ok for p in found] == [True, True, False]
    assert found[2].error == "exit status 1" and "w[0] < -100" in found[2].stderr
    assert found[1].metrics["w0"] == pytest.approx(-74.5)
    result = _cli(repo, "interpolate", "a", "c", "--points", "3", "--run", command)
    assert result.exit_code == EvaluationFailed.exit_code and "1 of 3" in result.stderr
    assert "exit status 1" in result.stdout


def test_interpolate_with_a_function(lineage: Lineage) -> None:
    repo = lineage.repo
    seen: list[tuple[float, dict[str, Any]]] = []

    def score(state: dict[str, Any], t: float) -> dict[str, float]:
        seen.append((t, state))
        return {"norm": float(state["model"]["embed.weight"].norm())}

    found = repo.interpolate("ft-a", "ft-b", points=3, fn=score)
    assert [p.t for p in found] == [0.0, 0.5, 1.0] and all(p.ok for p in found)
    assert_states_equal(seen[0][1], repo.checkout("ft-a"))  # the endpoints are the commits themselves
    assert_states_equal(seen[2][1], repo.checkout("ft-b"))
    average = repo.checkout(repo.merge_weights(["ft-a", "ft-b"], method="average", branch="avg").id)
    assert_states_equal(seen[1][1]["model"], average["model"])
    with pytest.raises(UsageError, match="exactly one of fn"):
        repo.interpolate("ft-a", "ft-b", points=3)
    with pytest.raises(UsageError, match="points 1 is not"):
        repo.interpolate("ft-a", "ft-b", points=1, fn=score)
    with pytest.raises(UsageError, match="not a mapping of metrics"):
        repo.interpolate("ft-a", "ft-b", points=2, fn=lambda state, t: 1.0)  # type: ignore[arg-type,return-value]
