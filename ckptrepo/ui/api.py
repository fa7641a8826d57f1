"""The JSON API under ``/api/`` (GET only), each endpoint one or two ``Repo`` reads.

``/api/graph?branch=``             the lineage graph, laid out (``graph.payload``)
``/api/commits?rev=&where=&limit=&offset=``  a log page: ``{"commits": [...], "limit", "offset"}``
``/api/commits/{rev}``             a commit's ``to_json()`` plus ``tensors``, ``annotation_history``, ``merge``
``/api/similar/{rev}`` (or ``?rev=``)  the commits nearest to it, from the catalog (``explore.similar_json``)
``/api/history/{name}?along=&limit=`` (or ``?name=``)  a tensor along a first-parent chain
``/api/diff/{a}/{b}`` (or ``?a=&b=``)  per-tensor changes, largest first (``data.DIFF_ORDER``)
``/api/metrics?branch=&name=``     metric series (``data.metrics_json``)
``/api/branches``                  branches, tags and the current branch
``/api/metric-names``              every metric name

Errors: ``{"error", "hint"}`` with 400 / 404 (``failures``). Every float is finite or null.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from ckptrepo import DEFAULT_BRANCH
from ckptrepo.ui import data, explore, graph, params
from ckptrepo.ui.params import repo_of

LOG_PAGE = 100
LOG_MAX = 10_000


def _json(content: Any) -> JSONResponse:
    return JSONResponse(data.json_safe(content))


def graph_json(request: Request) -> JSONResponse:
    branch = params.text(request, "branch")
    repo = repo_of(request)
    head = repo.resolve(branch) if branch is not None else None  # one commit, should the branch move meanwhile
    # JSON-safe by construction (strings, ints, booleans, lists): no pass over 10,000 nodes to check.
    lineage = repo.graph(head)
    return JSONResponse(graph.payload(graph.layout(lineage, branch or DEFAULT_BRANCH), head=head,
                                      merges=explore.merge_labels(repo, lineage)))


def commits_json(request: Request) -> JSONResponse:
    limit = params.integer(request, "limit", default=LOG_PAGE, minimum=1, maximum=LOG_MAX)
    offset = params.integer(request, "offset", default=0, minimum=0)
    found = repo_of(request).log(params.text(request, "rev"), where=params.text(request, "where"), limit=limit,
                                 offset=offset or 0)
    return _json({"commits": [c.to_json() for c in found], "limit": limit, "offset": offset})


def commit_json(request: Request) -> JSONResponse:
    rev = request.path_params.get("rev") or params.required(request, "rev", "revision")
    repo = repo_of(request)
    commit = repo.get_commit(rev)
    return _json(data.commit_json(commit, repo.tensors(commit.id), repo.annotations(commit.id)))


def similar_json(request: Request) -> JSONResponse:
    rev = request.path_params.get("rev") or params.required(request, "rev", "revision")
    repo = repo_of(request)
    return _json(explore.similar_json(repo, repo.resolve(rev)))


def history_json(request: Request) -> JSONResponse:
    name = request.path_params.get("name") or params.required(request, "name", "tensor name")
    along = params.text(request, "along") or DEFAULT_BRANCH
    limit = params.integer(request, "limit", default=None, minimum=1)
    repo = repo_of(request)
    points = repo.history(name, along=along, limit=limit)
    return _json(data.history_json(name, along, repo.resolve(along), points))


def diff_json(request: Request) -> JSONResponse:
    a = request.path_params.get("a") or params.required(request, "a", "revision a")
    b = request.path_params.get("b") or params.required(request, "b", "revision b")
    return _json(data.diff_json(repo_of(request).diff(a, b)))


def metrics_json(request: Request) -> JSONResponse:
    repo = repo_of(request)
    choice = data.choose_metrics(repo, params.texts(request, "branch"), params.texts(request, "name"))
    return _json(data.metrics_json(repo, choice))


def branches_json(request: Request) -> JSONResponse:
    repo = repo_of(request)
    return _json({"branches": [r.to_json() for r in repo.branches()], "tags": [r.to_json() for r in repo.tags()],
                  "current": repo.head})


def metric_names_json(request: Request) -> JSONResponse:
    return _json({"names": repo_of(request).metric_names()})


def routes() -> list[BaseRoute]:
    """The API's routes (GET; Starlette adds HEAD)."""
    get = ["GET"]
    return [
        Route("/api/graph", graph_json, methods=get),
        Route("/api/commits", commits_json, methods=get),
        Route("/api/commits/{rev:path}", commit_json, methods=get),
        Route("/api/similar", similar_json, methods=get),
        Route("/api/similar/{rev:path}", similar_json, methods=get),
        Route("/api/history", history_json, methods=get),
        Route("/api/history/{name:path}", history_json, methods=get),
        Route("/api/diff", diff_json, methods=get),
        Route("/api/diff/{a}/{b}", diff_json, methods=get),
        Route("/api/metrics", metrics_json, methods=get),
        Route("/api/branches", branches_json, methods=get),
        Route("/api/metric-names", metric_names_json, methods=get),
    ]
