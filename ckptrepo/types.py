"""Every public value type the ``Repo`` API returns: plain frozen dataclasses; ``to_json`` gives
JSON-safe dicts (non-finite floats become None, times ISO 8601)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from typing import Any

from ckptrepo.ids import short


def short_id(full_id: str) -> str:
    """The id shown to people: its first 10 hex characters (unique in practice; revisions
    accept any unique prefix of 4 or more)."""
    return short(full_id)


#: The kinds of lineage edges: a commit's first and further parents, and where it was initialised from.
EDGE_KINDS = ("parent", "merge", "transfer")


@dataclass(frozen=True)
class Parent:
    """An edge from a commit to one of its parents."""

    id: str
    kind: str  # "parent" | "merge" | "transfer"
    mapping: dict[str, str] | None = None


@dataclass(frozen=True)
class Commit:
    """A commit as stored: identity, lineage, training context and ingest figures.

    Byte figures: ``logical_bytes`` is the state's tensor bytes, ``new_bytes`` the raw
    bytes of chunks this commit added to the store, ``stored_bytes`` what those chunks
    occupy encoded. Seconds: ``stall_s`` the caller was blocked, ``wait_s`` of that spent
    waiting for an in-flight slot, ``persist_s`` from the end of the stall until the packs
    are durable and the transaction that makes the commit visible begins. A commit made on
    every rank records the coordinator's figures; one made by ``dcp.save`` through
    ``ckptrepo.dcp.Writer`` records no stall (DCP decides what blocks its caller) and counts
    ``persist_s`` from the start of the save. ``pruned``: retention dropped the commit's
    data (``Repo.prune``): it stays in the lineage with its metadata and tensor statistics,
    but its state can no longer be read (``CommitPruned``). ``damage``: why the commit is
    damaged, else None: a database rebuild found its data or its manifest missing or corrupt in
    the store; it stays in the lineage but its state cannot be read (``CommitDamaged``), and
    ``verify`` fails until it is pruned (``Repo.prune(damaged=True)``). ``metrics``: what the
    commit recorded when it was made (part of its id); ``annotations``: the current value of each
    result attached later (``Repo.annotate``; its history: ``Repo.annotations``), usable wherever
    metrics are (``where``, ``best``, ``history``). ``tiers``: where the
    commit is durable: ``"local"`` (this repository's store holds its data) and the name of each
    remote known to hold it (pushed there, or fetched from it); a commit fetched but not read
    yet is on its remote only.
    """

    id: str
    message: str
    created_at: datetime
    author: str
    host: str
    branch: str | None
    step: int | None
    epoch: int | None
    parents: tuple[Parent, ...]
    metrics: dict[str, float]
    config: Any
    code_version: str | None
    n_tensors: int
    logical_bytes: int
    new_bytes: int
    stored_bytes: int
    stall_s: float
    wait_s: float
    persist_s: float
    nonfinite: int = 0
    refs: tuple[str, ...] = field(default=())
    pruned: bool = False
    damage: str | None = None
    tiers: tuple[str, ...] = ("local",)
    annotations: dict[str, float] = field(default_factory=dict)

    @property
    def short_id(self) -> str:
        return short(self.id)

    @property
    def parent_ids(self) -> list[str]:
        return [p.id for p in self.parents]

    def value(self, name: str) -> float | None:
        """The value of metric ``name``: logged with the commit, else annotated; None if neither."""
        found = self.metrics.get(name)
        return self.annotations.get(name) if found is None else found

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict (times as ISO 8601)."""
        data = asdict(self)
        data["created_at"] = self.created_at.isoformat()
        data["short_id"] = self.short_id
        return data


@dataclass(frozen=True)
class TensorStats:
    """Statistics computed at ingest over a tensor's elements (None where not meaningful)."""

    numel: int
    mean: float | None
    std: float | None
    min: float | None
    max: float | None
    l2_norm: float | None
    abs_max: float | None
    nan_count: int
    inf_count: int


@dataclass(frozen=True)
class TensorInfo:
    """A named tensor of a commit, without its bytes."""

    name: str
    tensor_id: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    n_chunks: int
    stats: TensorStats

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["shape"] = list(self.shape)
        return data


@dataclass(frozen=True)
class RefInfo:
    """A branch or tag and the commit it names."""

    name: str
    kind: str  # "branch" | "tag"
    commit_id: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RepoStats:
    """Sizes of a repository. ``tensors`` counts distinct stored tensors (a commit's files,
    stored as uint8 entries, among them); ``logical_bytes`` sums every commit's state and files; ``unique_bytes``
    is the raw size of distinct chunks; ``stored_bytes`` what those occupy encoded in packs;
    ``pack_bytes`` the pack files' total size (including unreferenced packs and indexes);
    ``alone_bytes`` what the distinct chunks would occupy with no delta encoding (each
    delta chunk at the size of its standalone encoding); ``delta_chunks`` how many chunks
    are stored as deltas.

    Savings split three ways that add up to ``logical_bytes - stored_bytes``:
    ``dedup_saved_bytes`` (identical chunks stored once), ``compression_saved_bytes``
    (standalone zstd / byte grouping) and ``delta_saved_bytes`` (difference from a base chunk,
    beyond what standalone compression would have saved)."""

    commits: int
    branches: int
    tags: int
    tensors: int
    chunks: int
    packs: int
    logical_bytes: int
    unique_bytes: int
    stored_bytes: int
    pack_bytes: int
    delta_chunks: int = 0
    alone_bytes: int = 0

    @property
    def dedup_saved_bytes(self) -> int:
        return self.logical_bytes - self.unique_bytes

    @property
    def compression_saved_bytes(self) -> int:
        return self.unique_bytes - self.alone_bytes

    @property
    def delta_saved_bytes(self) -> int:
        return self.alone_bytes - self.stored_bytes

    @property
    def dedup_ratio(self) -> float:
        return self.logical_bytes / self.unique_bytes if self.unique_bytes else 1.0

    @property
    def compression_ratio(self) -> float:
        return self.unique_bytes / self.stored_bytes if self.stored_bytes else 1.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["dedup_ratio"] = self.dedup_ratio
        data["compression_ratio"] = self.compression_ratio
        data["dedup_saved_bytes"] = self.dedup_saved_bytes
        data["compression_saved_bytes"] = self.compression_saved_bytes
        data["delta_saved_bytes"] = self.delta_saved_bytes
        return data


# -- verify ------------------------------------------------------------------------------------

#: Problem kinds that make a repository not ``ok``: something a commit needs is missing,
#: corrupt or inconsistent.
VERIFY_ERRORS = (
    "missing_pack", "damaged_pack", "bad_chunk", "corrupt_chunk", "broken_ref", "incomplete_commit",
    "damaged_commit", "missing_manifest", "damaged_manifest", "missing_journal_entry", "damaged_journal_entry",
    "store_identity",
)
#: Problem kinds that lose nothing: leftovers of interrupted writes (``gc`` removes them), a
#: journal entry of a change interrupted before its transaction, a format-1 manifest (no
#: checksum), a store that names no repository yet, a symbolic link in the staging folder, an
#: object in the store that ckptrepo does not write (``gc`` leaves it: remove it by hand).
VERIFY_WARNINGS = ("unreferenced_pack", "temporary_file", "unreferenced_manifest", "unrecorded_journal_entry",
                   "outdated_manifest", "unclaimed_store", "store_link", "foreign_object")


@dataclass(frozen=True)
class Problem:
    """One finding of ``Repo.verify``.

    ``kind`` is one of ``VERIFY_ERRORS`` or ``VERIFY_WARNINGS``; ``subject`` names what is
    wrong (a pack id, chunk id, ref name, commit id, store key or local file path) and
    ``detail`` says how, in one line. ``commits`` (full ids) and ``tensors`` (names) are
    those that can no longer be restored because of it; ``size``/``age_s`` describe
    leftover objects and files.
    """

    kind: str
    subject: str
    detail: str
    pack_id: str | None = None
    chunk_id: str | None = None
    commits: tuple[str, ...] = ()
    tensors: tuple[str, ...] = ()
    size: int | None = None
    age_s: float | None = None

    @property
    def severity(self) -> str:
        """``error`` or ``warning``."""
        return "warning" if self.kind in VERIFY_WARNINGS else "error"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["severity"] = self.severity
        data["commits"] = list(self.commits)
        data["tensors"] = list(self.tensors)
        return data


@dataclass(frozen=True)
class VerifyCounts:
    """What ``Repo.verify`` looked at."""

    packs: int = 0  # pack rows checked against the store (existence, size, index, name)
    pack_bytes: int = 0
    chunks: int = 0  # chunk rows checked against their pack's index
    tensors: int = 0  # tensor rows whose chunk list was checked
    commits: int = 0  # commits whose entries, tensors and parents were checked
    refs: int = 0
    store_objects: int = 0  # objects listed in the store
    chunks_read: int = 0  # full: chunks read, decoded and hash-verified
    bytes_read: int = 0  # full: stored bytes read for that
    manifests: int = 0  # full: manifests read, checked and compared with the database
    journal_entries: int = 0  # full: journal entries read and checked
    unverifiable_chunks: int = 0  # full: dead copies in packs whose delta base is stored nowhere
    seconds: float = 0.0


@dataclass(frozen=True)
class VerifyReport:
    """The result of ``Repo.verify``: problems by kind, and what was checked.

    ``ok`` is True when there is no error (``VERIFY_ERRORS``); warnings (unreferenced
    packs and manifests, temporary files) are leftovers of interrupted writes that ``gc``
    reclaims, or lose nothing (``VERIFY_WARNINGS``). Errors about the store's own record
    (``maintenance.verify_ledger``): ``missing_manifests`` / ``damaged_manifests`` (a rebuild
    would lose those commits' records), ``missing_journal_entries`` /
    ``damaged_journal_entries``, ``store_identity`` (the store is another repository's, or its
    identity is damaged); ``marked_damaged``: commits a rebuild marked damaged and nobody pruned.
    ``corrupt_chunks``, ``damaged_manifests`` and ``damaged_journal_entries`` are only filled by
    a full verify (which reads every chunk, manifest and journal entry).
    """

    full: bool
    checked: VerifyCounts
    missing_packs: tuple[Problem, ...] = ()
    damaged_packs: tuple[Problem, ...] = ()
    bad_chunks: tuple[Problem, ...] = ()
    corrupt_chunks: tuple[Problem, ...] = ()
    broken_refs: tuple[Problem, ...] = ()
    incomplete_commits: tuple[Problem, ...] = ()
    unreferenced_packs: tuple[Problem, ...] = ()
    temporary_files: tuple[Problem, ...] = ()
    unreferenced_manifests: tuple[Problem, ...] = ()
    missing_manifests: tuple[Problem, ...] = ()
    damaged_manifests: tuple[Problem, ...] = ()
    missing_journal_entries: tuple[Problem, ...] = ()
    damaged_journal_entries: tuple[Problem, ...] = ()
    marked_damaged: tuple[Problem, ...] = ()
    store_identity: tuple[Problem, ...] = ()
    unrecorded_journal_entries: tuple[Problem, ...] = ()
    outdated_manifests: tuple[Problem, ...] = ()
    unclaimed_store: tuple[Problem, ...] = ()
    store_links: tuple[Problem, ...] = ()
    """Symbolic links in the store's staging folder (or the folder itself): gc never follows or
    removes them; remove them by hand."""
    foreign_objects: tuple[Problem, ...] = ()
    """Objects in the store whose keys are none ckptrepo writes (not a pack, manifest, journal entry,
    lease or the identity): gc never removes them; move them out of the store by hand."""
    heads: Mapping[str, str] = field(default_factory=dict)
    """Every branch and its head commit."""
    last_good: Mapping[str, str | None] = field(default_factory=dict)
    """Per branch, the newest commit of its first-parent line that no error breaks (its head
    when the branch is whole; None when every commit of the line is broken)."""

    @property
    def errors(self) -> tuple[Problem, ...]:
        return (*self.missing_packs, *self.damaged_packs, *self.bad_chunks, *self.corrupt_chunks,
                *self.broken_refs, *self.incomplete_commits, *self.marked_damaged, *self.missing_manifests,
                *self.damaged_manifests, *self.missing_journal_entries, *self.damaged_journal_entries,
                *self.store_identity)

    @property
    def warnings(self) -> tuple[Problem, ...]:
        return (*self.unreferenced_packs, *self.temporary_files, *self.unreferenced_manifests,
                *self.unrecorded_journal_entries, *self.outdated_manifests, *self.unclaimed_store,
                *self.store_links, *self.foreign_objects)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def damaged_commits(self) -> tuple[str, ...]:
        """Every commit some error makes unrestorable, sorted."""
        return tuple(sorted({c for p in self.errors for c in p.commits}))

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict: ``ok``, ``full``, ``checked``, ``errors``, ``warnings``
        (lists of problems, each with its ``kind``), ``damaged_commits``, ``heads``
        (branch -> commit id) and ``last_good`` (branch -> commit id or null)."""
        return {
            "ok": self.ok,
            "full": self.full,
            "checked": asdict(self.checked),
            "errors": [p.to_json() for p in self.errors],
            "warnings": [p.to_json() for p in self.warnings],
            "damaged_commits": list(self.damaged_commits),
            "heads": dict(self.heads),
            "last_good": dict(self.last_good),
        }


@dataclass(frozen=True)
class GcReport:
    """What ``Repo.gc`` removed (or, with ``dry_run``, would remove).

    Rows: ``commits_removed`` (no ref reaches them), ``tensors_removed`` and ``chunks_removed``
    (no live commit needs them). Store: ``packs_removed`` (their chunk rows all went),
    ``unreferenced_packs_removed`` (no row named them: left by interrupted commits),
    ``temporary_files_removed`` (staging leftovers); ``bytes_freed`` is all of that on disk,
    ``pack_bytes_freed`` the part from ``packs_removed``. ``young_objects_kept`` /
    ``young_bytes_kept``: garbage younger than ``grace_s``, kept for a later run.
    ``leased_objects_kept`` / ``leased_bytes_kept``: unreferenced objects and staging files a
    writer's live lease may own (``live_leases`` of them; ``ledger.leases``), kept whatever
    ``grace_s``; ``stale_leases_removed``: leases of dead writers, deleted. ``links_skipped``:
    symbolic links in the store's staging folder (or the folder itself), never followed or removed.
    ``partial_packs`` hold live and dead chunks and are kept whole;
    ``dead_bytes_in_partial_packs`` is what their dead chunks occupy.
    """

    dry_run: bool
    grace_s: float
    commits_removed: int
    tensors_removed: int
    chunks_removed: int
    packs_removed: int
    unreferenced_packs_removed: int
    temporary_files_removed: int
    bytes_freed: int
    pack_bytes_freed: int
    young_objects_kept: int
    young_bytes_kept: int
    partial_packs: int
    dead_bytes_in_partial_packs: int
    seconds: float
    pruned_tensors_dropped: int = 0
    """Tensors only pruned commits name whose chunk lists went (their rows and statistics stay)."""
    leased_objects_kept: int = 0
    leased_bytes_kept: int = 0
    live_leases: int = 0
    stale_leases_removed: int = 0
    links_skipped: int = 0
    journal_entries_removed: int = 0
    """Journal entries of changes interrupted before their transaction (none recorded them)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# -- retention ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetentionRules:
    """Which commits keep their data when ``Repo.prune`` runs: a commit is kept if ANY rule keeps
    it on any first-parent line it is on (``maintenance.retention`` has the exact rules).

    ``keep_last``: the N newest commits of each line; ``keep_every``: one commit per STEPS-wide
    bucket of step; ``keep_best``: ``(metric, N)``, the N best of each line by that metric
    (lowest, or highest with ``maximize``); ``keep_dense_early``: the first commit of each step
    bucket ``[2^k, 2^(k+1))`` and step 0; ``keep_younger_than``: commits created within that
    many seconds. ``branches``: the lines of these branches only (None: every branch).
    Build and validate with ``Repo.prune``'s arguments or ``RetentionRules.from_json``.
    """

    keep_last: int | None = None
    keep_every: int | None = None
    keep_best: tuple[str, int] | None = None
    maximize: bool = False
    keep_dense_early: bool = False
    keep_younger_than: float | None = None
    branches: tuple[str, ...] | None = None

    @property
    def any_rule(self) -> bool:
        """Whether at least one keep rule is set (prune refuses to run without one)."""
        return any(x not in (None, False) for x in (self.keep_last, self.keep_every, self.keep_best,
                                                     self.keep_dense_early, self.keep_younger_than))

    def to_json(self) -> dict[str, Any]:
        """The rules as a JSON object (what the repository stores as its retention setting)."""
        data = asdict(self)
        data["keep_best"] = list(self.keep_best) if self.keep_best is not None else None
        data["branches"] = list(self.branches) if self.branches is not None else None
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RetentionRules:
        """The rules ``to_json`` gave (unknown keys are ignored; values are not validated here)."""
        best, branches = data.get("keep_best"), data.get("branches")
        return cls(keep_last=data.get("keep_last"), keep_every=data.get("keep_every"),
                   keep_best=(str(best[0]), int(best[1])) if best is not None else None,
                   maximize=bool(data.get("maximize", False)), keep_dense_early=bool(data.get("keep_dense_early")),
                   keep_younger_than=data.get("keep_younger_than"),
                   branches=tuple(str(b) for b in branches) if branches is not None else None)


@dataclass(frozen=True)
class PruneReport:
    """What ``Repo.prune`` marked (or, with ``dry_run``, would mark) as pruned.

    ``considered``: commits on the first-parent lines of the branches in scope; ``kept`` of
    them, with ``kept_by`` counting commits per reason (the rules: ``last``, ``every``,
    ``best``, ``dense_early``, ``younger``; always kept: ``head``, ``tag``, ``conflict``,
    ``fork``, ``merged``, ``transfer``, ``junction``; ``other_branch``: also on a line outside
    ``branches``); ``pruned``: the full ids newly pruned; ``already_pruned``: considered commits
    pruned before. What the next ``gc`` then frees of the data only pruned commits use:
    ``freeable_chunks`` and their stored ``freeable_bytes``, of which ``freeable_packs`` packs
    (``freeable_pack_bytes`` on disk) go whole; the rest sits in packs kept for their live chunks.
    """

    dry_run: bool
    rules: RetentionRules
    considered: int
    kept: int
    pruned: tuple[str, ...]
    already_pruned: int
    kept_by: Mapping[str, int]
    freeable_chunks: int
    freeable_bytes: int
    freeable_packs: int
    freeable_pack_bytes: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(rules=self.rules.to_json(), pruned=list(self.pruned), kept_by=dict(self.kept_by))
        return data


# -- repack ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RepackReport:
    """What one ``repack`` did (or, with ``dry_run``, would do).

    ``packs_read``: deferred or sparse packs whose chunks were moved (``deferred_packs`` /
    ``sparse_packs`` of them); ``chunks_encoded``: RAW chunks encoded (``delta_chunks`` of
    them as deltas), ``chunks_copied``: chunks moved as they were; ``bytes_before``: what
    the moved chunks occupied, ``bytes_after``: what they occupy now (both payload bytes);
    ``packs_written``/``pack_bytes_written``: the new packs; ``packs_retired``: old packs
    left without chunks, deleted by a ``gc`` once older than its grace period.
    ``stopped``: a background run gave way to a commit before it was done (the rest waits
    for the next run). ``cpu_s``: CPU time of the whole process during the run.
    """

    dry_run: bool
    deferred_packs: int = 0
    sparse_packs: int = 0
    packs_read: int = 0
    chunks_encoded: int = 0
    delta_chunks: int = 0
    chunks_copied: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    packs_written: int = 0
    pack_bytes_written: int = 0
    packs_retired: int = 0
    stopped: bool = False
    seconds: float = 0.0
    cpu_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# -- analysis ----------------------------------------------------------------------------------



@dataclass(frozen=True)
class ExactDelta:
    """Exact comparison of two same-shape, same-dtype tensors a -> b, over float64 values
    (complex128 for complex dtypes).

    ``l2_diff`` = ‖b−a‖; ``rel_change`` = ‖b−a‖/‖a‖ (None when ‖a‖ = 0); ``cosine`` =
    Re⟨a,b⟩/(‖a‖‖b‖) (None when a norm is 0); ``max_abs_diff`` = max |b−a|. ``chunks_read``
    and ``bytes_read`` count the chunk reads it took (both sides).
    """

    l2_diff: float
    rel_change: float | None
    cosine: float | None
    max_abs_diff: float
    chunks_read: int = 0
    bytes_read: int = 0

    @classmethod
    def identical(cls, norm: float | None) -> ExactDelta:
        """The comparison of a tensor with itself (nothing read)."""
        return cls(0.0, 0.0 if norm else None, 1.0 if norm else None, 0.0)


#: The stored statistics, in ``TensorStats`` field order (numel, mean, std, min, max, l2_norm, ...).
STAT_FIELDS = tuple(f.name for f in fields(TensorStats))


def _finite(value: Any) -> Any:
    """JSON has no NaN/Inf: such floats become None."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def stat_deltas(a: TensorInfo | None, b: TensorInfo | None) -> dict[str, float]:
    """b − a of each stored statistic both tensors have (empty when either is missing)."""
    if a is None or b is None:
        return {}
    out: dict[str, float] = {}
    for f in STAT_FIELDS:
        va, vb = getattr(a.stats, f), getattr(b.stats, f)
        if va is not None and vb is not None:
            out[f] = vb - va
    return out


def _jsonable(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _jsonable(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_jsonable(v) for v in data]
    return _finite(data)


@dataclass(frozen=True)
class TensorDelta:
    """One tensor name in a diff a -> b.

    ``status``: ``added`` (only in b), ``removed`` (only in a), ``changed`` (different
    tensor), ``unchanged`` (the same tensor). ``chunks_changed`` of ``n_chunks`` (the larger
    side's count) are the positions whose chunk ids differ; every chunk counts when the
    chunk sizes differ or one side is missing. ``deltas`` are b − a of the stored statistics
    both sides have. ``exact`` is set by an exact diff when comparable; ``note`` says why not.
    """

    name: str
    status: str
    a: TensorInfo | None
    b: TensorInfo | None
    chunks_changed: int = 0
    n_chunks: int = 0
    exact: ExactDelta | None = None
    note: str | None = None

    @property
    def deltas(self) -> dict[str, float]:
        """b − a of the stored statistics (see ``stat_deltas``)."""
        return stat_deltas(self.a, self.b)

    @property
    def changed_fraction(self) -> float | None:
        """``chunks_changed / n_chunks`` (None for a tensor without chunks)."""
        return self.chunks_changed / self.n_chunks if self.n_chunks else None

    @property
    def dtype_changed(self) -> bool:
        return self.a is not None and self.b is not None and self.a.dtype != self.b.dtype

    @property
    def shape_changed(self) -> bool:
        return self.a is not None and self.b is not None and self.a.shape != self.b.shape

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(changed_fraction=self.changed_fraction, dtype_changed=self.dtype_changed,
                    shape_changed=self.shape_changed, deltas=self.deltas)
        return _jsonable(data)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Diff:
    """Every tensor name of commits ``a`` and ``b`` (full ids), by name; ``files``: the files they
    keep (``Repo.files``) that differ, path -> ``added``, ``removed`` or ``changed``."""

    a: str
    b: str
    exact: bool
    tensors: tuple[TensorDelta, ...]
    files: dict[str, str] = field(default_factory=dict)

    def names(self, status: str) -> list[str]:
        return [t.name for t in self.tensors if t.status == status]

    @property
    def counts(self) -> dict[str, int]:
        """Number of tensors per status (every status present, possibly 0)."""
        out = dict.fromkeys(("added", "removed", "changed", "unchanged"), 0)
        for t in self.tensors:
            out[t.status] += 1
        return out

    def to_json(self, *, changed_only: bool = False) -> dict[str, Any]:
        """``a``, ``b``, ``exact``, ``counts`` and ``tensors`` (without unchanged ones if ``changed_only``)."""
        shown = [t for t in self.tensors if not (changed_only and t.status == "unchanged")]
        return {"a": self.a, "b": self.b, "exact": self.exact, "counts": self.counts,
                "tensors": [t.to_json() for t in shown], "files": dict(self.files)}


@dataclass(frozen=True)
class Annotation:
    """A result attached to a commit after it was made (``Repo.annotate``), like a git note: a
    metric's value (``name`` and ``value``) or a note (``name`` None, ``note`` set), with where it
    came from (``source``: ``ckpt eval``'s command, a user's label) and when. A newer value for the
    same metric supersedes an older one (``current`` False) without removing it."""

    commit_id: str
    name: str | None
    value: float | None
    note: str | None
    source: str | None
    at: datetime
    current: bool = True

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict (the time as ISO 8601)."""
        data = asdict(self)
        data["at"] = self.at.isoformat()
        return data


@dataclass(frozen=True)
class HistoryPoint:
    """One tensor in one commit of a first-parent chain, compared with the commit's first parent.

    ``depth`` 0 is the chain's head. ``tensor`` is None where the commit has no tensor of that
    name, ``previous`` where its first parent has none (or it has no parent: a root commit
    counts as following an empty state). ``status`` is ``added``, ``removed``, ``changed``,
    ``unchanged`` or ``absent`` (in neither). ``chunks_changed`` of ``n_chunks`` and ``deltas``
    (tensor − previous) are as in ``TensorDelta``. ``pruned``: retention dropped the commit's
    tensor data (its statistics, shown here, are kept; it can no longer be checked out).
    """

    commit_id: str
    step: int | None
    created_at: datetime
    depth: int
    status: str
    tensor: TensorInfo | None
    previous: TensorInfo | None = None
    chunks_changed: int = 0
    n_chunks: int = 0
    pruned: bool = False

    @classmethod
    def _fast(cls, commit_id: str, step: int | None, created_at: datetime, depth: int, status: str,
              tensor: TensorInfo | None, previous: TensorInfo | None, chunks_changed: int,
              n_chunks: int, pruned: bool = False) -> HistoryPoint:
        """The constructor's result (every field given), without its ``object.__setattr__`` call
        per field of a frozen dataclass: a third of the time, for ``history``'s 10,000 points."""
        point = object.__new__(cls)
        fields = point.__dict__
        fields["commit_id"], fields["step"], fields["created_at"], fields["depth"] = commit_id, step, created_at, depth
        fields["status"], fields["tensor"], fields["previous"] = status, tensor, previous
        fields["chunks_changed"], fields["n_chunks"], fields["pruned"] = chunks_changed, n_chunks, pruned
        return point

    @property
    def deltas(self) -> dict[str, float]:
        """tensor − previous of the stored statistics (see ``stat_deltas``)."""
        return stat_deltas(self.previous, self.tensor)

    @property
    def present(self) -> bool:
        return self.tensor is not None

    @property
    def changed(self) -> bool:
        return self.status in ("added", "removed", "changed")

    @property
    def changed_fraction(self) -> float | None:
        return self.chunks_changed / self.n_chunks if self.n_chunks else None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["previous"]  # the previous point's tensor, or deltas say what matters of it
        data.update(created_at=self.created_at.isoformat(), short_id=short(self.commit_id), present=self.present,
                    changed=self.changed, changed_fraction=self.changed_fraction, deltas=self.deltas)
        return _jsonable(data)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class MetricPoint:
    """The requested metrics a commit of a first-parent chain records (``depth`` 0 = head);
    ``annotated``: those of ``values`` that are annotations (results attached later,
    ``Repo.annotate``), not metrics logged with the commit."""

    commit_id: str
    step: int | None
    created_at: datetime
    depth: int
    values: dict[str, float]
    annotated: frozenset[str] = frozenset()


# -- the lineage graph -------------------------------------------------------------------------


@dataclass(frozen=True)
class GraphNode:
    """One commit as a drawing of the lineage graph needs it (``Repo.graph``), without its
    metrics, config or figures.

    ``title``: the first line of its message. ``generation``: 1 + the highest generation of its
    parents through any edge kind (1 for a root), so every edge goes from a higher generation to
    a lower one. ``line`` / ``line_depth``: its first-parent line (named by the id of the line's
    first commit) and its first-parent hops to a root; the commits of one line form a chain of
    first parents, one commit per depth (see ``Commit``'s docstring in ``db.models``).
    ``damaged``: the commit is damaged (``Commit.damage``).
    """

    id: str
    title: str
    created_at: datetime
    branch: str | None
    step: int | None
    pruned: bool
    generation: int
    line: str
    line_depth: int
    damaged: bool = False

    @property
    def short_id(self) -> str:
        return short(self.id)


@dataclass(frozen=True)
class GraphEdge:
    """An edge of the lineage graph: ``child`` -> ``parent``, ``kind`` one of ``EDGE_KINDS``,
    ``position`` its order among the child's parents (0: the first parent)."""

    child: str
    parent: str
    kind: str
    position: int


@dataclass(frozen=True)
class LineageGraph:
    """The lineage graph, or the part of it a revision descends from (``Repo.graph``).

    ``nodes``: oldest first (by generation, then time, then id), so a commit comes after all
    its parents. ``edges``: every edge between two of them, by child then position. ``refs``:
    every branch, then every tag, then every remote-tracking ref, by name (including refs at
    commits outside ``nodes``).
    """

    nodes: tuple[GraphNode, ...]
    edges: tuple[GraphEdge, ...]
    refs: tuple[RefInfo, ...]

    def to_json(self) -> dict[str, Any]:
        """``nodes`` (with ``short_id``; times ISO 8601), ``edges`` and ``refs`` as JSON objects."""
        nodes = []
        for n in self.nodes:
            data = asdict(n)
            data.update(created_at=n.created_at.isoformat(), short_id=n.short_id)
            nodes.append(data)
        return {"nodes": nodes, "edges": [asdict(e) for e in self.edges], "refs": [r.to_json() for r in self.refs]}


# -- rebuild -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RebuildReport:
    """What ``Repo.rebuild_database`` recreated from the store alone.

    ``packs`` / ``chunks``: read from the packs' footers; ``commits`` from their manifests
    (``pruned``: of them, marked pruned: by the journal, or because their chunks are gone);
    ``branches`` / ``tags``: replayed from the commits' branch moves and the journal
    (``conflicts``: commits whose move did not apply, kept on ``conflicts/`` branches).
    ``skipped``: what could not be used, each with why (a corrupt pack or manifest, a commit
    whose parent has no manifest). ``moved_aside``: where the database it replaced went (a
    SQLite file kept beside the new one), if any. ``manifest_bytes``: the manifests' stored
    size in all. ``damaged``: commits recorded as damaged (their manifest, or data they need,
    missing or refused: ``Commit.damage``); ``recovered``: commits whose record came from the
    database being replaced, their manifest being missing or refused. ``ok``: nothing was
    skipped and nothing is damaged.
    """

    database: str
    packs: int
    chunks: int
    commits: int
    pruned: int
    branches: int
    tags: int
    conflicts: int
    journal_entries: int
    manifest_bytes: int
    skipped: tuple[str, ...]
    moved_aside: str | None
    seconds: float
    damaged: int = 0
    recovered: int = 0

    @property
    def ok(self) -> bool:
        return not self.skipped and not self.damaged

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["skipped"] = list(self.skipped)
        data["ok"] = self.ok
        return data


@dataclass(frozen=True)
class RemoteInfo:
    """A remote of this repository (``Repo.remotes``): its name, URL (a folder or
    ``s3://BUCKET/PREFIX``), whether commits replicate to it in the background (``replicate``) and
    whether tensor bytes this repository lacks are read from it (``lazy``: the remote a lazy
    clone came from)."""

    name: str
    url: str
    replicate: bool = False
    lazy: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RefUpdate:
    """One ref a push or fetch moved: ``kind`` (``branch``, ``tag``, or ``remote`` for a
    remote-tracking ref such as ``origin/main``), its name, where it was (``old``, None: it did
    not exist) and is (``new``, None: deleted); ``forced``: not a fast-forward."""

    kind: str
    name: str
    old: str | None
    new: str | None
    forced: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PushResult:
    """What ``Repo.push`` moved: ``commits`` whose manifests were uploaded, ``packs`` and
    ``chunks`` uploaded (only chunks the remote lacked, packed anew) and ``bytes_uploaded`` in all
    (packs, manifests, journal, refs); ``refs``: the remote refs moved (compare-and-swap, after
    every object they need was durable on the remote); ``annotations``: annotation entries
    copied (``Repo.annotate``'s, of commits the remote holds, that it lacked)."""

    remote: str
    commits: int
    packs: int
    chunks: int
    bytes_uploaded: int
    refs: tuple[RefUpdate, ...]
    seconds: float
    annotations: int = 0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["refs"] = [r.to_json() for r in self.refs]
        return data


@dataclass(frozen=True)
class FetchResult:
    """What ``Repo.fetch`` (and a clone) brought: ``commits`` recorded from their manifests,
    ``packs_indexed`` remote packs whose footers were read, ``bytes_downloaded`` in all (footers,
    manifests, journal, refs, and tensor bytes fetched with ``data``: ``data_chunks`` /
    ``data_bytes``); ``refs``: remote-tracking refs (``origin/main``) and tags moved; ``pruned``:
    fetched commits the remote marks pruned; ``annotations``: the remote's annotation entries
    recorded here (on commits this repository has); ``skipped``: what could not be used, each with why
    (a damaged manifest: that commit is recorded as a damaged node, and its ancestors that
    nothing else reaches are not fetched; a damaged pack footer); ``ok``: nothing skipped."""

    remote: str
    commits: int
    packs_indexed: int
    bytes_downloaded: int
    refs: tuple[RefUpdate, ...]
    pruned: int
    data_chunks: int
    data_bytes: int
    seconds: float
    skipped: tuple[str, ...] = ()
    annotations: int = 0

    @property
    def ok(self) -> bool:
        return not self.skipped

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["refs"] = [r.to_json() for r in self.refs]
        data["skipped"] = list(self.skipped)
        data["ok"] = self.ok
        return data


@dataclass(frozen=True)
class PullResult:
    """``Repo.pull``: the fetch, then ``branch`` fast-forwarded from ``old`` to ``new`` (equal:
    it was up to date)."""

    fetch: FetchResult
    branch: str
    old: str | None
    new: str | None

    def to_json(self) -> dict[str, Any]:
        return {"fetch": self.fetch.to_json(), "branch": self.branch, "old": self.old, "new": self.new}


@dataclass(frozen=True)
class RecoveryPoint:
    """Where one branch stands on each tier: its head here (``local``) and the newest of its
    commits the remote holds (``remote``, None: none yet), with what would be lost if the local
    tier died now: ``commits_at_risk`` on the branch's first-parent line after ``remote``, and the
    steps and seconds between the two commits (None when not known)."""

    branch: str
    local: str
    remote: str | None
    commits_at_risk: int
    steps_at_risk: int | None
    seconds_at_risk: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ReplicationStatus:
    """``Repo.replication()``: the remote commits replicate to, the backlog (commits here the
    remote does not hold yet and their stored bytes), the recovery point of each branch, and the
    last replication error (None: the last push worked, or none ran yet)."""

    remote: str
    backlog_commits: int
    backlog_bytes: int
    points: tuple[RecoveryPoint, ...]
    last_error: str | None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["points"] = [p.to_json() for p in self.points]
        return data


# -- evaluation and bisect ---------------------------------------------------------------------


@dataclass(frozen=True)
class EvalResult:
    """One commit of an evaluation run (``Repo.evaluate``, ``Repo.evaluate_command``, ``ckpt eval``).

    ``status``: ``ok`` (``metrics`` were recorded as annotations of the commit, with ``source``),
    ``failed`` (``reason`` says why: the command's exit status, a timeout, a last line of stdout
    that is no JSON object of numbers, an export that failed; ``stderr`` holds the end of the
    command's stderr) or ``skipped`` (``reason``: the commit already has results from ``source``,
    or its data is pruned or damaged). ``returncode``: the command's exit status (None: no command
    ran, or it timed out). ``seconds``: the export, the run and the recording together."""

    commit_id: str
    step: int | None
    status: str  # "ok" | "failed" | "skipped"
    source: str
    metrics: dict[str, float] = field(default_factory=dict)
    reason: str | None = None
    stderr: str = ""
    returncode: int | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def short_id(self) -> str:
        return short(self.commit_id)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["short_id"] = self.short_id
        return _jsonable(data)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class BisectStep:
    """One commit ``Repo.bisect`` tested: its ``verdict`` (``good``: the predicate is false there,
    ``bad``: true, ``skip``: it could not be tested) and ``detail`` (the command's exit status,
    or why it was skipped). ``remaining``: commits left that could be the first bad one after it."""

    commit_id: str
    step: int | None
    verdict: str  # "good" | "bad" | "skip"
    detail: str | None = None
    remaining: int = 0
    seconds: float = 0.0

    @property
    def short_id(self) -> str:
        return short(self.commit_id)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["short_id"] = self.short_id
        return data


@dataclass(frozen=True)
class BisectResult:
    """What ``Repo.bisect`` found on the first-parent line from ``good`` (exclusive) to ``bad``
    (inclusive): ``first_bad``, the first commit where the predicate (``predicate``: how it was
    given) turns true, whose first parent ``parent`` it is false at. Binary search assumes that the
    predicate, once true, stays true; where it does not, ``first_bad`` is a commit where it turns
    true. ``candidates``: the commits that may be the first bad one (``first_bad`` alone, unless
    commits that could not be tested, ``skip``, leave several). ``commits``: how many the line
    holds; ``tested``: each test, in order (the two ends first); ``changed``: the tensors whose
    stored statistics changed most from ``parent`` to ``first_bad``, largest first (tensors that
    gained NaN or Inf values first, then by the relative change of their L2 norm)."""

    good: str
    bad: str
    predicate: str
    first_bad: str
    first_bad_step: int | None
    parent: str
    candidates: tuple[str, ...]
    commits: int
    tested: tuple[BisectStep, ...]
    changed: tuple[TensorDelta, ...] = ()

    @property
    def steps(self) -> int:
        """How many tests were made (the two ends included)."""
        return len(self.tested)

    @property
    def found(self) -> bool:
        """Whether one commit was pinned down (no untested commit left that could be it)."""
        return len(self.candidates) == 1

    def to_json(self) -> dict[str, Any]:
        return _jsonable({  # type: ignore[no-any-return]
            "good": self.good, "bad": self.bad, "predicate": self.predicate, "first_bad": self.first_bad,
            "first_bad_short_id": short(self.first_bad), "first_bad_step": self.first_bad_step,
            "parent": self.parent, "candidates": list(self.candidates), "found": self.found,
            "commits": self.commits, "steps": self.steps, "tested": [s.to_json() for s in self.tested],
            "changed": [d.to_json() for d in self.changed],
        })


# -- lineage from the weights (Repo.similar, Repo.infer_parent, Repo.infer_lineage) -----------------


@dataclass(frozen=True)
class Similarity:
    """A commit near a model (``Repo.similar``) and the evidence of each stage that looked at it:
    ``shared_bytes`` of the model's distinct chunks the commit holds (``shared_fraction`` of them:
    frozen or unchanged parts, copies); ``matched_tensors`` of the model's ``query_tensors`` weights
    (floating-point tensors that are not optimizer state) the commit holds, by name and shape or as
    identical content under another name; ``stat_distance``, a lower bound of the distance from
    stored statistics alone; ``exact_distance``, the relative L2 distance over the model's weights,
    ``sqrt(sum ||q_t - c_t||^2 + sum of ||q_t||^2 over weights the commit lacks) / ||q||`` (0: the
    same weights; 1: the commit explains none of them), None when the exact stage did not reach
    the commit; ``per_tensor``: each matched weight's own ``||q_t - c_t|| / ||q_t||`` (exact only).
    ``score``: 1 - the distance (exact, else the bound), between 0 and 1."""

    commit_id: str
    score: float
    shared_bytes: int
    shared_fraction: float
    matched_tensors: int
    query_tensors: int
    stat_distance: float
    exact_distance: float | None
    per_tensor: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = _jsonable(asdict(self))
        data["short_id"] = short(self.commit_id)
        return data  # type: ignore[no-any-return]


@dataclass(frozen=True)
class LineageEvidence:
    """What a proposed edge ``source -> model`` rests on: ``distance`` (the exact relative L2
    distance of ``Similarity``, from the source to the model), ``frozen_fraction`` (of the bytes of
    the weights both hold, the share identical), the model's weights the source holds
    (``matched_tensors``), lacks (``new_tensors``) and the source's the model lacks
    (``dropped_tensors``), ``direction``: which cue oriented the edge (``steps``: training progress,
    an optimizer step counter or the recorded step; ``names``: tensors dropped; ``tail``: the weights'
    tail index, ``log(abs_max / std)``, which grows with training; ``none``), ``against``: that cue
    opposes the edge (its cost carries a penalty), and ``mapping``: ``{model name: source name}`` of
    weights taken under another name."""

    distance: float
    frozen_fraction: float
    matched_tensors: int
    new_tensors: int
    dropped_tensors: int
    direction: str
    against: bool
    mapping: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return _jsonable(asdict(self))  # type: ignore[no-any-return]


@dataclass(frozen=True)
class LineageCandidate:
    """A possible source of a model: a commit id, or (``Repo.infer_lineage``) the path of another
    model of the same set; ``kind`` ``parent`` or ``transfer``; ``score`` 1 - the edge's cost (its
    distance, with the penalty of a direction cue that opposes it), between 0 and 1."""

    source: str
    kind: str
    score: float
    evidence: LineageEvidence

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "kind": self.kind, "score": _finite(self.score),
                "evidence": self.evidence.to_json()}


@dataclass(frozen=True)
class LineageProposal:
    """Where ``model`` (a checkpoint's path, or a commit id) most likely came from, from its weights
    (``Repo.infer_parent``, ``Repo.infer_lineage``): ``kind`` ``parent`` (a fine-tune, a later
    checkpoint, a fork) or ``transfer`` (a frozen body under new or renamed tensors: its ``mapping``
    in ``evidence``), from ``parent`` (a commit id, or the path of another model of the same set);
    ``kind`` and ``parent`` None when nothing explains it better than a new root would. ``score``: the
    chosen edge's (``LineageCandidate``), 0 for a root; ``runner_up``: the next best source."""

    model: str
    kind: str | None
    parent: str | None
    score: float
    runner_up: LineageCandidate | None
    evidence: LineageEvidence | None

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "kind": self.kind, "parent": self.parent, "score": _finite(self.score),
                "runner_up": self.runner_up.to_json() if self.runner_up is not None else None,
                "evidence": self.evidence.to_json() if self.evidence is not None else None}


@dataclass(frozen=True)
class InterpolationPoint:
    """One point of the straight line between two commits' weights (``Repo.interpolate``, ``ckpt
    interpolate``): the state ``(1 - t) A + t B`` (never committed) and what evaluating it gave.
    ``metrics``: name -> number (empty when the evaluation failed); ``error``: why it failed (the
    command's exit status, a timeout, a last line of stdout that is no JSON object of numbers;
    None: it did not); ``stderr``: the end of the command's stderr; ``seconds``: writing the state
    and evaluating it."""

    t: float
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    stderr: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        return {"t": self.t, "metrics": dict(self.metrics), "error": self.error, "stderr": self.stderr,
                "seconds": self.seconds}


@dataclass(frozen=True)
class FollowUpdate:
    """What one update of a follower did (``Repo.follow``: the follower's ``last``): the commit
    applied and the one held before (None: the first, applied in full), tensors whose id changed,
    chunks read (``delta_chunks`` of them delta payloads decoded against the follower's own bytes
    or down a chain to them, ``fallbacks`` read again from the store alone after that failed its
    check), the stored bytes actually read for it (``bytes_read``, in ``reads`` requests: what a
    lazy clone fetched from its remote too) and the seconds from reading the layout to applied."""

    commit_id: str
    previous: str | None
    tensors_changed: int
    chunks_read: int
    delta_chunks: int
    fallbacks: int
    bytes_read: int
    reads: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"commit": self.commit_id, "previous": self.previous, "tensors_changed": self.tensors_changed,
                "chunks_read": self.chunks_read, "delta_chunks": self.delta_chunks, "fallbacks": self.fallbacks,
                "bytes_read": self.bytes_read, "reads": self.reads, "seconds": self.seconds}
