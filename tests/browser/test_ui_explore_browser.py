"""`ckpt ui` over an explored lineage in a real browser (headless Chromium; see conftest.py): a
commit page draws its similar commits from ``/api/similar`` and shows a hostile note as text, the
metrics chart draws annotated values apart (dotted, hollow diamonds, "(annotation)" in the
legend), and the graph's commit list names a merge's method. Screenshots of each are saved.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

import ckptrepo

HOSTILE = '<img src=x onerror="document.title=\'pwned\'"><script>document.title=\'pwned\'</script>'


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, ui: Any,
           chromium_path: str) -> Iterator[tuple[Any, dict[str, str]]]:
    path = tmp_path_factory.mktemp("ui-explore") / "work"
    with ckptrepo.Repo.init(path, chunk_size=4096) as repo:
        g = torch.Generator().manual_seed(0)
        w = torch.randn(64, 64, generator=g)
        ids: dict[str, str] = {}
        for i in range(4):
            w = w + 0.01 * torch.randn(64, 64, generator=g)
            metrics = {"loss": 2.0 / (i + 1), **({"acc": 0.9} if i == 3 else {})}
            ids[f"main{i}"] = repo.commit({"w": w, "b": torch.zeros(16)}, step=100 * i, metrics=metrics,
                                          message=f"main {i}", blocking=True).wait().id
        repo.annotate(ids["main1"], metrics={"acc": 0.5}, note=HOSTILE, source=HOSTILE)
        repo.annotate(ids["main1"], metrics={"acc": 0.7}, source="eval v2")
        repo.annotate(ids["main2"], metrics={"acc": 0.8}, source="eval v2")
        repo.branch("ft", at=ids["main1"])
        ids["ft"] = repo.commit({"w": repo.checkout(ids["main1"])["w"] * 1.2, "b": torch.ones(16)}, branch="ft",
                                step=200, message="ft", blocking=True).wait().id
        ids["merge"] = repo.merge_weights([ids["main3"], ids["ft"]], method="ties", base=ids["main0"], density=0.5,
                                          branch="merged").id
        server = ui.Served(repo)
        try:
            yield server, ids
        finally:
            server.stop()


def _ready(page: Any, url: str) -> None:
    response = page.goto(url)
    assert response is not None and response.ok, url
    page.wait_for_selector('body[data-ready="1"]', timeout=30_000)


def test_a_commit_page_draws_similar_commits_and_keeps_a_note_as_text(served: tuple[Any, dict[str, str]],
                                                                      page: Any, ui: Any) -> None:
    server, ids = served
    _ready(page, server.url + f"/commit/{ids['main1']}")
    rows = page.locator("#similar-table tbody tr")
    assert 1 <= rows.count() <= 5
    shown = {r.get_attribute("data-commit") for r in rows.all()}
    assert ids["main2"] in shown and ids["main1"] not in shown
    assert page.locator("#similar-table").text_content().count("%") == rows.count()  # shared bytes, as shares
    assert page.locator("#annotation-notes pre").text_content() == HOSTILE
    assert page.title() != "pwned" and page.locator("#annotations img, #annotations script").count() == 0
    assert page.locator("#annotation-history tr.superseded").count() == 1
    ui.screenshot(page, "explore-commit")
    page.locator(f'#similar-table tr[data-commit="{ids["main2"]}"] a.commit-link').click()
    page.wait_for_url(f"**/commit/{ids['main2']}")
    _ready(page, server.url + f"/commit/{ids['merge']}")
    assert page.locator("#merge-summary").text_content() == "ties, density 0.5, λ 1.0"
    ui.screenshot(page, "explore-merge")


def test_the_chart_marks_annotated_values(served: tuple[Any, dict[str, str]], page: Any, ui: Any) -> None:
    server, _ = served
    _ready(page, server.url + "/metrics?branch=main&name=acc")
    chart = page.locator("#metrics-chart")
    assert chart.locator("svg.line-chart path.marker-annotation").count() == 2  # main1 and main2, not main3
    assert chart.locator("svg.line-chart path.series-annotation").count() == 1
    assert chart.locator("svg.line-chart path.series").count() == 2  # the logged value, the annotated ones
    legend = [li.text_content() for li in chart.locator("ul.chart-legend li").all()]
    assert legend == ["main · acc", "main · acc (annotation)"]
    assert chart.locator("ul.chart-legend li.legend-annotation").count() == 1
    ui.screenshot(page, "explore-metrics")


def test_the_graph_names_a_merges_method(served: tuple[Any, dict[str, str]], page: Any, ui: Any) -> None:
    server, ids = served
    _ready(page, server.url + "/")
    item = page.locator(f'#commit-list li[data-commit="{ids["merge"]}"] .merge-method')
    assert item.text_content() == "merge: ties, density 0.5, λ 1.0"
    assert page.locator("#commit-list .merge-method").count() == 1
    page.locator(f'circle.node[data-commit="{ids["merge"]}"]').hover()
    page.wait_for_selector("#graph-tooltip:not([hidden])")
    assert "merge: ties, density 0.5, λ 1.0" in page.locator("#graph-tooltip").text_content()
    ui.screenshot(page, "explore-graph")
