"""``ckpt ui``: every page and API route of ``ckptrepo.ui.create_app`` over a small repository
(main with metrics and steps, a branch from its middle, a merge, a transfer, a tag, pruned
commits, hostile messages and names), on SQLite and PostgreSQL; errors, methods, security
headers, escaping, the package's files, a run without torch, and the ``ckpt ui`` command.

Pages are parsed with the standard library's ``html.parser`` into a small tree (``Page``), so
assertions look at elements (``#commit-list li``), not at substrings of markup.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomllib
import torch
from html_dom import Page, page
from starlette.testclient import TestClient

import ckptrepo.ui
from ckptrepo import Repo
from ckptrepo.ui import create_app
from ckptrepo.ui.security import CSP

HOSTILE = "<img src=x onerror=alert(1)>"
SCRIPT_BREAK = "</script><script>alert(1)</script>"
ODD_METRIC = "<i>acc</i>&"  # names may hold anything; branch names may not (letters, digits, . _ - /)
ODD_KEY = "<b>odd</b>"
ODD_TENSOR = "<b>odd<%2Fb>"  # its entry name: a "/" inside a key is escaped (``state.join_path``)
UI_DIR = Path(ckptrepo.ui.__file__).resolve().parent
ROOT = Path(__file__).resolve().parents[2]


# -- the repository ----------------------------------------------------------------------------


@dataclass
class Lineage:
    repo: Repo
    path: Path
    main: list[str]  # main's first-parent chain, oldest first, the merge last
    feature: list[str]  # feature/x's own commits, oldest first
    fork: str  # where feature/x starts (main's middle)
    merge: str
    transfer: str
    hostile: str  # the commit whose message is HOSTILE
    tagged: str
    pruned: tuple[str, ...]


def _state(w: torch.Tensor, **extra: torch.Tensor) -> dict[str, Any]:
    return {"model": {"w": w, "b": torch.zeros(16)}, **extra}


def _build(repo: Repo, path: Path) -> Lineage:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 64, generator=g)
    main = []
    for i in range(5):
        w = w + 0.01 * torch.randn(64, 64, generator=g)
        message = HOSTILE if i == 1 else f"main {i}\n\nsecond line of main {i}"
        c = repo.commit(_state(w), step=100 * i, epoch=i // 2, message=message, blocking=True,
                        metrics={"loss": 2.0 / (i + 1), ODD_METRIC: i / 10}, config={"lr": 0.1, "note": HOSTILE})
        main.append(c.wait().id)
    fork = main[2]
    repo.branch("feature/x", at=fork)
    f = repo.checkout(fork)["model"]["w"]
    feature = []
    for i in range(3):
        f = f * 1.5  # large changes: the diff against main orders by them
        extra = {ODD_KEY: torch.tensor([1.0, float("nan"), float("inf")]) if i == 2 else torch.ones(3)}
        c = repo.commit(_state(f, **extra), branch="feature/x", step=300 + 100 * i, message=f"feature {i}",
                        metrics={"loss": 1.0 / (i + 2)}, blocking=True).wait()
        feature.append(c.id)
    merge = repo.commit(_state(w), parents=[main[-1], feature[-1]], step=500, message="merge feature/x",
                        metrics={"loss": 0.2}, blocking=True).wait().id
    main.append(merge)
    transfer = repo.commit({"student": {"w": w[:8].clone()}}, branch="distill", transfer_from="main", step=0,
                           message=SCRIPT_BREAK, blocking=True).wait().id
    repo.tag("v1.0", at=main[1])
    pruned = repo.prune(keep_last=1, branches=["main"]).pruned
    return Lineage(repo, path, main, feature, fork, merge, transfer, main[1], main[1], pruned)


@pytest.fixture(scope="module", params=[pytest.param("sqlite", id="sqlite"),
                                        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)])
def lineage(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
            pg_schemas: Any) -> Iterator[Lineage]:
    """The repository of this module's tests, built once per database."""
    path = tmp_path_factory.mktemp(f"ui-{request.param}")
    if request.param == "sqlite":
        with Repo.init(path, chunk_size=4096) as repo:
            yield _build(repo, path)
        return
    if pg_schemas is None:
        pytest.skip("CKPT_TEST_POSTGRES_URL is not set")
    with pg_schemas() as url, Repo.init(path, db_url=url, chunk_size=4096) as repo:
        yield _build(repo, path)


@pytest.fixture(scope="module")
def client(lineage: Lineage) -> Iterator[TestClient]:
    with TestClient(create_app(lineage.repo)) as c:
        yield c


def short(cid: str) -> str:
    return cid[:10]


# -- the graph -----------------------------------------------------------------------------------


def test_repo_graph_reads_the_lineage_leanly(lineage: Lineage) -> None:
    """``Repo.graph``, the facade's read behind the graph: what ``log`` says, in fewer columns."""
    repo = lineage.repo
    graph = repo.graph()
    commits = {c.id: c for c in repo.log()}
    assert [n.id for n in graph.nodes] == sorted(commits, key=lambda i: (
        next(n.generation for n in graph.nodes if n.id == i), commits[i].created_at, i))
    for n in graph.nodes:
        c = commits[n.id]
        assert (n.title, n.step, n.branch, n.pruned, n.created_at) == (
            c.message.split("\n")[0], c.step, c.branch, c.pruned, c.created_at)
        assert n.generation == 1 + max((next(m.generation for m in graph.nodes if m.id == p.id) for p in c.parents),
                                       default=0)
    assert {(e.child, e.parent, e.kind, e.position) for e in graph.edges} == {
        (c.id, p.id, p.kind, i) for c in commits.values() for i, p in enumerate(c.parents)}
    assert [(r.kind, r.name) for r in graph.refs] == [("branch", "distill"), ("branch", "feature/x"),
                                                       ("branch", "main"), ("tag", "v1.0")]
    assert graph.to_json()["nodes"][0]["short_id"] == graph.nodes[0].id[:10]
    part = repo.graph("feature/x~1")
    assert {n.id for n in part.nodes} == {lineage.feature[-2], *repo.ancestors(lineage.feature[-2])}
    assert {e.child for e in part.edges} <= {n.id for n in part.nodes} and part.refs == graph.refs




def test_the_graph_api_holds_every_commit_laid_out_with_edges_of_every_kind(lineage: Lineage,
                                                                          client: TestClient) -> None:
    data = client.get("/api/graph").json()
    nodes = {n["id"]: n for n in data["nodes"]}
    assert set(nodes) == {c.id for c in lineage.repo.log()}
    assert len(nodes) == 10
    kinds = {(e["child"], e["parent"]): e["kind"] for e in data["edges"]}
    assert kinds[(lineage.merge, lineage.feature[-1])] == "merge"
    assert kinds[(lineage.merge, lineage.main[-2])] == "parent"
    assert kinds[(lineage.transfer, lineage.merge)] == "transfer"
    assert kinds[(lineage.feature[0], lineage.fork)] == "parent"
    assert set(kinds.values()) == {"parent", "merge", "transfer"}
    assert len(kinds) == sum(len(c.parents) for c in lineage.repo.log())
    for e in data["edges"]:  # parents are drawn below their children
        assert nodes[e["parent"]]["y"] < nodes[e["child"]]["y"]
    places = [(n["x"], n["y"]) for n in data["nodes"]]
    assert len(set(places)) == len(places)  # no two commits on one spot
    assert {n["x"] for n in data["nodes"] if n["id"] in lineage.main} == {0}  # main's history is lane 0
    assert len({nodes[c]["x"] for c in lineage.feature}) == 1  # a branch's commits share a lane
    assert nodes[lineage.feature[0]]["x"] != 0
    assert data["lanes"] == 1 + max(x for x, _ in places) and data["rows"] == 1 + max(y for _, y in places)
    assert lineage.pruned and {n["id"] for n in data["nodes"] if n["pruned"]} == set(lineage.pruned)
    assert "main" in nodes[lineage.merge]["refs"] and "tag:v1.0" in nodes[lineage.tagged]["refs"]
    assert nodes[lineage.hostile]["message"] == HOSTILE
    assert nodes[lineage.main[0]]["message"] == "main 0"  # the first line only
    assert nodes[lineage.main[0]]["short"] == short(lineage.main[0]) and nodes[lineage.main[0]]["step"] == 0
    assert {b["name"] for b in data["branches"]} == {"main", "feature/x", "distill"}
    assert [t["name"] for t in data["tags"]] == ["v1.0"] and data["head"] is None


def test_the_graph_page_lists_every_commit_and_embeds_the_graph(lineage: Lineage, client: TestClient) -> None:
    doc = page(client.get("/"))
    items = doc.by_id("commit-list").find_all("li")
    assert {li.attrs["data-commit"] for li in items} == {c.id for c in lineage.repo.log()}
    for li in items:
        link = li.find_all("a")[0]
        assert link.attrs["href"] == f"/commit/{li.attrs['data-commit']}"
        assert link.text == short(li.attrs["data-commit"])
    by_id = {li.attrs["data-commit"]: li for li in items}
    assert HOSTILE in by_id[lineage.hostile].text  # as text
    assert "step 100" in by_id[lineage.hostile].text and "main" in by_id[lineage.hostile].text
    assert "pruned" in by_id[lineage.pruned[0]].attrs.get("class", "")
    ys = [n["y"] for n in client.get("/api/graph").json()["nodes"]]
    assert len(items) == len(ys)
    assert items[0].attrs["data-commit"] == lineage.transfer  # newest (highest row) first
    embedded = json.loads(doc.by_id("graph-data").text)
    assert embedded == client.get("/api/graph").json()
    options = [o.attrs["value"] for o in doc.by_id("branch-filter").find_all("option")]
    assert options == ["", "distill", "feature/x", "main"]
    for element in ("graph", "zoom-in", "zoom-out", "zoom-fit", "graph-legend"):
        doc.by_id(element)
    legend = doc.by_id("graph-legend").text
    assert all(word in legend for word in ("parent", "merge", "transfer", "pruned"))


def test_the_branch_filter_shows_that_branchs_ancestors(lineage: Lineage, client: TestClient) -> None:
    expected = {lineage.feature[-1], *lineage.repo.ancestors("feature/x")}
    data = client.get("/api/graph", params={"branch": "feature/x"}).json()
    assert {n["id"] for n in data["nodes"]} == expected
    assert data["head"] == lineage.feature[-1]
    assert all(e["child"] in expected and e["parent"] in expected for e in data["edges"])
    assert {n["x"] for n in data["nodes"] if n["id"] in lineage.feature} == {0}  # the filtered branch is lane 0
    doc = page(client.get("/", params={"branch": "feature/x"}))
    assert {li.attrs["data-commit"] for li in doc.by_id("commit-list").find_all("li")} == expected
    selected = [o for o in doc.by_id("branch-filter").find_all("option") if "selected" in o.attrs]
    assert [o.attrs["value"] for o in selected] == ["feature/x"]


# -- a commit ------------------------------------------------------------------------------------


def test_the_commit_page_shows_fields_parents_metrics_and_tensors(lineage: Lineage, client: TestClient) -> None:
    merge = lineage.repo.get_commit(lineage.merge)
    doc = page(client.get(f"/commit/{short(lineage.merge)}"))
    assert doc.by_id("message").tag == "pre" and doc.by_id("message").text == "merge feature/x"
    assert doc.by_id("commit-id").text == lineage.merge
    assert doc.by_id("field-step").text == "500" and doc.by_id("field-author").text == merge.author
    assert doc.by_id("field-host").text == merge.host and "main" in doc.by_id("field-refs").text
    assert doc.by_id("field-pruned").text == "no"
    parents = doc.by_id("parents").find_all("li")
    assert [(li.attrs["data-commit"], li.attrs["data-kind"]) for li in parents] == [
        (lineage.main[-2], "parent"), (lineage.feature[-1], "merge")]
    assert parents[1].find_all("a")[0].attrs["href"] == f"/commit/{lineage.feature[-1]}"
    children = doc.by_id("children").find_all("li")
    assert [(li.attrs["data-commit"], li.attrs["data-kind"]) for li in children] == [(lineage.transfer, "transfer")]
    metrics = {tr.attrs["data-metric"]: tr for tr in doc.by_id("metrics").find_all("tr") if "data-metric" in tr.attrs}
    assert set(metrics) == {"loss"} and "0.2" in metrics["loss"].text
    for element in ("ingest-logical", "ingest-new", "ingest-stored", "ingest-stall", "ingest-persist"):
        doc.by_id(element)
    rows = {tr.attrs["data-tensor"]: tr for tr in doc.by_id("tensors").find_all("tr") if "data-tensor" in tr.attrs}
    assert set(rows) == {"model/w", "model/b"}
    history = rows["model/w"].find_all("a", class_="history-link")[0].attrs["href"]
    assert history == f"/tensor/model/w?along={lineage.merge}"
    assert doc.by_id("diff-parent").attrs["href"] == f"/diff/{lineage.main[-2]}/{lineage.merge}"
    assert client.get(history).status_code == 200
    assert client.get(doc.by_id("diff-parent").attrs["href"]).status_code == 200


def test_the_commit_page_flags_non_finite_tensors_and_pruned_commits(lineage: Lineage, client: TestClient) -> None:
    doc = page(client.get(f"/commit/{lineage.feature[-1]}"))
    rows = {tr.attrs["data-tensor"]: tr for tr in doc.by_id("tensors").find_all("tr") if "data-tensor" in tr.attrs}
    assert "nonfinite" in rows[ODD_TENSOR].attrs.get("class", "").split()
    assert "nonfinite" not in rows["model/w"].attrs.get("class", "")
    assert rows[ODD_TENSOR].find_all("td", class_="num nan-count")[0].text == "1"
    history = rows[ODD_TENSOR].find_all("a", class_="history-link")[0].attrs["href"]
    assert client.get(history).status_code == 200  # a name with <, > and / goes through the link
    pruned = page(client.get(f"/commit/{lineage.pruned[0]}"))
    assert pruned.by_id("field-pruned").text.startswith("yes") and pruned.by_id("pruned-badge")


@pytest.mark.parametrize("rev", ["main", "main~1", "v1.0", "feature/x", "feature/x~1", "main^2", "distill"])
def test_any_revision_names_a_commit_page(lineage: Lineage, client: TestClient, rev: str) -> None:
    expected = lineage.repo.resolve(rev)
    assert page(client.get(f"/commit/{rev}")).by_id("commit-id").text == expected
    assert page(client.get("/commit", params={"rev": rev})).by_id("commit-id").text == expected
    assert client.get(f"/api/commits/{rev}").json()["id"] == expected


def test_the_commit_api_is_to_json_plus_tensors(lineage: Lineage, client: TestClient) -> None:
    data = client.get(f"/api/commits/{lineage.feature[-1]}").json()
    commit = lineage.repo.get_commit(lineage.feature[-1])
    expected = commit.to_json()
    assert {k: data[k] for k in expected} == json.loads(json.dumps(expected))
    tensors = {t["name"]: t for t in data["tensors"]}
    assert set(tensors) == {"model/w", "model/b", ODD_TENSOR}
    stats = tensors[ODD_TENSOR]["stats"]
    assert (stats["nan_count"], stats["inf_count"], stats["mean"]) == (1, 1, 1.0)  # statistics of the finite values
    assert tensors["model/w"]["shape"] == [64, 64]


def test_the_log_api_pages_and_filters(lineage: Lineage, client: TestClient) -> None:
    everything = [c.id for c in lineage.repo.log()]
    data = client.get("/api/commits", params={"limit": 3, "offset": 2}).json()
    assert [c["id"] for c in data["commits"]] == everything[2:5]
    where = "step >= 300 and loss < 1"
    found = client.get("/api/commits", params={"rev": "main", "where": where}).json()
    assert {c["id"] for c in found["commits"]} == {c.id for c in lineage.repo.log("main", where=where)}
    bad = client.get("/api/commits", params={"where": "step <"})
    assert bad.status_code == 400 and bad.json()["error"].startswith("invalid where expression") and bad.json()["hint"]
    assert client.get("/api/commits", params={"limit": "many"}).status_code == 400
    assert client.get("/api/commits", params={"offset": "-1"}).status_code == 400
    assert client.get("/api/commits", params={"where": "nosuchmetric > 1"}).status_code == 400


# -- diff, history, metrics -------------------------------------------------------------------------


def test_the_diff_is_sorted_by_magnitude(lineage: Lineage, client: TestClient) -> None:
    data = client.get("/api/diff", params={"a": lineage.fork, "b": "feature/x"}).json()
    magnitudes = [t["magnitude"] for t in data["tensors"]]
    assert magnitudes == sorted(magnitudes, reverse=True)
    status = {t["name"]: t["status"] for t in data["tensors"]}
    assert status == {"model/w": "changed", "model/b": "unchanged", ODD_TENSOR: "added"}
    assert data["tensors"][0]["name"] == ODD_TENSOR and data["tensors"][0]["magnitude"] == 1.0  # added counts 1
    w = next(t for t in data["tensors"] if t["name"] == "model/w")
    assert w["magnitude"] == pytest.approx(1 - 1 / 1.5 ** 3)  # |Δ‖w‖| / max(‖a‖, ‖b‖) for w * 1.5³
    assert data["counts"] == {"added": 1, "removed": 0, "changed": 1, "unchanged": 1} and "largest" in data["order"]
    doc = page(client.get(f"/diff/{short(lineage.fork)}/{short(lineage.feature[-1])}"))
    rows = [tr for tr in doc.by_id("diff").find_all("tr") if "data-tensor" in tr.attrs]
    assert [tr.attrs["data-tensor"] for tr in rows] == [t["name"] for t in data["tensors"]]
    assert [tr.attrs["data-status"] for tr in rows] == [t["status"] for t in data["tensors"]]
    assert doc.by_id("hide-unchanged").attrs["type"] == "checkbox"
    assert "largest change first" in doc.by_id("diff-order").text
    same = client.get("/diff", params={"a": "feature/x", "b": lineage.feature[-1]})
    assert same.status_code == 200 and "0 changed" in page(same).by_id("diff-counts").text


def test_the_tensor_page_charts_and_tables_its_history(lineage: Lineage, client: TestClient) -> None:
    chain = [lineage.feature[-1], *lineage.repo.ancestors("feature/x", kinds=["parent"])]
    doc = page(client.get("/tensor/model/w", params={"along": "feature/x"}))
    rows = [tr for tr in doc.by_id("history").find_all("tr") if "data-commit" in tr.attrs]
    assert [tr.attrs["data-commit"] for tr in rows] == chain
    assert doc.by_id("tensor-name").text == "model/w"
    series = json.loads(doc.by_id("history-data").text)
    assert series["x_axis"] == "step" and series["x"] == [0, 100, 200, 300, 400, 500]
    assert series["commit"] == chain[::-1] and len(series["l2_norm"]) == len(chain)
    assert series["changed_fraction"][0] == 1.0  # the root: every chunk is new
    for chart in ("chart-norm", "chart-std", "chart-change", "chart-deltas"):
        doc.by_id(chart)
    api = client.get("/api/history/model/w", params={"along": "feature/x"}).json()
    assert [p["commit_id"] for p in api["points"]] == chain[::-1] and api["head"] == lineage.feature[-1]
    assert api["points"][-1]["tensor"]["name"] == "model/w" and "deltas" in api["points"][-1]
    assert client.get("/api/history", params={"name": "model/w", "limit": 2}).json()["points"][-1]["commit_id"] == \
        lineage.merge
    odd = client.get("/api/history", params={"name": ODD_TENSOR, "along": "feature/x"}).json()
    assert odd["points"][-1]["tensor"]["stats"]["nan_count"] == 1 and odd["points"][0]["status"] == "absent"
    assert page(client.get("/tensor", params={"name": ODD_TENSOR, "along": "feature/x"})).by_id("tensor-name").text \
        == ODD_TENSOR


def test_the_metrics_page_and_api(lineage: Lineage, client: TestClient) -> None:
    data = client.get("/api/metrics", params=[("branch", "main"), ("branch", "feature/x"), ("name", "loss"),
                                              ("name", ODD_METRIC)]).json()
    assert data["x_axis"] == "step" and data["names"] == ["loss", ODD_METRIC]
    series = {(s["branch"], s["name"]): s["points"] for s in data["series"]}
    assert set(series) == {("main", "loss"), ("main", ODD_METRIC), ("feature/x", "loss"), ("feature/x", ODD_METRIC)}
    assert [p["x"] for p in series[("main", "loss")]] == [0, 100, 200, 300, 400, 500]
    assert [p["x"] for p in series[("feature/x", "loss")]] == [0, 100, 200, 300, 400, 500]
    assert series[("main", "loss")][-1] == {"x": 500, "y": 0.2, "step": 500, "commit": lineage.merge}
    assert [p["x"] for p in series[("feature/x", ODD_METRIC)]] == [0, 100, 200]
    doc = page(client.get("/metrics", params=[("branch", "feature/x"), ("name", ODD_METRIC)]))
    checked = {(i.attrs["name"], i.attrs["value"]) for i in doc.by_id("metrics-form").find_all("input")
               if "checked" in i.attrs}
    assert checked == {("branch", "feature/x"), ("name", ODD_METRIC)}
    offered = {(i.attrs["name"], i.attrs["value"]) for i in doc.by_id("metrics-form").find_all("input")}
    branches = {("branch", b) for b in ("main", "feature/x", "distill")}
    assert offered == branches | {("name", "loss"), ("name", ODD_METRIC)}
    api = doc.by_id("metrics-chart").attrs["data-api"]
    assert client.get(api).json()["series"][0]["name"] == ODD_METRIC
    default = page(client.get("/metrics"))
    assert client.get(default.by_id("metrics-chart").attrs["data-api"]).status_code == 200
    unknown = client.get("/api/metrics", params={"name": "lsos"})
    assert unknown.status_code == 400 and "loss" in unknown.json()["hint"]
    assert client.get("/api/metrics", params={"branch": "nope", "name": "loss"}).status_code == 404
    assert client.get("/metrics", params={"branch": "nope"}).status_code == 404
    assert client.get("/api/branches").json()["current"] == "main"
    assert client.get("/api/metric-names").json() == {"names": sorted(["loss", ODD_METRIC])}
    assert client.get("/api/metrics").json()["names"] == ["loss"]  # by default a loss, along every branch
    labels = [o.text.strip() for o in default.by_id("branch-choices").find_all("label")]
    assert labels == ["distill", "feature/x", "main"]


def test_json_has_no_nan_or_infinity() -> None:
    from datetime import datetime, timezone

    from ckptrepo.ui.data import json_safe

    when = datetime(2026, 1, 2, tzinfo=timezone.utc)
    assert json_safe({"a": float("nan"), "b": [float("inf"), 1.5, (2, -float("inf"))], "c": when, 3: "x"}) == \
        {"a": None, "b": [None, 1.5, [2, None]], "c": "2026-01-02T00:00:00+00:00", "3": "x"}


# -- errors, methods, headers, escaping ---------------------------------------------------------------


def test_unknown_revisions_and_tensors_are_404_with_message_and_hint(client: TestClient) -> None:
    for url in ("/commit/nope", "/diff/nope/main", "/tensor/model/w?along=nope", "/?branch=nope"):
        response = client.get(url)
        assert response.status_code == 404, url
        doc = page(response)
        assert doc.by_id("error-message").text == "Unknown revision 'nope'." and doc.by_id("error-hint").text
    for url in ("/api/commits/nope", "/api/diff/main/nope", "/api/graph?branch=nope",
                "/api/history/model/w?along=nope"):
        response = client.get(url)
        assert response.status_code == 404 and response.json()["error"] == "Unknown revision 'nope'.", url
        assert response.json()["hint"]
    for url in ("/tensor/no/such", "/api/history/no/such"):
        response = client.get(url)
        assert response.status_code == 404 and "no/such" in response.text
    assert client.get("/nothing/here").status_code == 404 and client.get("/api/nothing").json()["error"]
    assert client.get("/commit/main~999").status_code == 404
    assert client.get("/commit/ma").status_code in (400, 404)  # too short a prefix: not a crash


def test_hostile_paths_read_no_file(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    real_open = open

    def spying_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", spying_open)
    for url in ("/tensor/..%2F..%2F..%2Fetc%2Fpasswd", "/api/history/..%2F..%2F..%2Fetc%2Fpasswd",
                "/tensor?name=../../../../etc/passwd", "/static/..%2F..%2F..%2F..%2F..%2Fetc%2Fpasswd",
                "/static/%2Fetc%2Fpasswd", "/commit/..%2F..%2Fetc%2Fpasswd", "/api/commits/..%2F..%2Fetc%2Fpasswd"):
        response = client.get(url)
        assert response.status_code in (400, 404), url
        assert "root:" not in response.text
    assert not [p for p in opened if "passwd" in p]
    traversal = client.get("/api/history/..%2F..%2F..%2Fetc%2Fpasswd").json()
    assert "'../../../etc/passwd'" in traversal["error"]  # the name went to the repository, as a name
    assert client.get("/static/../pages.py").status_code == 404 and client.get("/static/style.css").status_code == 200


def test_only_get_and_head_are_allowed(client: TestClient) -> None:
    for url in ("/", "/commit/main", "/api/graph", "/api/commits", "/static/style.css", "/nothing"):
        for method in ("POST", "PUT", "PATCH", "DELETE", "OPTIONS"):
            response = client.request(method, url)
            assert response.status_code == 405, (method, url)
            assert response.headers["allow"] == "GET, HEAD"
            assert response.headers["content-security-policy"] == CSP
        assert client.head(url).status_code in (200, 404)
    assert client.post("/api/graph").json()["error"] == "method not allowed"


PAGES = ["/", "/?branch=feature/x", "/commit/main", "/commit/v1.0", "/metrics", "/tensor/model/w",
         "/diff/main~1/main", "/commit/nope", "/nothing"]


def test_every_response_carries_the_security_headers(lineage: Lineage, client: TestClient) -> None:
    urls = [*PAGES, f"/commit/{lineage.hostile}", f"/commit/{lineage.transfer}", "/api/graph", "/api/commits",
            "/api/commits/nope", "/api/commits?where=(", "/static/style.css", "/static/graph.js", "/static/nope.js"]
    for url in urls:
        response = client.get(url)
        assert response.headers["content-security-policy"] == CSP, url
        assert response.headers["x-content-type-options"] == "nosniff", url
        assert response.headers["referrer-policy"] == "no-referrer", url
        if not url.startswith("/static/"):
            assert response.headers["cache-control"] == "no-store", url
    assert client.post("/").headers["content-security-policy"] == CSP
    assert CSP == ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                   "object-src 'none'; base-uri 'none'; frame-ancestors 'none'")


def test_hostile_strings_are_shown_as_text_never_as_markup(lineage: Lineage, client: TestClient) -> None:
    urls = [*PAGES, f"/commit/{lineage.hostile}", f"/commit/{lineage.transfer}", f"/commit/{lineage.feature[-1]}",
            f"/diff/{lineage.fork}/{lineage.feature[-1]}", "/tensor?name=%3Cb%3Eodd%3C%252Fb%3E&along=feature/x",
            "/metrics?branch=main&name=" + ODD_METRIC.replace("&", "%26"), "/commit/%3Cscript%3E"]
    for url in urls:
        html = client.get(url).text
        for raw in (HOSTILE, SCRIPT_BREAK, ODD_TENSOR, "<b>odd", "<i>acc</i>", "<script>"):
            assert raw not in html, (url, raw)
        # Every script element is one of ours: a file of /static/ or a JSON data block.
        for script in Page(html).root.find_all("script"):
            assert script.attrs.get("src", "").startswith("/static/") or script.attrs.get("type") == "application/json"
            assert not script.attrs.get("src") or not script.text.strip()
        assert not re.search(r"<[^>]+\son[a-z]+\s*=", html), url  # no inline event handler anywhere
        assert not re.search(r"<[^>]+\sstyle\s*=", html), url  # nor inline style (CSP would block it)
    doc = page(client.get(f"/commit/{lineage.hostile}"))
    assert doc.by_id("message").text == HOSTILE
    assert "&lt;img src=x onerror=alert(1)&gt;" in client.get(f"/commit/{lineage.hostile}").text
    assert HOSTILE in doc.by_id("config").text  # the config's string, as text
    assert page(client.get(f"/commit/{lineage.transfer}")).by_id("message").text == SCRIPT_BREAK
    assert "\\u003c/script\\u003e" in client.get("/").text  # the graph's data block escapes its markup
    metrics = page(client.get("/metrics", params={"name": ODD_METRIC}))
    assert ODD_METRIC in metrics.by_id("metric-choices").text
    assert client.get("/api/graph").json()["nodes"] and HOSTILE in client.get("/api/graph").text


# -- the package's files ----------------------------------------------------------------------------


def _package_files() -> list[Path]:
    return sorted(p for p in (UI_DIR / "templates").rglob("*") if p.is_file()) + \
        sorted(p for p in (UI_DIR / "static").rglob("*") if p.is_file())


def test_templates_and_static_files_name_nothing_outside_the_app() -> None:
    files = _package_files()
    assert {p.name for p in files} >= {"base.html", "graph.html", "commit.html", "metrics.html", "tensor.html",
                                       "diff.html", "error.html", "style.css", "common.js", "graph.js", "chart.js"}
    for path in files:
        text = path.read_text()
        assert not re.search(r"https?://", text, re.IGNORECASE), path
        assert not re.search(r"""(src|href|url)\s*[=(]\s*["']?//""", text), path  # protocol-relative URLs
        assert "@import" not in text, path
    for path in (UI_DIR / "static").glob("*.js"):
        code = path.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in code, (path, sink)
    for path in (UI_DIR / "templates").glob("*.html"):
        template = path.read_text()
        assert "|safe" not in template.replace(" ", "") and "autoescape false" not in template, path
        for script in re.findall(r"<script[^>]*>", template):
            assert 'src="/static/' in script or 'type="application/json"' in script, (path, script)


def test_the_wheel_ships_the_templates_and_static_files() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    setuptools = config["tool"]["setuptools"]
    assert "ckptrepo.ui" in setuptools["packages"]
    globs = setuptools["package-data"]["ckptrepo.ui"]
    for path in _package_files():
        relative = path.relative_to(UI_DIR).as_posix()
        assert any(fnmatch(relative, g) for g in globs), relative
    assert config["project"]["optional-dependencies"]["ui"] == ["starlette>=0.37", "uvicorn>=0.29", "jinja2>=3.1"]


# -- without torch; the command ---------------------------------------------------------------------


TORCH_FREE_PROBE = """
import sys
from starlette.testclient import TestClient
import ckptrepo
from ckptrepo.ui import create_app
with ckptrepo.Repo.open(sys.argv[1]) as repo, TestClient(create_app(repo)) as client:
    for url in sys.argv[2:]:
        assert client.get(url).status_code == 200, url
print("torch" in sys.modules, "numpy" in sys.modules)
"""


def test_the_ui_serves_every_route_without_importing_torch(lineage: Lineage) -> None:
    if lineage.repo.config.db_url is not None:
        pytest.skip("once, on SQLite")
    urls = ["/", "/commit/main", "/metrics", "/tensor/model/w", "/diff/main~1/main", "/api/graph",
            "/api/commits/main", "/api/commits", "/api/history/model/w", "/api/diff/main~1/main",
            "/api/metrics?name=loss", "/api/branches", "/static/graph.js"]
    done = subprocess.run([sys.executable, "-c", TORCH_FREE_PROBE, str(lineage.path), *urls], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


def _ckpt(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptrepo.cli.app", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_ckpt_ui_help_and_a_missing_extra() -> None:
    done = _ckpt("ui", "--help")
    assert done.returncode == 0 and "--host" in done.stdout and "--port" in done.stdout and "--open" in done.stdout
    blocker = ("import sys, runpy; sys.modules['starlette'] = None; sys.argv = ['ckpt', 'ui'];"
               " runpy.run_module('ckptrepo.cli.app', run_name='__main__')")
    missing = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2, missing.stderr
    assert "pip install 'ckptrepo[ui]'" in missing.stderr


class _Server:
    """``ckpt ui`` running in a process of its own until ``stop``."""

    def __init__(self, repo: Path, *args: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "ckptrepo.cli.app", "--repo", str(repo), "ui", *args],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert self.process.stdout is not None
            line = self.process.stdout.readline()
            found = re.search(r"(http://\S+/)", line)
            assert found, (line, self.process.stderr.read() if self.process.poll() is not None else "")
            self.url = found.group(1)
            deadline = time.monotonic() + 30
            while True:  # the socket is bound before the line is printed; wait for the app to answer
                try:
                    httpx.get(self.url + "api/branches", timeout=2)
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> str:
        self.process.terminate()
        _, err = self.process.communicate(timeout=30)
        return err


def test_ckpt_ui_serves_the_repository(lineage: Lineage) -> None:
    if lineage.repo.config.db_url is not None:
        pytest.skip("once, on SQLite")
    server = _Server(lineage.path, "--port", "0")
    try:
        assert server.url.startswith("http://127.0.0.1:")
        response = httpx.get(server.url + "api/graph", timeout=10)
        assert response.status_code == 200 and len(response.json()["nodes"]) == 10
        assert response.headers["content-security-policy"] == CSP
        assert httpx.get(server.url, timeout=10).status_code == 200
        port = int(server.url.rsplit(":", 1)[1].strip("/"))
        # A DNS-rebinding page reaches the server under its own host name: refused.
        rebound = httpx.get(server.url + "api/graph", headers={"host": f"attacker.example:{port}"}, timeout=10)
        assert rebound.status_code == 400
        assert httpx.get(f"http://localhost:{port}/api/branches", timeout=10).status_code == 200
        busy = _ckpt("--repo", str(lineage.path), "ui", "--port", str(port))
        assert busy.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in busy.stderr
    finally:
        err = server.stop()
    assert "Traceback" not in err


def test_ckpt_ui_warns_when_listening_beyond_loopback(lineage: Lineage) -> None:
    if lineage.repo.config.db_url is not None:
        pytest.skip("once, on SQLite")
    with socket.socket() as probe:  # some sandboxes cannot bind the wildcard address
        try:
            probe.bind(("0.0.0.0", 0))
        except OSError:
            pytest.skip("cannot bind 0.0.0.0 here")
    server = _Server(lineage.path, "--host", "0.0.0.0", "--port", "0")
    try:
        assert server.url.startswith("http://127.0.0.1:")
        assert httpx.get(server.url + "api/branches", timeout=10).status_code == 200
    finally:
        err = server.stop()
    assert "warning:" in err and "no authentication" in err
