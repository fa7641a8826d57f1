"""The HTML pages (GET only), each rendered from one or a few ``Repo`` reads.

``/``                        the lineage graph (``?branch=``: only that revision's ancestors) and
                             the list of every commit shown (``#commit-list``)
``/commit/{rev}`` (or ``/commit?rev=``)  a commit: fields, parents, children, metrics, annotations
                             (current values, notes, history), a merge's method, ingest figures,
                             tensors with statistics, and the similar commits (its script reads
                             ``/api/similar``)
``/metrics?branch=&name=``   metric curves of branches (the chart reads ``/api/metrics``)
``/tensor/{name}?along=`` (or ``/tensor?name=``)  a tensor's history: charts and a table
``/diff/{a}/{b}`` (or ``/diff?a=&b=``)  per-tensor changes, largest first

Pages embed the data their scripts draw as JSON data blocks (``tojson``: never executed, and
escaped), or name the API URL their script reads in a ``data-api`` attribute.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import BaseRoute, Route

from ckptrepo import DEFAULT_BRANCH, Commit, Repo
from ckptrepo.ui import data, explore, graph, params, urls
from ckptrepo.ui.params import repo_of
from ckptrepo.ui.templating import render

HISTORY_ROWS = 1000  # rows of a tensor history's table (the charts show every commit)


def _base(repo: Repo, page: str) -> dict[str, Any]:
    return {"page": page, "repo_name": repo.repo_dir.parent.name or str(repo.repo_dir)}


def graph_page(request: Request) -> HTMLResponse:
    repo = repo_of(request)
    branch = params.text(request, "branch")
    head = repo.resolve(branch) if branch is not None else None
    # The chosen branch's history goes first (lane 0), as the default branch's does unfiltered.
    lineage = repo.graph(head)
    payload = graph.payload(graph.layout(lineage, branch or DEFAULT_BRANCH), head=head,
                            merges=explore.merge_labels(repo, lineage))
    return render("graph.html", {**_base(repo, "graph"), "payload": payload,
                                 "nodes": graph.newest_first(payload["nodes"]), "merges": payload["merges"],
                                 "branch_names": [b["name"] for b in payload["branches"]], "selected": branch})


def commit_page(request: Request) -> HTMLResponse:
    repo = repo_of(request)
    rev = request.path_params.get("rev") or params.required(request, "rev", "revision")
    commit = repo.get_commit(rev)
    tensors = repo.tensors(commit.id)
    known = {c.id: c for c in repo.commits(commit.parent_ids)}
    children = repo.commits(repo.descendants(commit.id, max_depth=1))
    child_edges = [(c, next((p.kind for p in c.parents if p.id == commit.id), "parent")) for c in children]
    first_parent = next((p.id for p in commit.parents if p.kind == "parent"), None)
    return render("commit.html", {**_base(repo, "commit"), "rev": rev, "commit": commit, "tensors": tensors,
                                  "parents": [(p, known.get(p.id)) for p in commit.parents],
                                  "children": child_edges, "first_parent": first_parent,
                                  "annotations": explore.annotations_of(repo, commit.id),
                                  "merge": explore.merge_of(commit), "similar_api": urls.api_similar(commit.id),
                                  "similar_n": explore.SIMILAR})


def metrics_page(request: Request) -> HTMLResponse:
    repo = repo_of(request)
    choice = data.choose_metrics(repo, params.texts(request, "branch"), params.texts(request, "name"))
    for branch in choice.branches:
        repo.resolve(branch)  # an unknown one is the page's 404, not only the chart's
    branches = [r.name for r in repo.branches()]
    extra = [b for b in choice.branches if b not in branches]  # revisions that are not branch names
    return render("metrics.html", {**_base(repo, "metrics"), "choice": choice, "branches": branches + extra,
                                   "names": repo.metric_names(),
                                   "api": urls.api_metrics(choice.branches, choice.names)})


def tensor_page(request: Request) -> HTMLResponse:
    repo = repo_of(request)
    name = request.path_params.get("name") or params.required(request, "name", "tensor name")
    along = params.text(request, "along") or DEFAULT_BRANCH
    points = repo.history(name, along=along)
    head = points[0].commit_id if points else repo.resolve(along)
    return render("tensor.html", {**_base(repo, "tensor"), "name": name, "along": along, "head": head,
                                  "rows": points[:HISTORY_ROWS], "total": len(points),
                                  "series": data.history_series(points)})


def diff_page(request: Request) -> HTMLResponse:
    repo = repo_of(request)
    a = request.path_params.get("a") or params.required(request, "a", "revision a")
    b = request.path_params.get("b") or params.required(request, "b", "revision b")
    result = repo.diff(a, b)
    ends: dict[str, Commit] = {c.id: c for c in repo.commits([result.a, result.b])}
    rows = [(d, data.magnitude(d)) for d in data.ordered(result)]
    return render("diff.html", {**_base(repo, "diff"), "a": a, "b": b, "diff": result, "rows": rows,
                                "commit_a": ends.get(result.a), "commit_b": ends.get(result.b),
                                "order": data.DIFF_ORDER})


def routes() -> list[BaseRoute]:
    """The pages' routes (GET; Starlette adds HEAD)."""
    get = ["GET"]
    return [
        Route("/", graph_page, methods=get),
        Route("/commit", commit_page, methods=get),
        Route("/commit/{rev:path}", commit_page, methods=get),
        Route("/metrics", metrics_page, methods=get),
        Route("/tensor", tensor_page, methods=get),
        Route("/tensor/{name:path}", tensor_page, methods=get),
        Route("/diff", diff_page, methods=get),
        Route("/diff/{a}/{b}", diff_page, methods=get),
    ]
