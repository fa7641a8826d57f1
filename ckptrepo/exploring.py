"""``Exploring``, the part of the ``Repo`` facade that explores a lineage after the fact: results
attached to commits (annotations), evaluation runs, bisect, weight-space merges, and lineage
recovered from the weights. Each call validates its arguments and delegates to ``explore``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptrepo.db import catalog
from ckptrepo.errors import UsageError
from ckptrepo.ledger.journal import MAX_NAME, MAX_NOTE, time_of
from ckptrepo.lineage import revparse
from ckptrepo.sync import Sync

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence  # evaluation and bisect

    from typing_extensions import Unpack

    from ckptrepo import types as t
    from ckptrepo.config import RepoConfig
    from ckptrepo.handle import CommitHandle
    from ckptrepo.ingest.writer import CommitWriter, WriterOptions


class Exploring(Sync):
    """Annotations, evaluation, bisect, weight merges and lineage inference over the repository."""

    if TYPE_CHECKING:  # Repo's
        def __init__(self, repo_dir: Path, config: RepoConfig, **options: Unpack[WriterOptions]) -> None: ...
        def _check_writable(self, what: str) -> None: ...
        def _own_store(self) -> None: ...
        @property
        def _writer(self) -> CommitWriter: ...  # merge_weights
        def commit(self, state: Any, *, branch: str | None = None, message: str | None = None,
                   step: int | None = None, epoch: int | None = None, metrics: Mapping[str, float] | None = None,
                   config: Any = None, parents: list[str] | None = None, transfer_from: Any = None,
                   allow_pickle: bool = False, code_version: str | None = None, blocking: bool = False,
                   group: Any = None, local: bool = False, wait_remote: bool = False,
                   files: Mapping[str, Any] | None = None) -> CommitHandle: ...

    # -- annotations (db.notes; journal op "annotate") -----------------------------------

    def annotate(self, rev: str, *, metrics: Mapping[str, float] | None = None, note: str | None = None,
                 source: str | None = None) -> t.Commit:
        """Attach results to the commit ``rev`` names without changing its id, like a git note:
        ``metrics`` (name -> number, e.g. an evaluation's scores), a ``note``, and their
        ``source`` (the command or person that produced them). Returns the commit, its
        ``annotations`` holding the current values.

        Durable in the store before the database (a journal entry, op ``annotate``: a rebuilt
        database and a remote's clones carry it). A newer value for a metric the commit already
        has an annotation for becomes current and the older one stays in its history
        (``annotations``). Annotated values are queried like metrics (``log(where=)``, ``best``,
        ``metrics_along``). A pruned or damaged commit can be annotated. UsageError, before
        anything is written: nothing given, a name that is empty or longer than 255 characters, a
        value that is not a finite number, a note or source over 64 KiB characters, or a name the commit
        logged when it was made (part of its id; pick another name)."""
        from ckptrepo.db import notes
        from ckptrepo.db.engine import write_transaction
        from ckptrepo.ledger import journal

        self._check_open()
        self._check_writable("annotate a commit")
        values = _check_annotation(metrics, note, source)
        self._own_store()
        with self._sessions() as s:
            cid = revparse.resolve(s, rev)
            notes.refuse_logged(s, cid, list(values))  # as the transaction does, before any write
        change = {"op": "annotate", "commit": cid, "metrics": values, "note": note, "source": source}
        with journal.entry(self._backend, change, purpose="annotate") as key, \
                write_transaction(self._sessions) as s:
            at = datetime.fromtimestamp(_ns_of(key) / 1e9, timezone.utc)
            notes.record(s, cid, values, note, source, at, key)
            catalog.record_journal_key(s, key)
        return self.get_commit(cid)

    def annotations(self, rev: str, *, name: str | None = None) -> list[t.Annotation]:
        """Every annotation of the commit ``rev`` names (only metric ``name``'s when given), oldest
        first, each marked ``current`` when it is its name's newest value (notes are all current)."""
        from ckptrepo.db import notes

        self._check_open()
        with self._sessions() as s:
            return notes.history(s, revparse.resolve(s, rev), name)

    # -- evaluation and bisect (explore.runner, explore.evaluate, explore.bisect) ---------------

    def evaluate(self, fn: Callable[[Any, t.Commit], Mapping[str, float]], revs: str | Sequence[str] | None = None,
                 *, along: str | None = None, every: int = 1, source: str | None = None, force: bool = False,
                 on_result: Callable[[t.EvalResult], None] | None = None) -> list[t.EvalResult]:
        """Call ``fn(state, commit)`` on each commit of ``revs`` (or every ``every``-th commit of
        ``along``'s first-parent line, counted from its head, oldest first) with its state
        (``checkout``), and record what it returns (metric name -> number) as annotations of the
        commit with ``source`` (default ``evaluate: MODULE.FUNCTION``). One result per commit, in
        order (``EvalResult``; ``on_result`` gets each as it is known). Skipped, with the reason:
        a commit that already has results from ``source`` (unless ``force``), a pruned or damaged
        one. What ``fn`` raises is raised; the commits before keep their results, so a second call
        goes on where the first stopped. ReadOnlyRepository before anything runs."""
        from ckptrepo.explore import evaluate as ev

        commits = self._eval_commits(revs, along, every)
        source = source if source is not None else f"evaluate: {getattr(fn, '__module__', '?')}." \
                                                    f"{getattr(fn, '__qualname__', type(fn).__name__)}"
        ev.check_source(source)
        return ev.run_function(commits, fn, source=source, checkout=self.checkout, record=self._record_results,
                               done=self._result_sources, force=force, on_result=on_result)

    def evaluate_command(self, command: str | Sequence[str], revs: str | Sequence[str] | None = None, *,
                         along: str | None = None, every: int = 1, format: str = "safetensors", jobs: int = 1,
                         timeout: float | None = None, source: str | None = None, force: bool = False,
                         on_result: Callable[[t.EvalResult], None] | None = None) -> list[t.EvalResult]:
        """Run ``command`` on each commit's state written to a file (``ckpt eval``): the commits as
        for ``evaluate``; the state exported in ``format`` (safetensors, torch or dcp) into a
        private temporary folder, removed afterwards; ``{path}``, ``{rev}`` (the full id) and
        ``{step}`` in the command replaced, and given as ``CKPT_EVAL_PATH``, ``CKPT_EVAL_REV``,
        ``CKPT_EVAL_STEP`` (``explore.runner``); the JSON object on the last line of its stdout
        recorded as annotations with ``source`` (default ``eval: COMMAND``). ``jobs`` commands at
        once, each killed after ``timeout`` seconds. A command that fails (exit status, timeout,
        no JSON object of numbers on its last line) gives a ``failed`` result with the end of its
        stderr, and the others go on. Skips as ``evaluate`` does."""
        from ckptrepo.explore import evaluate as ev
        from ckptrepo.explore import runner

        text = runner.check_options(command, format, timeout=timeout, jobs=jobs)
        commits = self._eval_commits(revs, along, every)
        source = source if source is not None else f"eval: {text}"
        ev.check_source(source)
        return ev.run_commands(commits, command, source=source, fmt=format, jobs=jobs, timeout=timeout,
                               export=self._state_writer(format), record=self._record_results,
                               done=self._result_sources, force=force, on_result=on_result)

    def bisect(self, good: str, bad: str, *, where: str | None = None, stat: str | None = None,
               run: str | Sequence[str] | None = None, format: str = "safetensors", timeout: float | None = None,
               top: int = 10, on_step: Callable[[t.BisectStep], None] | None = None) -> t.BisectResult:
        """The first commit after ``good``, up to ``bad``, on ``bad``'s first-parent line where a
        predicate turns true (binary search: the predicate is assumed to stay true once true), with
        the ``top`` tensors whose stored statistics changed most there (``explore.bisect``).

        Exactly one predicate: ``where`` (the where-language of ``log``: fields, metrics and
        annotations), ``stat`` (``GLOB:STAT[OP NUMBER]`` over stored tensor statistics, e.g.
        ``"*:nan"``, ``"*.weight:abs_max>1e4"``: ``explore.predicates``); both read rows only, no
        tensor bytes. Or ``run``: a command run on each tested commit's state written in ``format``
        as ``evaluate_command`` does; exit status 0 good, 125 skip, any other bad; killed after
        ``timeout`` seconds, which stops the bisect (BisectAborted). ``on_step`` gets each test.
        NotOnFirstParentLine when ``good`` is not an older commit of that line; BisectEndpoint
        unless the predicate is false at ``good`` and true at ``bad``."""
        from ckptrepo.explore import bisect as bs
        from ckptrepo.explore import predicates, runner

        self._check_open()
        given = [name for name, value in (("where", where), ("stat", stat), ("run", run)) if value is not None]
        if len(given) != 1:
            raise UsageError("bisect takes exactly one predicate: where, stat or run"
                             + (f" (given: {', '.join(given)})" if given else ""),
                             hint="e.g. --where 'val_loss > 3', --stat '*:nan' or --run 'python3 check.py {path}'")
        if isinstance(top, bool) or not isinstance(top, int) or top < 0:
            raise UsageError(f"top {top!r} is not a whole number of tensors")
        spec = predicates.parse_stat(stat) if stat is not None else None
        if run is not None:
            described = f"run: {runner.check_options(run, format, timeout=timeout)}"
        else:
            described = f"where: {where}" if where is not None else f"stat: {stat}"
        self._own_commits_landed()
        with self._reading() as s:
            line = bs.first_parent_line(s, good, bad)
            if run is None:
                holds = predicates.stat_test(s, spec) if spec is not None else predicates.where_test(s, where or "")
                return bs.bisect(line, bs.boolean_test(holds), predicate=described, diff=self.diff, top=top,
                                 on_step=on_step)
        test = bs.command_test(run, fmt=format, timeout=timeout, export=self._state_writer(format))
        return bs.bisect(line, test, predicate=described, diff=self.diff, top=top, on_step=on_step)

    def _eval_commits(self, revs: str | Sequence[str] | None, along: str | None, every: int) -> list[t.Commit]:
        """The commits an evaluation runs on (``evaluate``), checked before anything runs."""
        from ckptrepo.db import integers
        from ckptrepo.explore import evaluate as ev

        self._check_open()
        self._check_writable("record evaluation results")
        self._own_commits_landed()
        if (revs is None) == (along is None):
            raise UsageError("give the commits to evaluate: revisions, or along=BRANCH (not both)")
        integers.count("every (commits)", every, minimum=1)
        with self._sessions() as s:
            if revs is not None:
                ids = ev.resolve_targets(s, [revs] if isinstance(revs, str) else list(revs))
            else:
                ids = ev.line_targets(s, along or "", every)
        if not ids:
            raise UsageError("no revision to evaluate was given")
        return self.commits(ids)

    def _record_results(self, commit_id: str, metrics: Mapping[str, float], source: str) -> None:
        self.annotate(commit_id, metrics=metrics, source=source)

    def _result_sources(self, commit_id: str) -> set[str]:
        from ckptrepo.explore.evaluate import sources_of

        return sources_of(self.annotations(commit_id))

    def _state_writer(self, fmt: str) -> Callable[[str, Path], None]:
        """``write(commit_id, path)``: the commit's state at ``path`` in format ``fmt`` (``export``
        streams safetensors and writes torch.save files; a DCP folder from its checkout)."""

        def write(commit_id: str, path: Path) -> None:
            if fmt == "dcp":
                from ckptrepo.formats import write_state

                write_state(self.checkout(commit_id), path, format="dcp")
            else:
                self.export(commit_id, path)

        return write

    # -- weight-space merges (explore.merge, explore.merging, explore.interpolate) ---------------

    def merge_weights(self, revs: Sequence[str], *, method: str, base: str | None = None,
                      weights: Sequence[float] | None = None, density: float | None = None, lam: float | None = None,
                      t: float | None = None, branch: str | None = None, message: str | None = None) -> t.Commit:
        """Merge the weights of the commits ``revs`` into a new commit on ``branch`` (default: the
        current branch), tensor by tensor (``explore.merging``: a few tensors in memory, never a
        model), with mergekit's formulas (``explore.merge``): ``method`` ``average``, ``weighted``
        (``weights``, normalised), ``task-arithmetic`` (``base``, ``weights``, ``lam``), ``ties``
        (``base``, ``weights``, ``density``, ``lam``) or ``slerp`` (two commits, ``t``).

        The commit's parents are ``revs`` in order (the first its first parent, the others merge
        edges), with a transfer edge from ``base``; its config holds ``{"merge": {"method",
        "inputs": [ids], "base": id, parameters}}``; its skeleton is the first input's. Float
        tensors are merged in fp32 and cast back; a tensor every input (and the base) holds
        unchanged is copied and deduplicates; integer and bool tensors must be equal and are copied.
        Stored as an asynchronous commit is: with ``encode="auto"`` its new chunks go raw into packs
        that this process's background repack (or ``repack``) encodes later. Before anything is
        written: UsageError for a bad method or parameter, a commit given twice, a branch whose head
        is not among ``revs``; MergeMismatch naming the first tensor missing from an input, of
        another dtype or shape, or an integer tensor that differs."""
        import time

        from ckptrepo.db import refs
        from ckptrepo.explore import merge, merging
        from ckptrepo.ids import short

        entered = time.perf_counter()
        self._check_writable("merge")
        self._check_backlog()
        if isinstance(revs, str) or not all(isinstance(r, str) for r in revs):
            raise UsageError("revs must be a list of revisions", hint="e.g. merge_weights(['main', 'ft'], ...)")
        spec = merge.spec(method, len(revs), base=base is not None, weights=weights, density=density, lam=lam, t=t)
        branch = branch or self.head
        inputs = [merging.Input(rev, *self._layout(rev)) for rev in revs]
        ids = [x.commit_id for x in inputs]
        if len(set(ids)) < len(ids):
            twice = next(x for x in inputs if ids.count(x.commit_id) > 1)
            raise UsageError(f"commit {short(twice.commit_id)} ({twice.label}) is given twice",
                             hint="Give each commit once; weights say how much each one counts.")
        with self._sessions() as s:
            head = refs.branch_head(s, branch)
        if head is not None and head not in ids:
            raise UsageError(f"branch {branch!r} is at {short(head)}, which is not among the merged commits",
                             hint="Put the merge on a new branch (-b NAME, branch=...), or merge the branch head too.")
        based = merging.Input(base, *self._layout(base)) if base is not None else None
        plan = merging.check(spec, inputs, based, self._reader, self._pool)
        config = {"merge": {**spec.to_json(), "inputs": ids, **({"base": based.commit_id} if based else {})}}
        text = message or f"Merge ({method}) of {', '.join(revs)}" + (f" onto base {base}" if base else "")
        # Stored as an asynchronous commit is (encode="auto": raw, for the background repack or
        # ``repack`` to encode; "inline": encoded now), so the merge runs at the speed of reading.
        defer = self._writer.defers(blocking=False)
        with merging.stream(plan, self._reader, self._pool) as sources:
            commit = self._writer.commit_sources(plan.skeleton, sources, {
                "message": text, "config": config, "parents": ids,
                "transfer_from": based.commit_id if based else None}, branch=branch, entered=entered, defer=defer)
        if defer:
            self._writer.repack_later()
        return commit

    def interpolate(self, a: str, b: str, *, points: int = 11,
                    fn: Callable[[Any, float], Mapping[str, float]] | None = None,
                    run: str | Sequence[str] | None = None, timeout: float | None = None,
                    on_point: Callable[[t.InterpolationPoint], None] | None = None) -> list[t.InterpolationPoint]:
        """Evaluate the straight line ``(1 - t) A + t B`` between the weights of commits ``a`` and ``b``
        at ``points`` evenly spaced ``t`` from 0 to 1 (mode connectivity; ``explore.interpolate``).
        Exactly one of ``fn(state, t)`` (in this process; returns metric name -> number) or ``run``,
        a command run on each state written to a private temporary ``.safetensors`` file (``{path}``
        in it, ``explore.runner``: the JSON object on its last line of stdout; killed after
        ``timeout`` seconds; a failure is that point's ``error``, the others go on). The states are
        never committed; the endpoints are the commits themselves. One ``InterpolationPoint`` per
        ``t``, in order (``on_point`` gets each as it is known). UsageError or MergeMismatch (as
        ``merge_weights``) before anything is evaluated."""
        from ckptrepo.explore import interpolate as line
        from ckptrepo.explore import merge, merging, runner

        self._check_open()
        ts = line.points(points)
        if (fn is None) == (run is None):
            raise UsageError("interpolate evaluates with exactly one of fn (a function) or run (a command)",
                             hint="e.g. --run 'python3 eval.py {path}'")
        if run is not None:
            runner.check_options(run, "safetensors", timeout=timeout)
        inputs = [merging.Input(rev, *self._layout(rev)) for rev in (a, b)]
        plan = merging.check(merge.spec("average", 2, base=False), inputs, None, self._reader, self._pool)
        return line.run_line(plan, ts, self._reader, self._pool, fn=fn, run=run, timeout=timeout, on_point=on_point)

    # -- lineage from the weights (explore.similar) ---------------------------------------------

    if TYPE_CHECKING:  # Repo's
        from ckptrepo.ingest.request import CommitMeta

        def commit_file(self, path: str | Path, *, branch: str | None = None, allow_pickle: bool = False,
                        allow_code: bool = False, **meta: Unpack[CommitMeta]) -> t.Commit: ...

    def similar(self, rev_or_path: str | Path | Mapping[str, Any], *, n: int = 5, exact: bool = True,
                allow_pickle: bool = False) -> list[t.Similarity]:
        """The ``n`` commits nearest to a commit or a checkpoint (a ``Path``, or a string naming an
        existing file or folder: ``formats.read_state``; or a state), hashed into chunk ids as a
        commit would hash it (nothing stored), nearest first, each with its evidence: shared chunk bytes (SQL over the
        chunk index), matched weights and a distance bound from stored statistics (no bytes
        read), and the exact relative L2 distance for the best few (reading only the chunks that
        differ; ``exact=False``: not, and the commits come ranked by the bound, from the catalog
        alone for a commit, without torch). Bounded work: see ``explore.similar``. Pruned and
        damaged commits are left out."""
        from ckptrepo.db import integers
        from ckptrepo.explore import recover

        count = integers.count("n", n, minimum=1)
        query, chunks, exclude = self._weights_of(rev_or_path, allow_pickle=allow_pickle)
        return recover.nearest(self._reading, query, chunks, self._commit_weights, self._pool, n=count,
                               exclude=exclude, exact=exact)

    def infer_parent(self, model: str | Path | Mapping[str, Any], *,
                     allow_pickle: bool = False) -> t.LineageProposal:
        """Where ``model`` (a checkpoint's ``Path`` or a string naming one, a state, or a revision) most
        likely came from among the repository's commits, from the weights alone: ``kind`` ``parent``
        or ``transfer``, the source, a score and the runner-up (``explore.infer``); a root (kind
        None) when no commit explains it. Nothing is recorded. A commit's own descendants are not
        candidates."""
        from ckptrepo.explore import recover

        query, chunks, exclude = self._weights_of(model, allow_pickle=allow_pickle)
        if query.commit_id is not None:
            exclude |= set(self.descendants(query.commit_id))
        return recover.parent_of(self._reading, query, chunks, self._commit_weights, self._pool, exclude=exclude)

    def infer_lineage(self, paths: Sequence[str | Path], *, allow_pickle: bool = False) -> list[t.LineageProposal]:
        """A tree over the checkpoints ``paths`` (files or folders, in any order, given without their
        lineage): each one's source among the others or the repository's commits, ``parent`` or
        ``transfer``, with score and runner-up (``explore.infer.tree``: a minimum spanning
        arborescence over the weights' distances, oriented by training progress). Proposals come
        parents first, each model's ``model`` its path as given; nothing is recorded
        (``commit_lineage`` commits them)."""
        from ckptrepo.explore import recover

        self._check_open()
        names = [str(p) for p in paths]
        if len(set(names)) != len(names):
            raise UsageError("a checkpoint is named twice", hint="Name each file or folder once.")
        models = [recover.load_file(Path(p), self.config.chunk_size, self._pool, allow_pickle=allow_pickle)
                  for p in names]
        return recover.tree_of(self._reading, models, self._commit_weights, self._pool)

    def commit_lineage(self, proposals: Sequence[t.LineageProposal], *, branch: str | None = None,
                       message: str | None = None, allow_pickle: bool = False) -> list[t.Commit]:
        """Commit the checkpoints of ``proposals`` (``infer_lineage``'s, parents first) with the edges
        proposed: a parent edge continues its source's branch, a transfer or a root starts one;
        ``branch`` (default: the current one) takes the first line it can continue and the others go
        on ``<branch>-<file stem>`` branches (``explore.recover.branch_plan``). Each commit is made
        as ``commit_file`` makes it (its file's name its message, after ``message`` if given); if
        one fails, those before it stay. Returns the commits, in order."""
        from ckptrepo.explore import recover

        self._check_writable("commit")
        branch = branch or self.head
        taken = [b.name for b in self.branches()]
        head = next((b.commit_id for b in self.branches() if b.name == branch), None)
        made: dict[str, str] = {}
        out: list[t.Commit] = []
        for step in recover.branch_plan(proposals, branch, head, taken):
            name = Path(step.path).name
            commit = self.commit_file(
                step.path, branch=step.branch, allow_pickle=allow_pickle,
                message=f"{message}: {name}" if message else name,
                parents=[made.get(p, p) for p in step.parents] if step.parents else None,
                transfer_from=made.get(step.transfer_from, step.transfer_from) if step.transfer_from else None)
            made[step.path] = commit.id
            out.append(commit)
        return out

    def _weights_of(self, what: Any, *, allow_pickle: bool) -> tuple[Any, dict[str, int] | None, set[str]]:
        """The model of a path, a state or a revision, its chunks (a state's; None for a commit) and
        the commits it is not compared with (a commit: itself)."""
        from ckptrepo.explore import recover

        self._check_open()
        if isinstance(what, Path) or (isinstance(what, str) and Path(what).exists()):
            model, chunks = recover.load_file(Path(what), self.config.chunk_size, self._pool, allow_pickle=allow_pickle)
            return model, chunks, set()
        if isinstance(what, str):
            from ckptrepo.errors import InvalidInput, UnknownRevision

            try:
                cid = self.resolve(what)
            except UnknownRevision:
                if "/" in what or Path(what).suffix:  # meant as a file: say that one is missing
                    raise InvalidInput(path=what, reason="no such file or folder, and no such revision") from None
                raise
            return self._commit_weights(cid), None, {cid}
        model, chunks = recover.load_state("state", what, self.config.chunk_size, self._pool,
                                           allow_pickle=allow_pickle)
        return model, chunks, set()

    def _commit_weights(self, commit_id: str) -> Any:
        """A commit's model for ``explore``: statistics from the catalog, chunks read on demand
        (``_layout``: pending commits landed, a remote's chunks kept here first)."""
        from ckptrepo.explore import recover

        return recover.load_commit(self._reading, commit_id, lambda cid, names: self._layout(cid, names)[2],
                                   self._reader.read)


def _ns_of(key: str) -> int:
    ns = time_of(key)
    assert ns is not None  # a key ``journal.append`` made
    return ns


def _check_annotation(metrics: Mapping[str, float] | None, note: str | None,
                      source: str | None) -> dict[str, float]:
    """``metrics`` as plain floats, once every part of an annotation is checked (UsageError)."""
    if metrics is not None and not isinstance(metrics, Mapping):
        raise UsageError("metrics must be a mapping of names to numbers", hint="e.g. metrics={'eval/acc': 0.91}")
    values: dict[str, float] = {}
    for name, value in (metrics or {}).items():
        if not isinstance(name, str) or not name or len(name) > MAX_NAME:
            raise UsageError(f"metric name {str(name)[:80]!r} must be a string of 1 to {MAX_NAME} characters")
        if isinstance(value, (bool, str, bytes)) or not hasattr(value, "__float__"):
            raise UsageError(f"metric {name!r}: {str(value)[:80]!r} is not a number")
        values[name] = float(value)
        if not math.isfinite(values[name]):
            raise UsageError(f"metric {name!r} = {values[name]} is not a finite number",
                             hint="Record a diverged result as a note (note=...) instead of a value.")
    for what, text in (("note", note), ("source", source)):
        if text is not None and (not isinstance(text, str) or len(text) > MAX_NOTE):
            raise UsageError(f"the {what} must be a string of at most {MAX_NOTE} characters")
    if not values and note is None:
        raise UsageError("nothing to annotate: give metrics, a note, or both",
                         hint="e.g. ckpt annotate REV --metric eval/acc=0.91 --note 'held-out set v2'")
    return values
