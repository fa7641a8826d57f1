"""``ckpt ui`` over an explored lineage: a commit's annotations (current values, notes, the history
with superseded values), the method of a merge ``ckpt merge`` made (on the commit page, in the API
and on the graph), the similar commits (``/api/similar``: the catalog-only ``Repo.similar``) and
the metric charts' marks on annotated values; hostile notes, sources and methods stay text; no
route imports torch. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import html_dom
import httpx
import pytest
import torch
from html_dom import Node
from starlette.testclient import TestClient

from ckptrepo import Repo
from ckptrepo.ui import create_app

NOTE = "<script>alert(1)</script> & a second thought"
SOURCE = "<b>eval.py</b>"
ODD_METHOD = "<img src=x onerror=alert(1)>"


def page(response: httpx.Response) -> Node:
    assert response.status_code == 200, response.text
    return html_dom.page(response)


# -- the repository ----------------------------------------------------------------------------------


@dataclass
class Explored:
    repo: Repo
    path: Path
    main: list[str]  # oldest first; main[1] and main[2] annotated, main[3] logs "acc" itself
    ft: str  # a fine-tune from main[1]
    merge: str  # ckpt merge's ties of main[3] and ft over main[0]
    odd_merge: str  # a commit whose config has a merge's shape, with a hostile method
    not_merge: str  # a commit whose config holds a "merge" key that does not name its parents


def _build(repo: Repo, path: Path) -> Explored:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 64, generator=g)
    main = []
    for i in range(4):
        w = w + 0.01 * torch.randn(64, 64, generator=g)
        metrics = {"loss": 2.0 / (i + 1), **({"acc": 0.9} if i == 3 else {})}
        main.append(repo.commit({"w": w, "b": torch.zeros(16)}, step=100 * i, metrics=metrics,
                                message=f"main {i}", blocking=True).wait().id)
    repo.annotate(main[1], metrics={"acc": 0.5}, source="eval v1")
    repo.annotate(main[1], note=NOTE, source=SOURCE)
    repo.annotate(main[1], metrics={"acc": 0.7}, source="eval v2")
    repo.annotate(main[2], metrics={"acc": 0.8}, source="eval v2")
    repo.branch("ft", at=main[1])
    ft_state = {"w": repo.checkout(main[1])["w"] * 1.2, "b": torch.ones(16)}
    ft = repo.commit(ft_state, branch="ft", step=200, message="ft", metrics={"loss": 0.4}, blocking=True).wait().id
    merge = repo.merge_weights([main[3], ft], method="ties", base=main[0], density=0.5, branch="merged").id
    odd = repo.commit({"w": w, "b": torch.zeros(16)}, branch="odd", parents=[main[2], ft], blocking=True,
                      config={"merge": {"method": ODD_METHOD, "inputs": [main[2], ft]}}, message="odd").wait().id
    not_merge = repo.commit({"w": w * 2, "b": torch.zeros(16)}, branch="cfg", blocking=True, message="cfg",
                            config={"merge": {"method": "ties", "inputs": [main[0]]}}).wait().id
    return Explored(repo, path, main, ft, merge, odd, not_merge)


@pytest.fixture(scope="module", params=[pytest.param("sqlite", id="sqlite"),
                                        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)])
def explored(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
             pg_schemas: Any) -> Iterator[Explored]:
    path = tmp_path_factory.mktemp(f"ui-explore-{request.param}")
    if request.param == "sqlite":
        with Repo.init(path, chunk_size=4096) as repo:
            yield _build(repo, path)
        return
    if pg_schemas is None:
        pytest.skip("CKPT_TEST_POSTGRES_URL is not set")
    with pg_schemas() as url, Repo.init(path, db_url=url, chunk_size=4096) as repo:
        yield _build(repo, path)


@pytest.fixture(scope="module")
def client(explored: Explored) -> Iterator[TestClient]:
    with TestClient(create_app(explored.repo)) as c:
        yield c


# -- annotations -------------------------------------------------------------------------------------


def test_the_commit_page_shows_current_values_notes_and_the_history(explored: Explored, client: TestClient) -> None:
    doc = page(client.get(f"/commit/{explored.main[1]}"))
    values = doc.by_id("annotation-values").find_all("tr")
    rows = {tr.attrs["data-annotation"]: tr for tr in values if "data-annotation" in tr.attrs}
    assert set(rows) == {"acc"}
    cells = [td.text for td in rows["acc"].find_all("td")]
    assert cells[1] == "0.7" and cells[2] == "eval v2" and "annotation" in cells[0]
    notes = doc.by_id("annotation-notes").find_all("pre")
    assert [n.text for n in notes] == [NOTE]  # the note as text
    assert SOURCE in doc.by_id("annotation-notes").text
    history = doc.by_id("annotation-history")
    assert "open" in history.attrs  # something was superseded: the history is shown
    entries = history.find_all("tbody")[0].find_all("tr")
    assert [tr.attrs["class"] for tr in entries] == ["superseded", "current", "current"]
    assert [tr.attrs.get("data-annotation") for tr in entries] == ["acc", None, "acc"]
    assert [tr.find_all("td", "ann-status")[0].text for tr in entries] == ["superseded", "current", "current"]
    assert [tr.find_all("td", "source")[0].text for tr in entries] == ["eval v1", SOURCE, "eval v2"]
    assert "1 superseded" in history.find_all("summary")[0].text
    html = client.get(f"/commit/{explored.main[1]}").text
    assert "<script>alert" not in html and "<b>eval.py" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; a second thought" in html
    # The metrics logged with the commit stay apart from its annotations.
    logged = {tr.attrs["data-metric"] for tr in doc.by_id("metrics").find_all("tr") if "data-metric" in tr.attrs}
    assert logged == {"loss"}


def test_a_commit_without_annotations_says_so(explored: Explored, client: TestClient) -> None:
    doc = page(client.get(f"/commit/{explored.main[0]}"))
    assert doc.by_id("annotation-values").tag == "p" and "No annotations" in doc.by_id("annotation-values").text
    assert not doc.has_id("annotation-history") and not doc.has_id("merge")


def test_the_commit_api_holds_the_annotation_history_and_the_merge(explored: Explored, client: TestClient) -> None:
    data = client.get(f"/api/commits/{explored.main[1]}").json()
    assert data["annotations"] == {"acc": 0.7} and data["metrics"] == {"loss": 1.0}
    history = data["annotation_history"]
    assert [(a["name"], a["value"], a["note"], a["source"], a["current"]) for a in history] == [
        ("acc", 0.5, None, "eval v1", False), (None, None, NOTE, SOURCE, True), ("acc", 0.7, None, "eval v2", True)]
    assert all(a["commit_id"] == explored.main[1] and "T" in a["at"] for a in history)
    assert data["merge"] is None and data["tensors"]
    merge = client.get(f"/api/commits/{explored.merge}").json()["merge"]
    assert merge == {"method": "ties", "summary": "ties, density 0.5, λ 1.0", "inputs": [explored.main[3], explored.ft],
                     "weights": [1.0, 1.0], "base": explored.main[0], "params": {"density": 0.5, "λ": 1.0}}


# -- merges ------------------------------------------------------------------------------------------


def test_a_merge_commit_shows_its_method_parameters_inputs_and_base(explored: Explored, client: TestClient) -> None:
    doc = page(client.get(f"/commit/{explored.merge}"))
    box = doc.by_id("merge")
    assert doc.by_id("merge-summary").text == "ties, density 0.5, λ 1.0"
    line = re.sub(r"\s+", " ", box.text).strip()
    assert line.startswith(f"merge: ties, density 0.5, λ 1.0, base {explored.main[0][:10]}")
    assert [a.attrs["href"] for a in doc.by_id("merge-base").find_all("a")] == [f"/commit/{explored.main[0]}"]
    inputs = doc.by_id("merge-inputs").find_all("span", "merge-input")
    assert [s.attrs["data-commit"] for s in inputs] == [explored.main[3], explored.ft]
    links = [s.find_all("a")[0].attrs["href"] for s in inputs]
    assert links == [f"/commit/{explored.main[3]}", f"/commit/{explored.ft}"]
    assert all("(weight 1.0)" in s.text for s in inputs)
    assert client.get(doc.by_id("merge-base").find_all("a")[0].attrs["href"]).status_code == 200


def test_only_a_config_shaped_as_ckpt_merge_writes_it_is_a_merge(explored: Explored, client: TestClient) -> None:
    assert not page(client.get(f"/commit/{explored.not_merge}")).has_id("merge")  # inputs not its parents
    assert client.get(f"/api/commits/{explored.not_merge}").json()["merge"] is None
    html = client.get(f"/commit/{explored.odd_merge}").text
    assert ODD_METHOD not in html  # a stored string, escaped
    assert html_dom.Page(html).root.by_id("merge-summary").text == ODD_METHOD
    assert "(weight" not in html_dom.Page(html).root.by_id("merge-inputs").text  # no weights recorded


def test_the_graph_labels_merges_made_by_ckpt_merge(explored: Explored, client: TestClient) -> None:
    data = client.get("/api/graph").json()
    assert data["merges"] == {explored.merge: "ties, density 0.5, λ 1.0", explored.odd_merge: ODD_METHOD}
    html = client.get("/").text
    assert ODD_METHOD not in html
    doc = html_dom.Page(html).root
    items = {li.attrs["data-commit"]: li for li in doc.by_id("commit-list").find_all("li")}
    labels = {cid: li.find_all("span", "merge-method") for cid, li in items.items()}
    assert {cid for cid, found in labels.items() if found} == {explored.merge, explored.odd_merge}
    assert labels[explored.merge][0].text == "merge: ties, density 0.5, λ 1.0"
    assert client.get("/api/graph", params={"branch": "main"}).json()["merges"] == {}


# -- similar commits ---------------------------------------------------------------------------------


def test_the_similar_commits_come_from_the_catalog(explored: Explored, client: TestClient,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    doc = page(client.get(f"/commit/{explored.main[2]}"))
    section = doc.by_id("similar")
    api = section.attrs["data-api"]
    assert api == f"/api/similar?rev={explored.main[2]}" and doc.by_id("similar-body")
    assert any(s.attrs.get("src") == "/static/commit.js" for s in doc.find_all("script"))
    calls: list[dict[str, Any]] = []
    real = Repo.similar

    def spy(self: Repo, *args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Repo, "similar", spy)
    data = client.get(api).json()
    assert calls == [{"n": 5, "exact": False}]  # never the exact stage: no tensor bytes read
    assert data["commit"] == explored.main[2] and data["exact"] is False
    found = data["similar"]
    assert 1 <= len(found) <= 5 and explored.main[2] not in [s["commit_id"] for s in found]
    assert {explored.main[1], explored.main[3]} <= {s["commit_id"] for s in found}
    for s in found:
        assert s["exact_distance"] is None and s["per_tensor"] == {}
        assert 0.0 <= s["shared_fraction"] <= 1.0 and s["stat_distance"] >= 0.0
        assert s["matched_tensors"] <= s["query_tensors"] == 2 and s["short_id"] == s["commit_id"][:10]
        assert isinstance(s["message"], str) and "step" in s and "branch" in s
    by_id = {s["commit_id"]: s for s in found}
    assert by_id[explored.main[1]]["message"] == "main 1" and by_id[explored.main[1]]["step"] == 100
    assert client.get("/api/similar/main~1").json()["commit"] == explored.main[2]  # any revision
    assert client.get("/api/similar/nope").status_code == 404
    assert client.get("/api/similar").status_code == 400


# -- metric charts -----------------------------------------------------------------------------------


def test_the_chart_data_marks_annotated_values(explored: Explored, client: TestClient) -> None:
    data = client.get("/api/metrics", params=[("branch", "main"), ("branch", "ft"), ("name", "acc"),
                                              ("name", "loss")]).json()
    series = {(s["branch"], s["name"]): s for s in data["series"]}
    acc = series[("main", "acc")]
    assert [(p["commit"], p["y"]) for p in acc["points"]] == [
        (explored.main[1], 0.7), (explored.main[2], 0.8), (explored.main[3], 0.9)]
    assert acc["annotated"] == [0, 1]  # main[3] logged acc while training: not an annotation
    assert series[("ft", "acc")]["annotated"] == [0]  # ft's chain holds main[1]
    assert series[("main", "loss")]["annotated"] == [] and series[("ft", "loss")]["annotated"] == []
    assert data["annotated_names"] == ["acc"]
    plain = client.get("/api/metrics", params={"name": "loss", "branch": "main"}).json()
    assert plain["annotated_names"] == [] and plain["series"][0]["annotated"] == []
    doc = page(client.get("/metrics", params={"name": "acc"}))
    assert "annotation" in doc.find_all("p", "sub")[0].text


# -- escaping, torch -----------------------------------------------------------------------------------


def test_the_new_parts_keep_the_security_rules(explored: Explored, client: TestClient) -> None:
    for url in (f"/commit/{explored.main[1]}", f"/commit/{explored.merge}", f"/commit/{explored.odd_merge}", "/",
                "/metrics?name=acc"):
        html = client.get(url).text
        for raw in ("<script>alert", ODD_METHOD, SOURCE):
            assert raw not in html, (url, raw)
        assert not re.search(r"<[^>]+\son[a-z]+\s*=", html), url
        assert not re.search(r"<[^>]+\sstyle\s*=", html), url
        for script in html_dom.Page(html).root.find_all("script"):
            assert script.attrs.get("src", "").startswith("/static/") or script.attrs.get("type") == "application/json"
    assert client.get("/static/commit.js").status_code == 200
    assert client.post(f"/api/similar?rev={explored.main[1]}").status_code == 405


TORCH_FREE_PROBE = """
import sys
from starlette.testclient import TestClient
import ckptrepo
from ckptrepo.ui import create_app
with ckptrepo.Repo.open(sys.argv[1]) as repo, TestClient(create_app(repo)) as client:
    for url in sys.argv[2:]:
        assert client.get(url).status_code == 200, url
print("torch" in sys.modules)
"""


def test_the_new_routes_do_not_import_torch(explored: Explored) -> None:
    if explored.repo.config.db_url is not None:
        pytest.skip("once, on SQLite")
    urls = [f"/commit/{explored.main[1]}", f"/commit/{explored.merge}", f"/api/commits/{explored.merge}",
            f"/api/similar?rev={explored.main[2]}", f"/api/similar?rev={explored.merge}", "/",
            "/api/metrics?name=acc&branch=main"]
    done = subprocess.run([sys.executable, "-c", TORCH_FREE_PROBE, str(explored.path), *urls], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]
