"""Lineage inferred from the weights of a small model really trained on the CPU (``trained_lineage``):
fine-tunes, a transfer (frozen body, new head) and a fork at another learning rate get their true
source, through ``Repo.infer_parent`` / ``infer_lineage`` and ``ckpt commit --infer-parent`` /
``ckpt import-run --infer-lineage``; nothing is recorded without ``--accept``, which records the edges."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import trained_lineage
from trained_lineage import TRUTH
from typer.testing import CliRunner, Result

import ckptrepo
from ckptrepo.cli.app import app


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return trained_lineage.make(tmp_path_factory.mktemp("lineage"))


def ckpt(repo: Path, *args: str) -> Result:
    return CliRunner().invoke(app, ["--repo", str(repo), *args], catch_exceptions=False)


def commit_known(repo: ckptrepo.Repo, files: dict[str, Path], names: list[str],
                 ids: dict[str, str] | None = None) -> dict[str, str]:
    """Commit ``names`` with their true edges (base, its fine-tunes on main; others on a branch of their
    own), after the commits ``ids`` (name -> id); returns every name's id."""
    ids = dict(ids or {})
    for name in names:
        truth = TRUTH[name]
        branch = "main" if name == "base" or name.startswith("ft") else name.rstrip("0123456789")
        parents = [ids[truth[1]]] if truth and truth[0] == "parent" else None
        transfer = ids[truth[1]] if truth and truth[0] == "transfer" else None
        ids[name] = repo.commit_file(files[name], branch=branch, parents=parents, transfer_from=transfer).id
    return ids


def test_infer_parent_finds_fine_tunes_forks_and_transfers_among_commits(files: dict[str, Path],
                                                                         tmp_path: Path, db_url: str) -> None:
    with ckptrepo.Repo.init(tmp_path / "repo", db_url=db_url) as repo:
        ids = commit_known(repo, files, ["base", "ft1", "ft2"])
        name_of = {v: k for k, v in ids.items()}
        for name in ("ft3", "fork1", "tr1"):
            p = repo.infer_parent(files[name])
            assert (p.kind, name_of.get(p.parent or "")) == TRUTH[name], (name, p)
            assert p.model == str(files[name]) and 0 < p.score <= 1 and p.evidence is not None
            assert p.runner_up is not None and p.runner_up.source != p.parent
        transfer = repo.infer_parent(str(files["tr1"]))  # a string naming a file is the file
        assert transfer.evidence is not None and transfer.evidence.frozen_fraction == 1.0
        assert transfer.evidence.new_tensors == 4 and transfer.evidence.dropped_tensors == 0  # the head's
        # A commit's own source: its descendants are no candidates.
        p = repo.infer_parent("main")
        assert (p.kind, name_of.get(p.parent or "")) == ("parent", "ft1")
        assert len(repo.log(None)) == 3  # nothing recorded

        ids = commit_known(repo, files, ["tr1"], ids)
        name_of = {v: k for k, v in ids.items()}
        p = repo.infer_parent(files["tr2"])
        assert (p.kind, name_of.get(p.parent or "")) == ("parent", "tr1")
        assert p.runner_up is not None and name_of[p.runner_up.source] == "base"
        assert p.runner_up.kind == "transfer" and p.runner_up.score < p.score


def test_commit_infer_parent_records_nothing_without_accept(files: dict[str, Path], tmp_path: Path) -> None:
    repo_dir = tmp_path / "repo"
    with ckptrepo.Repo.init(repo_dir) as repo:
        ids = commit_known(repo, files, ["base", "ft1", "ft2"])
    shown = ckpt(repo_dir, "commit", str(files["ft3"]), "--infer-parent", "--json")
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.stdout)
    assert doc["commit"] is None and doc["proposal"]["parent"] == ids["ft2"] and doc["proposal"]["kind"] == "parent"
    table = ckpt(repo_dir, "commit", str(files["ft3"]), "--infer-parent")
    assert table.exit_code == 0 and ids["ft2"][:10] in table.stdout and "--accept" in table.stderr
    with ckptrepo.Repo.open(repo_dir) as repo:
        assert len(repo.log(None)) == 3

    accepted = ckpt(repo_dir, "commit", str(files["ft3"]), "--infer-parent", "--accept", "--json")
    assert accepted.exit_code == 0, accepted.output
    made = json.loads(accepted.stdout)["commit"]
    with ckptrepo.Repo.open(repo_dir) as repo:
        commit = repo.get_commit(made["id"])
        assert [(p.id, p.kind) for p in commit.parents] == [(ids["ft2"], "parent")] and commit.branch == "main"

    # A transfer starts a line: not on main, which has commits; on a new branch, with no parent.
    refused = ckpt(repo_dir, "commit", str(files["tr1"]), "--infer-parent", "--accept")
    assert refused.exit_code == 2 and "-b NEW" in refused.stderr
    accepted = ckpt(repo_dir, "commit", str(files["tr1"]), "--infer-parent", "--accept", "-b", "probe", "--json")
    assert accepted.exit_code == 0, accepted.output
    with ckptrepo.Repo.open(repo_dir) as repo:
        assert len(repo.log(None)) == 5
        commit = repo.get_commit("probe")
        assert [(p.id, p.kind) for p in commit.parents] == [(ids["base"], "transfer")]

    for bad in (["--accept"], ["--infer-parent", "--parent", ids["base"]]):
        result = ckpt(repo_dir, "commit", str(files["ft3"]), *bad)
        assert result.exit_code == 2, bad


def test_import_run_infers_the_tree_of_a_folder_of_checkpoints(files: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for path in files.values():
        shutil.copy(path, run / path.name)
    name_of = {path.name: name for name, path in files.items()}
    repo_dir = tmp_path / "repo"
    ckptrepo.Repo.init(repo_dir).close()

    shown = ckpt(repo_dir, "import-run", str(run), "--infer-lineage", "--json")
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.stdout)
    assert doc["commits"] == []
    got = {name_of[Path(p["model"]).name]: (p["kind"], name_of[Path(p["parent"]).name]) if p["kind"] else None
           for p in doc["proposals"]}
    assert got == TRUTH
    with ckptrepo.Repo.open(repo_dir) as repo:
        assert repo.log(None) == []
    table = ckpt(repo_dir, "import-run", str(run), "--infer-lineage")
    assert table.exit_code == 0 and "transfer" in table.stdout and "--accept" in table.stderr

    accepted = ckpt(repo_dir, "import-run", str(run), "--infer-lineage", "--accept", "-b", "run", "--json")
    assert accepted.exit_code == 0, accepted.output
    with ckptrepo.Repo.open(repo_dir) as repo:
        commits = {name_of[c.message]: c for c in repo.log(None)}
        by_id = {c.id: name for name, c in commits.items()}
        recorded = {name: (c.parents[0].kind, by_id[c.parents[0].id]) if c.parents else None
                    for name, c in commits.items()}
        assert recorded == TRUTH
        assert commits["base"].branch == "run" and commits["ft3"].branch == "run"
        assert {commits["fork2"].branch, commits["tr2"].branch}.isdisjoint({"run"})
