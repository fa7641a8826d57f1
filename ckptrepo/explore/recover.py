"""Lineage recovered from the weights, as the facade calls it (``exploring.Exploring``): the models of
commits, states and files (``weights``), the nearest commits (``similar``), one model's proposed
source and a tree over many (``infer``), as public values (``types.Similarity``,
``types.LineageProposal``), and where an accepted tree's commits go (``branch_plan``).

Everything here reads; committing is the facade's (``commit_file`` with the parents and transfer
sources planned here)."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptrepo import types as t
from ckptrepo.db.engine import Sessions
from ckptrepo.db.models import Commit
from ckptrepo.errors import UsageError
from ckptrepo.explore import distance, infer, similar
from ckptrepo.explore.weights import Model, commit_model, state_model

# How many commits near a model ``infer_parent`` weighs, and how many near each model of a tree.
PARENT_CANDIDATES = 8
TREE_OUTSIDE = 3


# -- models ------------------------------------------------------------------------------------------


def load_commit(reading: Sessions, commit_id: str, layout: Callable[[str, list[str]], Mapping[str, Any]],
                read: Callable[[Any], bytes | memoryview]) -> Model:
    """The model of commit ``commit_id``: its tensors' statistics now, chunk locations through
    ``layout(commit_id, names)`` (name -> (TensorRow, locations)) when an exact comparison needs them."""
    with reading() as s:
        rows = similar.commit_rows(s, commit_id)
        row = s.get(Commit, commit_id)
        step = row.step if row is not None else None
    return commit_model(commit_id, rows, step, lambda names: layout(commit_id, list(names)), read)


def load_state(label: str, state: Any, chunk_size: int, pool: Executor, *, step: int | None = None,
               allow_pickle: bool = False) -> tuple[Model, dict[str, int]]:
    """The model of ``state`` (hashed and summarised as a commit would, nothing stored) and its
    distinct chunks (id -> bytes). The state must stay unchanged while the model is used."""
    from ckptrepo import state as st
    from ckptrepo.ingest.sources import from_tensors

    model = state_model(label, from_tensors(st.flatten(state, allow_pickle=allow_pickle).tensors), chunk_size, pool,
                        step=step)
    chunks = {p.chunk_id: p.length for pieces in model.pieces(list(model.tensors)).values() for p in pieces}
    return model, chunks


def load_file(path: Path, chunk_size: int, pool: Executor, *,
              allow_pickle: bool = False) -> tuple[Model, dict[str, int]]:
    """The model of a checkpoint file or folder (``formats.read_state``, memory-mapped where it can
    be), labelled with its path; its step is what the run recorded beside it, if anything."""
    from ckptrepo.formats import fill_run_meta, read_state

    state = read_state(path, mapped=True, allow_pickle=allow_pickle)
    run: dict[str, Any] = fill_run_meta({}, path, state)
    step = run.get("step")
    return load_state(str(path), state, chunk_size, pool, step=step, allow_pickle=allow_pickle)


# -- as public values -----------------------------------------------------------------------------


def similarity(found: similar.Found, query: Model) -> t.Similarity:
    exact = found.exact
    return t.Similarity(
        commit_id=found.model.label, score=max(0.0, min(1.0, 1.0 - found.distance)), shared_bytes=found.shared_bytes,
        shared_fraction=found.shared_fraction, matched_tensors=found.bound.matched,
        query_tensors=len(query.weights()), stat_distance=found.bound.distance,
        exact_distance=exact.distance if exact is not None else None,
        per_tensor=dict(exact.per_tensor) if exact is not None else {})


def evidence(edge: infer.Edge) -> t.LineageEvidence:
    m = edge.measured
    return t.LineageEvidence(distance=m.distance, frozen_fraction=m.frozen_fraction, matched_tensors=m.matched,
                             new_tensors=m.new, dropped_tensors=m.dropped, direction=edge.direction,
                             against=edge.against, mapping=dict(m.mapping))


def candidate(edge: infer.Edge) -> t.LineageCandidate:
    return t.LineageCandidate(source=edge.source.label, kind=edge.kind, score=edge.score, evidence=evidence(edge))


def proposal(placed: infer.Placement) -> t.LineageProposal:
    e = placed.edge
    return t.LineageProposal(
        model=placed.model.label, kind=e.kind if e is not None else None,
        parent=e.source.label if e is not None else None, score=e.score if e is not None else 0.0,
        runner_up=candidate(placed.runner_up) if placed.runner_up is not None else None,
        evidence=evidence(e) if e is not None else None)


# -- the three calls ---------------------------------------------------------------------------------


def nearest(reading: Sessions, query: Model, chunks: Mapping[str, int] | None, load: Callable[[str], Model],
            pool: Executor, *, n: int, exclude: Collection[str] = (), exact: bool = True) -> list[t.Similarity]:
    """``Repo.similar``: the ``n`` commits nearest to ``query`` (``exact=False``: no exact stage)."""
    return [similarity(f, query) for f in similar.search(reading, query, load, pool, n=n, chunk_ids=chunks,
                                                         exclude=exclude, exact=exact)]


def parent_of(reading: Sessions, query: Model, chunks: Mapping[str, int] | None, load: Callable[[str], Model],
              pool: Executor, *, exclude: Collection[str] = ()) -> t.LineageProposal:
    """``Repo.infer_parent``: the source of ``query`` among the repository's commits."""
    found = similar.search(reading, query, load, pool, n=PARENT_CANDIDATES, chunk_ids=chunks, exclude=exclude)
    sources = [(f.model, f.exact) for f in found if f.exact is not None]
    return proposal(infer.propose(query, sources))


def tree_of(reading: Sessions, models: Sequence[tuple[Model, Mapping[str, int]]], load: Callable[[str], Model],
            pool: Executor) -> list[t.LineageProposal]:
    """``Repo.infer_lineage``: a tree over ``models`` (with their chunks), whose roots may come from
    the repository's commits (the ``TREE_OUTSIDE`` nearest to each model)."""
    chunks = {m.label: c for m, c in models}

    def outside(model: Model) -> list[tuple[Model, distance.Directed]]:
        found = similar.search(reading, model, load, pool, n=TREE_OUTSIDE, chunk_ids=chunks[model.label])
        return [(f.model, f.exact) for f in found if f.exact is not None]

    return [proposal(p) for p in infer.tree([m for m, _ in models], pool, outside)]


# -- where an accepted tree's commits go ---------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One commit of an accepted tree: the model's path, the branch it goes on, its parents (None:
    the branch head, which is none: a root) and its transfer source, each a commit id or the path
    of a model committed before it."""

    path: str
    branch: str
    parents: list[str] | None
    transfer_from: str | None


def branch_plan(proposals: Sequence[t.LineageProposal], branch: str, head: str | None,
                taken: Collection[str]) -> list[Step]:
    """Where each model of ``proposals`` (parents first) is committed. ``branch`` (at ``head``, None:
    no commit yet) takes the first line it can continue: a model whose source is its head, or the
    first root or transfer while it has none. Every other line starts a branch of its own, named
    ``<branch>-<the file's stem>`` (made unique against ``taken`` and each other); a line goes on
    by the parent edge along which it reached its last model. A transfer starts a branch (its
    commit has no parent, only the transfer edge); a parent edge from a commit another branch
    ends at, or from the middle of a line, starts one too. UsageError when a proposal's parent is
    neither a model before it nor a commit id."""
    heads: dict[str, str | None] = {branch: head}
    names = set(taken) | {branch}
    models = {p.model for p in proposals}
    done: set[str] = set()
    steps: list[Step] = []
    for p in proposals:
        if p.parent is not None and p.parent in models and p.parent not in done:
            raise UsageError(f"the proposal for {p.model} names {p.parent} as its source, which comes after it",
                             hint="Pass the proposals in the order Repo.infer_lineage gives them.")
        if p.kind == "parent" and p.parent is not None:
            on = next((b for b, h in heads.items() if h == p.parent), None)
            if on is None:
                on = branch if heads[branch] is None else _new_branch(branch, p.model, names)
            steps.append(Step(p.model, on, [p.parent], None))
        else:
            on = branch if heads[branch] is None else _new_branch(branch, p.model, names)
            steps.append(Step(p.model, on, None, p.parent if p.kind == "transfer" else None))
        heads[on] = p.model
        names.add(on)
        done.add(p.model)
    return steps


def _new_branch(branch: str, path: str, names: set[str]) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(path).stem).strip("-.") or "model"
    base = f"{branch}-{stem}"[:200].rstrip("-.")
    name, i = base, 2
    while name in names:
        name, i = f"{base}-{i}", i + 1
    names.add(name)
    return name
