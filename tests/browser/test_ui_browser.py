"""`ckpt ui` in a real browser (headless Chromium through Playwright; see conftest.py).

One repository for the module: commits on ``main`` with steps and metrics, a branch from its
middle, a merge back, a transfer onto another branch, a tag, pruned commits, and a commit whose
message and metric try to run script. Every page is loaded the way a user would reach it, its
JavaScript must run without errors or dialogs, and a screenshot of each is saved.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

import ckptrepo

HOSTILE = '<img src=x onerror="document.title=\'pwned\'"><script>document.title=\'pwned\'</script>'


def _state(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(64, 64, generator=g), "b": torch.randn(64, generator=g)}, "step": seed}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, ui: Any,
           chromium_path: str) -> Iterator[tuple[Any, dict[str, str]]]:
    path = tmp_path_factory.mktemp("ui") / "work"
    with ckptrepo.Repo.init(path, chunk_size=4096) as repo:
        ids: dict[str, str] = {}
        for i in range(6):
            c = repo.commit(_state(i), step=i * 100, metrics={"loss": 2.0 / (i + 1), "acc": i / 6},
                            message=f"main step {i * 100}").wait()
            ids[f"main{i}"] = c.id
        repo.branch("lr-high", at=ids["main2"])
        for i in range(3):
            c = repo.commit(_state(10 + i), branch="lr-high", step=300 + i * 100,
                            metrics={"loss": 1.5 / (i + 1), "acc": 0.5 + i / 10}, message=f"lr-high {i}").wait()
            ids[f"lr{i}"] = c.id
        ids["merge"] = repo.commit(_state(20), branch="main", parents=[ids["main5"], ids["lr2"]],
                                   step=900, message="merge lr-high").wait().id
        ids["ft"] = repo.commit({"head": torch.ones(8)}, branch="ft", transfer_from=ids["main3"], step=0,
                                message="fine-tune from main step 300").wait().id
        ids["hostile"] = repo.commit(_state(30), branch="main", step=1000, metrics={"loss": 0.1},
                                     message=HOSTILE).wait().id
        repo.tag("v1", at=ids["main4"])
        repo.prune(keep_last=2, branches=["lr-high"])
        server = ui.Served(repo)
        try:
            yield server, ids
        finally:
            server.stop()


def _ready(page: Any, url: str) -> Any:
    response = page.goto(url)
    assert response is not None and response.ok, url
    page.wait_for_selector('body[data-ready="1"]', timeout=30_000)
    return response


def test_the_graph_shows_every_commit_and_opens_one(served: tuple[Any, dict[str, str]], page: Any, ui: Any) -> None:
    server, ids = served
    response = _ready(page, server.url + "/")
    assert "default-src 'self'" in response.headers["content-security-policy"]
    listed = page.locator("#commit-list li")
    assert listed.count() == len(ids)
    text = page.locator("#commit-list").text_content()
    for cid in ids.values():  # every short id is text in the page (find, screen readers)
        assert cid[:10] in text
    body = page.locator("body").inner_text()
    for label in ("main", "lr-high", "ft", "v1"):
        assert label in body
    ui.screenshot(page, "graph")
    # A commit opens from the graph's list.
    page.locator(f'#commit-list li[data-commit="{ids["merge"]}"] a').click()
    page.wait_for_url(f"**/commit/{ids['merge']}")
    assert "merge lr-high" in page.locator("#message").text_content()
    parents = page.locator("#parents").text_content()
    assert ids["main5"][:10] in parents and ids["lr2"][:10] in parents
    assert page.locator("#tensors").locator("tr").count() >= 2
    ui.screenshot(page, "commit")


def test_zoom_and_the_branch_filter(served: tuple[Any, dict[str, str]], page: Any, ui: Any) -> None:
    server, ids = served
    _ready(page, server.url + "/")
    graph = page.locator("svg#graph")
    scale = float(graph.get_attribute("data-scale"))
    page.click("#zoom-in")
    page.wait_for_timeout(100)
    assert float(graph.get_attribute("data-scale")) > scale
    # Pan: a drag moves the view (the scale stays).
    box = graph.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] / 2 + 120, box["y"] + box["height"] / 2 + 80, steps=5)
    page.mouse.up()
    every = page.locator("#commit-list li").count()
    # Only ft's history: its commit and, through the transfer edge, main up to the source.
    page.select_option("#branch-filter", "ft")
    page.wait_for_selector('body[data-ready="1"]')
    shown = {li.get_attribute("data-commit") for li in page.locator("#commit-list li").all()}
    assert shown == {ids["ft"], ids["main0"], ids["main1"], ids["main2"], ids["main3"]} and len(shown) < every
    assert page.locator("path.edge-transfer").count() >= 1
    ui.screenshot(page, "graph-ft")


def test_a_hostile_message_stays_text(served: tuple[Any, dict[str, str]], page: Any, ui: Any) -> None:
    server, ids = served
    _ready(page, server.url + "/")
    assert page.title() != "pwned"
    _ready(page, server.url + f"/commit/{ids['hostile']}")
    assert page.locator("#message").text_content().strip() == HOSTILE
    assert page.title() != "pwned" and page.locator("#message img").count() == 0
    ui.screenshot(page, "hostile")


def test_diff_tensor_history_and_metrics(served: tuple[Any, dict[str, str]], page: Any, ui: Any) -> None:
    server, ids = served
    _ready(page, server.url + f"/diff/{ids['main0']}/{ids['main5']}")
    rows = page.locator("#diff tbody tr")
    assert rows.count() >= 2
    assert "model/w" in page.locator("#diff").text_content()
    ui.screenshot(page, "diff")
    _ready(page, server.url + "/tensor/model/w?along=main")
    assert page.locator("svg").count() >= 1
    assert page.locator("table").text_content().count(ids["main0"][:10]) >= 1
    ui.screenshot(page, "tensor-history")
    _ready(page, server.url + "/metrics?branch=main&branch=lr-high&name=loss")
    assert page.locator("svg").count() >= 1
    legend = page.locator("body").inner_text()
    assert "main" in legend and "lr-high" in legend and "loss" in legend
    ui.screenshot(page, "metrics")


def test_an_unknown_revision_is_a_page_that_says_so(served: tuple[Any, dict[str, str]], page: Any, ui: Any) -> None:
    server, _ = served
    response = page.goto(server.url + "/commit/nosuchbranch")
    assert response is not None and response.status == 404
    assert "nosuchbranch" in page.locator("body").inner_text()
