"""What a new user hit (issue 45): the current branch deleted under HEAD, renaming branches, ``ckpt status``,
``import-run`` run twice, pruned commits unmarked in ``history``.

Each test failed on the code before the fix."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from starlette.testclient import TestClient
from typer.testing import CliRunner, Result

import ckptrepo
from ckptrepo import Repo, errors
from ckptrepo.cli.app import app
from ckptrepo.formats import read_state
from ckptrepo.ui import create_app

Run = Callable[..., Result]
CHUNK = 4096


@pytest.fixture
def run(tmp_path: Path) -> Run:
    """``run(*args)``: ``ckpt --repo <tmp>/repo *args`` in-process (stdout and stderr apart)."""
    runner = CliRunner()

    def invoke(*args: str) -> Result:
        return runner.invoke(app, ["--repo", str(tmp_path / "repo"), *args])

    return invoke


def _state(seed: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((4, 4), float(seed)), "b": torch.arange(4) + seed}


# -- item 2: the current branch, renames, HEAD, status ----------------------------------------


def test_the_current_branch_cannot_be_deleted_so_the_next_commit_keeps_its_parent(tmp_path: Path) -> None:
    with Repo.init(tmp_path / "repo") as repo:
        first = repo.commit(_state(1), blocking=True).wait()
        repo.branch("other")
        for force in (False, True):
            with pytest.raises(errors.CurrentBranch, match="'main' is the current branch") as caught:
                repo.delete_branch("main", force=force)
            assert caught.value.hint and "checkout" in caught.value.hint and caught.value.exit_code == 2
        assert repo.head == "main" and [b.name for b in repo.branches()] == ["main", "other"]
        second = repo.commit(_state(2), blocking=True).wait()
        assert [p.id for p in second.parents] == [first.id]
        repo.switch("other")
        assert repo.delete_branch("main", force=True).name == "main"  # not current any more: allowed


def test_a_branch_may_not_be_named_head(tmp_path: Path, run: Run) -> None:
    with Repo.init(tmp_path / "repo") as repo:
        repo.commit(_state(1), blocking=True).wait()
        with pytest.raises(errors.InvalidRefName, match="HEAD"):
            repo.branch("HEAD")
        with pytest.raises(errors.InvalidRefName, match="HEAD"):
            repo.commit(_state(2), branch="HEAD", blocking=True)
        with pytest.raises(errors.InvalidRefName, match="HEAD"):
            repo.rename_branch("main", "HEAD")
        repo.tag("HEADS")  # only the exact name is taken
    refused = run("branch", "HEAD")
    assert refused.exit_code == 2 and "HEAD" in refused.stderr
    assert run("checkout", "-b", "HEAD").exit_code == 2
    with Repo.open(tmp_path / "repo") as repo:
        assert [b.name for b in repo.branches()] == ["main"]


def test_rename_branch_keeps_commits_and_lineage_and_the_current_branch_follows(tmp_path: Path) -> None:
    with Repo.init(tmp_path / "repo") as repo:
        a = repo.commit(_state(1), step=1, blocking=True).wait()
        b = repo.commit(_state(2), step=2, blocking=True).wait()
        repo.branch("exp", at=a.id)
        x = repo.commit(_state(3), branch="exp", step=3, blocking=True).wait()
        renamed = repo.rename_branch("main", "trunk")
        assert (renamed.name, renamed.kind, renamed.commit_id) == ("trunk", "branch", b.id)
        assert repo.head == "trunk" and (tmp_path / "repo" / ".ckpt" / "HEAD").read_text().strip() == "trunk"
        assert [c.id for c in repo.log("trunk")] == [b.id, a.id] and repo.get_commit("trunk").parents[0].id == a.id
        assert sorted(r.name for r in repo.branches()) == ["exp", "trunk"]
        with pytest.raises(errors.UnknownRevision):
            repo.resolve("main")
        c = repo.commit(_state(4), step=4, blocking=True).wait()  # on the renamed branch, on top of its head
        assert c.branch == "trunk" and [p.id for p in c.parents] == [b.id]
        # Renaming another branch leaves HEAD alone; an existing name is replaced only with force.
        with pytest.raises(errors.RefExists, match="'trunk' already exists"):
            repo.rename_branch("exp", "trunk")
        assert repo.resolve("trunk") == c.id and repo.resolve("exp") == x.id
        with pytest.raises(errors.UnknownRef, match="'nope'"):
            repo.rename_branch("nope", "other")
        with pytest.raises(errors.UsageError, match="already has that name"):
            repo.rename_branch("exp", "exp")
        replaced = repo.rename_branch("exp", "trunk", force=True)
        assert replaced.commit_id == x.id and repo.resolve("trunk") == x.id and repo.head == "trunk"
        assert [r.name for r in repo.branches()] == ["trunk"]
        assert [cm.id for cm in repo.log("trunk")] == [x.id, a.id]


def test_a_rename_is_journalled_so_a_rebuilt_database_has_the_new_name(tmp_path: Path, run: Run) -> None:
    with Repo.init(tmp_path / "repo") as repo:
        a = repo.commit(_state(1), blocking=True).wait()
        repo.branch("exp", at=a.id)
        b = repo.commit(_state(2), branch="exp", blocking=True).wait()
        repo.branch("gone", at=a.id)
        repo.rename_branch("exp", "feature")
        repo.rename_branch("main", "trunk")
        repo.rename_branch("feature", "gone", force=True)  # replaces gone (at a) with feature's head
    report = Repo.rebuild_database(tmp_path / "repo", replace=True)
    assert report.branches == 2
    with Repo.open(tmp_path / "repo") as repo:
        assert {r.name: r.commit_id for r in repo.branches()} == {"trunk": a.id, "gone": b.id}
    # The command line's rename, then `ckpt db rebuild`: the same.
    assert run("branch", "-m", "gone", "later").exit_code == 0
    rebuilt = run("db", "rebuild", "--replace", "--json")
    assert rebuilt.exit_code == 0, rebuilt.output
    with Repo.open(tmp_path / "repo") as repo:
        assert {r.name: r.commit_id for r in repo.branches()} == {"trunk": a.id, "later": b.id}
        assert repo.head == "trunk"


def test_ckpt_branch_move_renames_and_refuses_an_existing_name_without_force(tmp_path: Path, run: Run) -> None:
    assert run("init").exit_code == 0
    with Repo.open(tmp_path / "repo") as repo:
        a = repo.commit(_state(1), blocking=True).wait()
        repo.branch("exp")
    moved = run("branch", "-m", "main", "trunk")
    assert moved.exit_code == 0, moved.output
    assert f"renamed branch main to trunk ({a.short_id})" in moved.stdout
    listing = run("branch")
    assert "* trunk" in listing.stdout and "main" not in listing.stdout
    taken = run("branch", "-m", "exp", "trunk")
    assert taken.exit_code == 4 and "already exists" in taken.stderr
    forced = run("branch", "--move", "exp", "trunk", "--force", "--json")
    assert forced.exit_code == 0, forced.output
    assert json.loads(forced.stdout) == {"name": "trunk", "kind": "branch", "commit_id": a.id, "renamed_from": "exp"}
    assert run("branch", "-m", "trunk").exit_code == 2  # no NEW name
    assert run("branch", "-m").exit_code == 2
    assert run("branch", "-d", "-m", "trunk", "x").exit_code == 2
    assert run("branch", "-m", "nope", "x").exit_code == 3
    current = run("branch", "-d", "trunk")  # the current branch: refused by the library too
    assert current.exit_code == 2 and "current branch" in current.stderr
    with Repo.open(tmp_path / "repo") as repo:
        assert [r.name for r in repo.branches()] == ["trunk"] and repo.head == "trunk"


def test_ckpt_status_shows_the_branch_and_its_head(tmp_path: Path, run: Run) -> None:
    assert run("init").exit_code == 0
    empty = run("status")
    assert empty.exit_code == 0, empty.output
    assert "main" in empty.stdout and "no commits yet" in empty.stdout
    empty_json = json.loads(run("status", "--json").stdout)
    assert (empty_json["branch"], empty_json["exists"], empty_json["head"]) == ("main", False, None)
    assert empty_json["read_only"] is False and empty_json["database"].startswith("SQLite ")
    with Repo.open(tmp_path / "repo") as repo:
        c = repo.commit(_state(1), step=7, message="first one", blocking=True).wait()
    shown = run("status")
    assert shown.exit_code == 0
    assert c.short_id in shown.stdout and "step 7" in shown.stdout and "first one" in shown.stdout
    assert "no commits yet" not in shown.stdout
    doc = json.loads(run("status", "--json").stdout)
    assert (doc["branch"], doc["exists"], doc["head"]["id"], doc["head"]["step"]) == ("main", True, c.id, 7)
    assert doc["repo_dir"] == str(tmp_path / "repo" / ".ckpt") and doc["store"].startswith("local ")
    assert run("checkout", "-b", "fresh").exit_code == 0  # a new branch at the head: it has commits
    assert json.loads(run("status", "--json").stdout)["branch"] == "fresh"


# -- item 4: import-run twice ------------------------------------------------------------------


def _trainer_checkpoint(out: Path, step: int, scale: float = 1.0) -> Path:
    """A Hugging Face Trainer checkpoint-N folder: weights of odd dtypes and layouts, one tensor
    bigger than a chunk, and trainer_state.json."""
    folder = out / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    g = torch.Generator().manual_seed(step)
    save_file({"w": torch.full((8, 8), float(step) * scale), "big": torch.randn(3000, generator=g),  # 3 chunks
               "bf": torch.randn(5, 7, generator=g).to(torch.bfloat16), "mask": torch.rand(33, generator=g) > 0.5,
               "t": torch.randn(6, 4, generator=g).t().contiguous()}, str(folder / "model.safetensors"))
    (folder / "trainer_state.json").write_text(json.dumps(
        {"global_step": step, "epoch": step / 20, "log_history": [{"loss": 1.0 / step, "step": step}]}))
    return folder


def _lightning_checkpoint(out: Path, step: int, scale: float = 1.0, *, name: str | None = None) -> Path:
    """A Lightning .ckpt: a module's state_dict (a non-contiguous view, bfloat16, bool, a big
    tensor), optimizer state, loops, callbacks."""
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(step)
    base = torch.randn(40, 30, generator=g) * scale
    state = {"pytorch-lightning_version": "2.4.0", "global_step": step, "epoch": step // 20,
             "state_dict": {"layer.weight": base.t(), "layer.bias": torch.randn(30, generator=g).to(torch.bfloat16),
                            "mask": torch.rand(17, generator=g) > 0.5},
             "optimizer_states": [{"state": {0: {"step": torch.tensor(float(step)), "exp_avg": base * 0.1}},
                                   "param_groups": [{"lr": 0.01, "params": [0]}]}],
             "loops": {"fit_loop": {"epoch_progress": {"current": {"completed": step // 20}}}},
             "callbacks": {"ModelCheckpoint{'monitor': 'val_loss'}": {"monitor": "val_loss",
                                                                      "current_score": torch.tensor(1.0 / step)}}}
    path = out / (name or f"epoch={step // 20}-step={step}.ckpt")
    torch.save(state, path)
    return path


def _steps(repo_dir: Path, branch: str) -> list[tuple[int | None, str]]:
    with Repo.open(repo_dir) as repo:
        return [(c.step, c.id) for c in repo.log(branch)]


@pytest.mark.parametrize("kind", ["trainer", "lightning"])
def test_import_run_again_imports_only_what_is_new(tmp_path: Path, run: Run, kind: str) -> None:
    out = tmp_path / "out"
    make = _trainer_checkpoint if kind == "trainer" else _lightning_checkpoint
    for step in (20, 40):
        make(out, step)
    if kind == "lightning":
        shutil.copy(out / "epoch=2-step=40.ckpt", out / "last.ckpt")
    assert run("init", "--chunk-size", "4KiB").exit_code == 0
    first = run("import-run", str(out), "--json")
    assert first.exit_code == 0, first.output
    assert [c["step"] for c in json.loads(first.stdout)] == [20, 40]
    before = _steps(tmp_path / "repo", "main")
    assert [s for s, _ in before] == [40, 20]

    again = run("import-run", str(out), "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout) == [] and "nothing new to import" in again.stderr
    assert "already imported" in again.stderr
    assert _steps(tmp_path / "repo", "main") == before  # not 20, 40, 20, 40

    make(out, 60)
    third = run("import-run", str(out), "--json")
    assert third.exit_code == 0, third.output
    assert [c["step"] for c in json.loads(third.stdout)] == [60]
    after = _steps(tmp_path / "repo", "main")
    assert after[1:] == before and after[0][0] == 60
    with Repo.open(tmp_path / "repo") as repo:
        assert repo.get_commit(after[0][1]).parents[0].id == before[0][1]  # on top of what was imported

    # A checkpoint changed at an imported step: refused, and nothing imported (not even the new one).
    make(out, 80)
    changed = out / ("checkpoint-40" if kind == "trainer" else "epoch=2-step=40.ckpt")
    shutil.rmtree(changed) if changed.is_dir() else changed.unlink()
    make(out, 40, scale=2.0)
    conflict = run("import-run", str(out))
    assert conflict.exit_code == 4, conflict.output
    assert "step 40" in conflict.stderr and "Nothing was imported" in conflict.stderr
    assert _steps(tmp_path / "repo", "main") == after
    elsewhere = run("import-run", str(out), "-b", "rerun", "--json")  # what the hint suggests
    assert elsewhere.exit_code == 0 and [c["step"] for c in json.loads(elsewhere.stdout)] == [20, 40, 60, 80]


def test_import_run_compares_content_where_a_commit_lays_equal_tensors_out_otherwise(
        tmp_path: Path, run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    """A distributed commit cuts each rank's shard on its own grid, so equal tensors can have other
    ids than ``tensor_ids`` computes: the re-run then reads the stored tensors instead of refusing."""
    out = tmp_path / "out"
    for step in (20, 40):
        _trainer_checkpoint(out, step)
    assert run("init", "--chunk-size", "4KiB").exit_code == 0
    assert run("import-run", str(out)).exit_code == 0
    before = _steps(tmp_path / "repo", "main")
    real = ckptrepo.Repo.tensor_ids

    def other_layout(self: Repo, state: Any, **kw: Any) -> dict[str, str]:
        return {name: "0" * 64 if name == "big" else tid for name, tid in real(self, state, **kw).items()}

    monkeypatch.setattr(ckptrepo.Repo, "tensor_ids", other_layout)
    again = run("import-run", str(out))
    assert again.exit_code == 0, again.output
    assert _steps(tmp_path / "repo", "main") == before
    with Repo.open(tmp_path / "repo") as repo:
        state = read_state(out / "checkpoint-40")
        assert repo.holds("main", state) and not repo.holds("main~1", state)
        state["big"] = state["big"].clone()
        state["big"][-1] += 1  # in its last chunk
        assert not repo.holds("main", state)
    shutil.rmtree(out / "checkpoint-40")
    _trainer_checkpoint(out, 40, scale=3.0)
    assert run("import-run", str(out)).exit_code == 4


@pytest.mark.parametrize("fmt", ["safetensors", "torch", "hf", "state"])
def test_tensor_ids_are_the_ids_a_commit_stores(tmp_path: Path, fmt: str) -> None:
    g = torch.Generator().manual_seed(0)
    big = torch.randn(5000, generator=g)
    state: dict[str, Any] = {
        "big": big, "view": big[100:4100], "strided": torch.randn(64, 48, generator=g).t(),
        "bf16": torch.randn(3000, generator=g).to(torch.bfloat16), "bool": torch.rand(9000, generator=g) > 0.5,
        "f16": torch.randn(7, 5, generator=g).half(), "i64": torch.arange(1234), "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4), "f8": torch.randn(5000, generator=g).to(torch.float8_e4m3fn),
        "c64": torch.randn(50, dtype=torch.complex64, generator=g),
    }
    with Repo.init(tmp_path / "repo", chunk_size=CHUNK) as repo:
        if fmt == "state":
            state.update(param=torch.nn.Parameter(torch.randn(2000, 3, generator=g)), tied=state["big"])
            ids = repo.tensor_ids(state)
            committed = [repo.commit(state, branch="blocking", blocking=True).wait(),
                         repo.commit(state, branch="staged").wait()]
        else:
            files = {k: v.contiguous().clone() for k, v in state.items()}
            path = tmp_path / {"safetensors": "m.safetensors", "torch": "m.pt", "hf": "hf"}[fmt]
            if fmt == "hf":
                path.mkdir()
                save_file(files, str(path / "model.safetensors"))
            elif fmt == "safetensors":
                save_file(files, str(path))  # committed as the file's bytes, without torch
            else:
                torch.save(files, path)
            ids = repo.tensor_ids(read_state(path, mapped=True))
            committed = [repo.commit_file(path)]
        for commit in committed:
            stored = {t.name: t.tensor_id for t in repo.tensors(commit.id)}
            assert stored == ids
            assert repo.holds(commit.id, read_state(path) if fmt != "state" else state)


# -- item 5: pruned commits in history ---------------------------------------------------------


@pytest.fixture
def pruned_repo(db_url: str, tmp_path: Path) -> Any:
    with Repo.init(tmp_path / "repo", db_url=db_url, chunk_size=CHUNK) as repo:
        ids = [repo.commit({"model": {"w": torch.full((8,), float(i))}}, step=10 * i, blocking=True).wait().id
               for i in range(4)]
        pruned = repo.prune(keep_last=1).pruned
        assert set(pruned) == set(ids[:3])
        yield repo, ids


def test_history_marks_pruned_commits(pruned_repo: Any) -> None:
    repo, ids = pruned_repo
    points = repo.history("model/w")
    assert [(p.commit_id, p.pruned) for p in points] == [(ids[3], False), (ids[2], True), (ids[1], True),
                                                        (ids[0], True)]
    assert points[1].to_json()["pruned"] is True and points[0].to_json()["pruned"] is False
    assert [p.pruned for p in repo.history("model/w", limit=2)] == [False, True]


def test_ckpt_history_table_and_json_mark_pruned_commits(pruned_repo: Any) -> None:
    repo, ids = pruned_repo
    runner = CliRunner()
    base = ["--repo", str(repo.repo_dir.parent)]
    table = runner.invoke(app, [*base, "history", "model/w"])
    assert table.exit_code == 0, table.output
    lines = {line.split()[0]: line for line in table.stdout.splitlines() if line.strip()[:1].isalnum()}
    assert "(pruned)" not in lines[ids[3][:10]]
    assert all("(pruned)" in lines[i[:10]] for i in ids[:3])
    doc = json.loads(runner.invoke(app, [*base, "history", "model/w", "--json"]).stdout)
    points = doc if isinstance(doc, list) else doc["points"]
    assert {p["commit_id"]: p["pruned"] for p in points} == {ids[0]: True, ids[1]: True, ids[2]: True, ids[3]: False}


def test_the_ui_tensor_page_marks_pruned_commits(pruned_repo: Any) -> None:
    repo, ids = pruned_repo
    with TestClient(create_app(repo)) as client:
        html = client.get("/tensor/model/w").text
        api = client.get("/api/history/model/w").json()
    rows = {}
    for chunk in html.split("<tr ")[1:]:
        head = chunk.split(">", 1)[0]
        if 'data-commit="' in head:
            cid = head.split('data-commit="', 1)[1].split('"', 1)[0]
            rows[cid] = chunk.split("</tr>", 1)[0]
    assert set(rows) == set(ids)
    for cid in ids[:3]:
        assert "pruned" in rows[cid].split(">", 1)[0].split('class="', 1)[1] and "pruned-mark" in rows[cid]
    assert "pruned-mark" not in rows[ids[3]] and " pruned" not in rows[ids[3]].split(">", 1)[0]
    assert {p["commit_id"]: p["pruned"] for p in api["points"]} == {ids[0]: True, ids[1]: True, ids[2]: True,
                                                                   ids[3]: False}


# -- reading what this process just committed -------------------------------------------------


def test_a_read_after_a_commit_sees_that_commit_although_it_was_still_pending(tmp_path: Path) -> None:
    """``commit()`` returns once the state is copied; ``checkout``, ``export`` and ``load_tensor``
    of the branch right after it read that commit (they wait for this process's pending ones),
    not the head before it."""
    with Repo.init(tmp_path / "repo") as repo:
        repo.commit(_state(1), step=1).wait()
        for step in range(2, 6):
            handle = repo.commit(_state(step), step=step)  # not waited for
            assert torch.equal(repo.checkout("main")["w"], _state(step)["w"])
            assert torch.equal(repo.load_tensor("main", "b"), _state(step)["b"])
            assert handle.wait().step == step
        repo.commit(_state(9), step=9)
        repo.export("main", tmp_path / "out.safetensors")
        assert torch.equal(read_state(tmp_path / "out.safetensors")["w"], _state(9)["w"])
