"""Tensor analysis: ``diff`` (stat and exact), ``history`` along first-parent chains, their CLI
commands (``diff``, ``history``, ``plot``) — on SQLite and PostgreSQL.

Exact results are checked against torch on the full tensors, and exact mode is checked to
read only the chunks that differ (calls to ``ChunkReader.read_into`` are counted).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner, Result

from ckptrepo import Repo, errors
from ckptrepo.cli.app import app
from ckptrepo.testing import parts

CHUNK = 4096


def _base() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {
        "w": torch.randn(4096, generator=g),  # 16 KiB: 4 chunks
        "w_all": torch.randn(2048, generator=g),  # 2 chunks, both change
        "ints": torch.arange(3000, dtype=torch.int64),  # 24000 B: 6 chunks
        "half": torch.randn(3000, generator=g).to(torch.bfloat16),  # 2 chunks
        "same": torch.randn(100, generator=g),
        "gone": torch.zeros(3),
        "reshaped": torch.arange(16, dtype=torch.float32).reshape(4, 4),
        "cast": torch.randn(8, generator=g),
        "nan": torch.tensor([1.0, float("nan"), 2.0]),
    }


def _changed(base: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    new = {k: v.clone() for k, v in base.items() if k != "gone"}
    new["w"][1500] += 1.0  # byte 6000: chunk 1 only
    new["w_all"] = new["w_all"] * 1.5
    new["ints"][2999] = -5  # last chunk only
    new["half"][10] = 3.0
    new["reshaped"] = base["reshaped"].reshape(2, 8)
    new["cast"] = base["cast"].double()
    new["nan"] = torch.tensor([1.0, float("nan"), 3.0])
    new["new"] = torch.ones(5)
    return new


@pytest.fixture
def repo(db_url: str, tmp_path: Path) -> Iterator[Repo]:
    with Repo.init(tmp_path / "r", db_url=db_url, chunk_size=CHUNK) as r:
        yield r


@pytest.fixture
def pair(repo: Repo) -> tuple[str, str, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    a = _base()
    b = _changed(a)
    first = repo.commit(a, step=1, blocking=True).wait()
    second = repo.commit(b, step=2, blocking=True).wait()
    return first.id, second.id, a, b


class _Reads:
    """Counts ``ChunkReader.read_into`` calls of a repository (from any thread)."""

    def __init__(self, repo: Repo, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        lock = threading.Lock()
        original = parts(repo).reader.read_into

        def counting(loc: Any, out: memoryview, bases: Any = None) -> None:
            with lock:
                self.calls.append(loc.chunk_id)
            original(loc, out, bases)

        monkeypatch.setattr(parts(repo).reader, "read_into", counting)


def _statements(repo: Repo) -> list[str]:
    from sqlalchemy import event

    seen: list[str] = []
    event.listen(parts(repo).engine, "before_cursor_execute", lambda *args: seen.append(args[2]))
    return seen


def test_diff_stat_reads_no_bytes_and_compares_chunks_and_stats(repo: Repo, pair: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, _, _ = pair
    reads = _Reads(repo, monkeypatch)
    statements = _statements(repo)
    d = repo.diff(a, b)
    assert reads.calls == []
    assert sum(" entries" in s for s in statements) <= 2  # not one query per tensor
    by = {t.name: t for t in d.tensors}
    assert d.counts == {"added": 1, "removed": 1, "changed": 7, "unchanged": 1}
    assert [t.name for t in d.tensors] == sorted(by)
    assert by["same"].status == "unchanged" and by["same"].chunks_changed == 0
    assert by["gone"].status == "removed" and by["gone"].b is None
    assert by["new"].status == "added" and by["new"].a is None and by["new"].changed_fraction == 1.0
    w = by["w"]
    assert (w.status, w.chunks_changed, w.n_chunks, w.changed_fraction) == ("changed", 1, 4, 0.25)
    assert (by["ints"].chunks_changed, by["ints"].n_chunks) == (1, 6)
    assert (by["w_all"].chunks_changed, by["w_all"].n_chunks) == (2, 2)
    assert by["reshaped"].shape_changed and not by["reshaped"].dtype_changed
    assert by["reshaped"].chunks_changed == 0  # same bytes, other shape
    assert by["cast"].dtype_changed
    assert w.a is not None and w.b is not None
    for stat in ("mean", "std", "l2_norm", "abs_max", "max"):
        assert w.deltas[stat] == pytest.approx(getattr(w.b.stats, stat) - getattr(w.a.stats, stat))
    assert w.deltas["l2_norm"] != 0
    assert all(t.exact is None for t in d.tensors)
    doc = json.loads(json.dumps(d.to_json(changed_only=True), allow_nan=False))
    assert "same" not in {t["name"] for t in doc["tensors"]} and doc["counts"]["unchanged"] == 1


def test_diff_exact_matches_torch_and_reads_only_differing_chunks(repo: Repo, pair: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, sa, sb = pair
    reads = _Reads(repo, monkeypatch)
    d = repo.diff(a, b, exact=True)
    by = {t.name: t for t in d.tensors}
    # w: 1 of 4 chunk pairs, w_all: 2 of 2, ints: 1 of 6, half: 1 of 2 -> 5 pairs, 10 reads.
    assert len(reads.calls) == 10
    assert sum(t.exact.chunks_read for t in d.tensors if t.exact) == 10
    for name in ("w", "w_all", "ints", "half"):
        x, y = sa[name].double(), sb[name].double()
        e = by[name].exact
        assert e is not None, name
        assert e.l2_diff == pytest.approx(float((y - x).norm()), rel=1e-9, abs=1e-12)
        assert e.max_abs_diff == pytest.approx(float((y - x).abs().max()), rel=1e-9)
        assert e.rel_change == pytest.approx(float((y - x).norm() / x.norm()), rel=1e-5)
        assert e.cosine == pytest.approx(float(torch.dot(x, y) / (x.norm() * y.norm())), abs=1e-6)
    assert by["w"].exact and by["w"].exact.bytes_read == 2 * CHUNK
    same = by["same"].exact
    assert same is not None and (same.l2_diff, same.cosine, same.chunks_read) == (0.0, 1.0, 0)
    assert by["reshaped"].exact is None and by["reshaped"].note == "shape changed"
    assert by["cast"].exact is None and "dtype" in (by["cast"].note or "")
    assert by["nan"].exact is None and "NaN" in (by["nan"].note or "")
    assert by["new"].exact is None and by["gone"].exact is None
    json.dumps(d.to_json(), allow_nan=False)


def test_diff_exact_with_other_chunk_size_reads_whole_tensors(repo: Repo) -> None:
    x = torch.randn(4096)
    first = repo.commit({"w": x}, blocking=True).wait()
    repo.config.chunk_size = 2 * CHUNK
    y = x.clone()
    y[0] = 5.0
    second = repo.commit({"w": y}, blocking=True).wait()
    (t,) = repo.diff(first.id, second.id, exact=True).tensors
    assert (t.chunks_changed, t.n_chunks) == (4, 4)
    assert t.exact is not None and t.exact.chunks_read == 4 + 2
    assert t.exact.l2_diff == pytest.approx(float((y.double() - x.double()).norm()))
    assert t.exact.cosine == pytest.approx(float(torch.nn.functional.cosine_similarity(x.double(), y.double(), 0)))


def test_diff_of_unrelated_commits_and_bad_revisions(repo: Repo) -> None:
    first = repo.commit({"a": torch.ones(3), "b": torch.zeros(2)}, blocking=True).wait()
    other = repo.commit({"a": torch.ones(3), "c": torch.zeros(2)}, branch="other", blocking=True).wait()
    assert other.parents == ()
    d = repo.diff("main", "other")
    assert (d.a, d.b) == (first.id, other.id)
    assert [(t.name, t.status) for t in d.tensors] == [("a", "unchanged"), ("b", "removed"), ("c", "added")]
    with pytest.raises(errors.UnknownRevision):
        repo.diff("main", "nope")


def test_history_along_first_parent_chain(repo: Repo) -> None:
    x = torch.randn(4096)
    y = x.clone()
    y[3000] = 9.0  # chunk 2 of 4
    keep = {"other": torch.ones(2)}
    ids = [repo.commit({"w": x, **keep}, step=10, blocking=True).wait().id,
           repo.commit({"w": x, **keep}, step=20, blocking=True).wait().id,
           repo.commit({"w": y, **keep}, step=30, blocking=True).wait().id,
           repo.commit(keep, step=40, blocking=True).wait().id,
           repo.commit({"w": x, **keep}, step=50, blocking=True).wait().id]
    repo.commit({"w": torch.zeros(4096), **keep}, branch="side", parents=[ids[1]], blocking=True).wait()
    statements = _statements(repo)
    points = repo.history("w", along="main")
    # One query for the chain, one for the tensor's runs along it: no lookup per commit.
    assert sum(" entry_runs" in s for s in statements) == 1 and not any(" entries" in s for s in statements)
    assert [p.commit_id for p in points] == ids[::-1]
    assert [p.step for p in points] == [50, 40, 30, 20, 10]
    assert [p.status for p in points] == ["added", "removed", "changed", "unchanged", "added"]
    assert [p.present for p in points] == [True, False, True, True, True]
    changed = points[2]
    assert (changed.chunks_changed, changed.n_chunks, changed.changed_fraction) == (1, 4, 0.25)
    assert changed.tensor is not None and changed.previous is not None
    assert changed.deltas["abs_max"] == pytest.approx(9.0 - float(x.abs().max()))
    assert changed.deltas["l2_norm"] == pytest.approx(float(y.double().norm() - x.double().norm()), rel=1e-5)
    assert points[3].deltas["mean"] == 0 and points[1].deltas == {}
    assert points[0].created_at > points[-1].created_at
    json.dumps([p.to_json() for p in points], allow_nan=False)

    limited = repo.history("w", along="main", limit=2)
    assert [p.status for p in limited] == ["added", "removed"]  # compared with parents beyond the limit too
    side = repo.history("w", along="side")
    assert [p.status for p in side] == ["changed", "unchanged", "added"]
    assert [p.status for p in repo.history("w", along="main~3")] == ["unchanged", "added"]


def test_history_unknown_tensor_lists_close_matches(repo: Repo) -> None:
    repo.commit({"layer.0.weight": torch.ones(2), "layer.0.bias": torch.ones(2)}, blocking=True).wait()
    with pytest.raises(errors.UnknownTensor) as info:
        repo.history("layer.0.weigth")
    assert "layer.0.weight" in info.value.hint
    with pytest.raises(errors.UnknownRevision):
        repo.history("layer.0.weight", along="nope")


def test_metrics_along(repo: Repo) -> None:
    for step, loss in ((1, 3.0), (2, 2.0), (3, 1.5)):
        repo.commit({"w": torch.ones(1) * step}, step=step, metrics={"loss": loss, "acc": step / 10},
                    blocking=True).wait()
    points = repo.metrics_along(["loss"], along="main")
    assert [(p.step, p.values) for p in points] == [(3, {"loss": 1.5}), (2, {"loss": 2.0}), (1, {"loss": 3.0})]
    assert repo.metric_names() == ["acc", "loss"]


# -- CLI -----------------------------------------------------------------------------------------

Run = Callable[..., Result]


@pytest.fixture
def cli(tmp_path: Path, db_url: str) -> tuple[Run, list[str]]:
    """An initialised repository with three commits on main (the last drops and changes tensors)."""
    runner = CliRunner()

    def run(*args: str) -> Result:
        return runner.invoke(app, ["--repo", str(tmp_path / "work"), *args], catch_exceptions=False)

    assert run("init", "--chunk-size", "4KiB", "--db", db_url).exit_code == 0
    states = [_base(), _changed(_base())]
    states.append(dict(states[1], w=states[1]["w"] * 2))
    ids = []
    for i, state in enumerate(states):
        path = tmp_path / f"s{i}.safetensors"
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
        result = run("commit", str(path), "--step", str(100 * (i + 1)), "--metric", f"loss={3.0 - i}", "--json")
        assert result.exit_code == 0, result.stderr
        ids.append(json.loads(result.stdout)["id"])
    return run, ids


def test_cli_diff_and_history(cli: tuple[Run, list[str]]) -> None:
    run, ids = cli
    stat = run("diff", ids[0], ids[1], "--json")
    assert stat.exit_code == 0, stat.stderr
    doc = json.loads(stat.stdout)
    assert doc["exact"] is False and doc["counts"]["removed"] == 1
    w = next(t for t in doc["tensors"] if t["name"] == "w")
    assert (w["chunks_changed"], w["n_chunks"], w["exact"]) == (1, 4, None)
    exact = json.loads(run("diff", ids[0], ids[1], "--exact", "--json", "--changed-only").stdout)
    assert all(t["status"] != "unchanged" for t in exact["tensors"])
    assert next(t for t in exact["tensors"] if t["name"] == "w")["exact"]["l2_diff"] > 0
    human = run("diff", "main~2", "main", "--exact")
    assert human.exit_code == 0 and "reshaped" in human.stdout and "shape [4, 4] ->" in human.stdout

    hist = run("history", "w", "--json")
    assert hist.exit_code == 0, hist.stderr
    doc = json.loads(hist.stdout)
    assert doc["along"] == "main"
    assert [p["status"] for p in doc["points"]] == ["changed", "changed", "added"]
    assert [p["step"] for p in doc["points"]] == [300, 200, 100]
    assert len(json.loads(run("history", "w", "-n", "1", "--json").stdout)["points"]) == 1
    gone = json.loads(run("history", "gone", "--along", "main", "--json").stdout)["points"]
    assert [p["present"] for p in gone] == [False, False, True]
    assert "w along main" in run("history", "w").stdout


def test_cli_analysis_errors(cli: tuple[Run, list[str]]) -> None:
    run, _ = cli
    unknown = run("history", "reshape")
    assert unknown.exit_code == 3 and "Did you mean 'reshaped'" in unknown.stderr
    assert "Traceback" not in unknown.stderr + unknown.stdout
    assert run("diff", "main", "nope").exit_code == 3
    assert run("history", "w", "--along", "nope").exit_code == 3
    assert run("plot", "history", "w", "-o", "chart.jpg").exit_code == 2


def test_cli_plot_writes_png(cli: tuple[Run, list[str]], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    run, _ = cli
    chart = tmp_path / "w.png"
    result = run("plot", "history", "gone", "--stat", "l2_norm,mean", "-o", str(chart), "--json")
    assert result.exit_code == 0, result.stderr
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and json.loads(result.stdout)["commits"] == 3
    metrics = tmp_path / "m.png"
    result = run("plot", "metrics", "loss", "-b", "main", "-b", "main~1", "-o", str(metrics))
    assert result.exit_code == 0, result.stderr
    assert metrics.stat().st_size > 1000 and not list(tmp_path.glob(".*.tmp"))
    bad = run("plot", "metrics", "los", "-o", str(metrics))
    assert bad.exit_code == 2 and "'loss'" in bad.stderr
    assert run("plot", "history", "w", "--stat", "l2", "-o", str(chart)).exit_code == 2


def test_plot_without_matplotlib_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import builtins

    from ckptrepo import plot

    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.split(".")[0] == "matplotlib":
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(errors.UsageError) as info:
        plot.plot_metrics({}, ["loss"], tmp_path / "x.png")
    assert "ckptrepo[plot]" in info.value.hint
