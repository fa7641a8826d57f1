"""``Repo.similar`` / ``ckpt similar``: the commits nearest to a commit or a checkpoint file, with the
evidence of each stage (shared chunks, statistics' bound, exact distance), over a small model
really trained on the CPU (``trained_lineage``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import trained_lineage
from trained_lineage import TRUTH
from typer.testing import CliRunner

import ckptrepo
from ckptrepo import errors
from ckptrepo.cli.app import app


@pytest.fixture(scope="module")
def repo_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path], dict[str, str]]:
    """Every checkpoint of the lineage but tr2 and fork2, committed with its true edges."""
    files = trained_lineage.make(tmp_path_factory.mktemp("lineage"))
    path = tmp_path_factory.mktemp("repo") / "repo"
    ids: dict[str, str] = {}
    with ckptrepo.Repo.init(path) as repo:
        for name in ("base", "ft1", "ft2", "ft3", "tr1", "fork1"):
            truth = TRUTH[name]
            branch = "main" if name == "base" or name.startswith("ft") else name
            ids[name] = repo.commit_file(
                files[name], branch=branch, parents=[ids[truth[1]]] if truth and truth[0] == "parent" else None,
                transfer_from=ids[truth[1]] if truth and truth[0] == "transfer" else None).id
    return path, files, ids


def test_similar_to_a_commit_ranks_its_neighbours_with_evidence(repo_dir: tuple[Path, dict[str, Path],
                                                                                dict[str, str]]) -> None:
    path, _, ids = repo_dir
    name_of = {v: k for k, v in ids.items()}
    with ckptrepo.Repo.open(path) as repo:
        found = repo.similar(ids["ft2"], n=3)
    assert [name_of[s.commit_id] for s in found][:2] in (["ft1", "ft3"], ["ft3", "ft1"])
    assert ids["ft2"] not in [s.commit_id for s in found]
    body = {f"model/body.{n}" for n in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")}
    for s in found:
        assert s.exact_distance is not None and s.stat_distance <= s.exact_distance * (1 + 1e-6) + 1e-12
        assert s.score == pytest.approx(1 - s.exact_distance)
        assert s.query_tensors == 6  # body and classifier, weights and biases
        tuned = name_of[s.commit_id].startswith(("ft", "fork"))  # base and tr1 have no classifier
        classifier = {"model/classifier.weight", "model/classifier.bias"} if tuned else set()
        assert s.matched_tensors == len(body | classifier) and set(s.per_tensor) == body | classifier
    assert [s.exact_distance for s in found] == sorted(s.exact_distance for s in found if s.exact_distance is not None)


def test_similar_to_a_file_hashes_it_as_a_commit_would(repo_dir: tuple[Path, dict[str, Path], dict[str, str]],
                                                       tmp_path: Path) -> None:
    path, files, ids = repo_dir
    name_of = {v: k for k, v in ids.items()}
    with ckptrepo.Repo.open(path) as repo:
        same = repo.similar(files["ft3"], n=2)  # a committed file: the same chunks, distance 0
        assert name_of[same[0].commit_id] == "ft3" and same[0].exact_distance == 0.0 and same[0].score == 1.0
        assert same[0].shared_fraction == 1.0 and same[0].shared_bytes > 0
        probe = repo.similar(str(files["tr2"]), n=3)  # not committed: its frozen body is the base's chunks
        assert name_of[probe[0].commit_id] == "tr1"
        body = {name_of[s.commit_id]: s for s in probe}
        assert body["tr1"].shared_fraction > 0.3 and body["tr1"].matched_tensors == body["tr1"].query_tensors
        assert repo.log(None) and len(repo.log(None)) == 6  # nothing stored
        state = torch.load(files["fork1"], weights_only=True)  # a state in memory, as the file holds it
        nearest = repo.similar(state, n=1)[0]
        assert name_of[nearest.commit_id] == "fork1" and nearest.exact_distance == 0.0
        with pytest.raises(errors.UsageError):
            repo.similar(ids["ft1"], n=0)
        with pytest.raises(errors.UnknownRevision):
            repo.similar("no-such-branch")


def test_ckpt_similar_prints_a_table_and_json(repo_dir: tuple[Path, dict[str, Path], dict[str, str]]) -> None:
    path, files, ids = repo_dir
    runner = CliRunner()
    table = runner.invoke(app, ["--repo", str(path), "similar", str(files["fork2"]), "-n", "2"])
    assert table.exit_code == 0, table.output
    assert ids["fork1"][:10] in table.stdout.splitlines()[2]  # its parent, nearest
    doc = runner.invoke(app, ["--repo", str(path), "similar", "tr1", "--json"])
    assert doc.exit_code == 0, doc.output
    rows = json.loads(doc.stdout)
    assert rows[0]["commit_id"] == ids["base"] and rows[0]["shared_fraction"] > 0.3  # the frozen body
    assert {"score", "shared_bytes", "matched_tensors", "stat_distance", "exact_distance", "per_tensor",
            "short_id"} <= rows[0].keys()
    bad = runner.invoke(app, ["--repo", str(path), "similar", "main", "-n", "0"])
    assert bad.exit_code == 2
