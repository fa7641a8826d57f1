"""Running a user's command on a state written to a file: ``ckpt eval``, ``ckpt bisect --run`` and
any other command that evaluates states (``ckpt interpolate --run``: states that are no commit).

Three parts, each usable alone:

- ``private_folder()`` / ``exported(write, fmt)``: a temporary folder only this user can read
  (mode 0700), removed with everything in it when the block ends, and the state written into it
  by ``write(path)`` (a commit's export, or ``formats.write_state`` of any state) at
  ``state_path(folder, fmt)``: ``state.safetensors``, ``state.pt`` or the folder ``state`` (dcp).
- ``run_command(command, path, rev=, step=, timeout=)``: the command with ``{path}``, ``{rev}``
  and ``{step}`` replaced (``substitute``) and the same values in its environment
  (``ENV_PATH``, ``ENV_REV``, ``ENV_STEP``: ``CKPT_EVAL_PATH``, ``CKPT_EVAL_REV``,
  ``CKPT_EVAL_STEP``), run to its end or its timeout; returns a ``RunOutcome`` (exit status,
  the metrics its last line of stdout gives, why it failed, the tail of its stderr).
- ``parse_metrics(stdout)``: the JSON object of metrics (name -> finite number) on the last
  non-blank line of a command's stdout; ``MetricsError`` saying what is wrong otherwise.

A command given as a string runs through ``/bin/sh``: each substituted value is quoted with
``shlex.quote``, so a path, revision or step can never become shell syntax (inside a quoted
program, such as ``python3 -c '...'``, read the environment variables instead). A command given
as a list of arguments runs without a shell, each placeholder replaced by the bare value.
Only ``{path}``, ``{rev}`` and ``{step}`` are placeholders: other braces (a JSON literal in a
``python3 -c`` program) stay as they are. The command runs in its own process group with no
standard input; a timeout kills the whole group, and so does ``stop_all`` (an interrupted
caller). Nothing here imports torch, and nothing extra runs in the child: the command alone.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

#: The formats a state is written in for a command (``formats.FORMATS``), and each one's name in the folder.
STATE_NAMES = {"safetensors": "state.safetensors", "torch": "state.pt", "dcp": "state"}
#: The environment variables a command gets (besides its placeholders): set for the child, never
#: read by ckptrepo, so they are no knobs (``knobs.KNOBS``).
ENV_PATH, ENV_REV, ENV_STEP = "CKPT_EVAL_PATH", "CKPT_EVAL_REV", "CKPT_EVAL_STEP"
COMMAND_ENVIRONMENT = (ENV_PATH, ENV_REV, ENV_STEP)  # set for a user's command: not knobs ckptrepo reads
#: How much of a failed command's stderr a result keeps (its last lines, at most this many characters).
STDERR_TAIL = 2000
STDERR_LINES = 20
MAX_NAME = 255  # a metric name's length (the catalog's column)
MAX_JOBS = 256  # commands run at once, at most
_PLACEHOLDER = re.compile(r"\{(path|rev|step)\}")
_STDOUT_KEEP = 1 << 20  # of stdout, only the end matters (its last line)


class MetricsError(ValueError):
    """The last line of a command's stdout is not a JSON object of metrics; the message says why."""


@dataclass(frozen=True)
class RunOutcome:
    """What one run of a command gave.

    ``returncode``: its exit status (negative: killed by that signal; None: it did not start or
    timed out). ``metrics``: the JSON object of its last line of stdout, when it was parsed and
    valid (None otherwise, or when not parsed). ``error``: why the run failed (None: it did not):
    ``exit status N``, ``timed out after S s``, ``could not start: ...``, or what is wrong with
    its last line. ``stderr_tail``: the last lines of its stderr. ``last_line``: the last
    non-blank line of its stdout (at most 200 characters). ``seconds``: wall time of the run."""

    returncode: int | None
    metrics: dict[str, float] | None
    error: str | None
    stderr_tail: str
    last_line: str
    seconds: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        """It exited with status 0 and (when parsed) printed valid metrics."""
        return self.error is None


def state_path(folder: Path, fmt: str) -> Path:
    """Where a state in format ``fmt`` is written inside ``folder`` (``STATE_NAMES``); ValueError
    for another format."""
    try:
        return folder / STATE_NAMES[fmt]
    except KeyError:
        raise ValueError(f"unknown format {fmt!r}: one of {', '.join(STATE_NAMES)}") from None


@contextmanager
def private_folder(prefix: str = "ckpt-eval-", parent: Path | None = None) -> Iterator[Path]:
    """A new folder only this user can enter (``tempfile.mkdtemp``: mode 0700), in ``parent`` or
    the temporary folder, removed with everything in it when the block ends (however it ends)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def exported(write: Callable[[Path], None], fmt: str, *, parent: Path | None = None) -> Iterator[Path]:
    """The path of a state that ``write(path)`` wrote in format ``fmt`` into a ``private_folder``,
    removed when the block ends. ``write`` is a commit's export (``Repo.export``, or
    ``formats.write_state(repo.checkout(rev), path, format=fmt)``) or any state's ``write_state``."""
    with private_folder(parent=parent) as folder:
        path = state_path(folder, fmt)
        write(path)
        yield path


def substitute(command: str, *, path: Path | str, rev: str | None = None, step: int | None = None,
               shell: bool = True) -> str:
    """``command`` with each ``{path}``, ``{rev}`` and ``{step}`` replaced by its value (an
    unknown ``rev`` or ``step``: the empty string), quoted with ``shlex.quote`` when ``shell``.
    Other text, braces included, is kept as it is."""
    values = {"path": str(path), "rev": rev or "", "step": "" if step is None else str(step)}
    quote = shlex.quote if shell else (lambda text: text)
    return _PLACEHOLDER.sub(lambda m: quote(values[m.group(1)]), command)


def child_env(path: Path | str, rev: str | None, step: int | None,
              base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a command: ``base`` (default: this process's) plus ``ENV_PATH``,
    ``ENV_REV`` and ``ENV_STEP`` (empty when unknown)."""
    env = dict(os.environ if base is None else base)
    env.update({ENV_PATH: str(path), ENV_REV: rev or "", ENV_STEP: "" if step is None else str(step)})
    return env


def parse_metrics(stdout: str) -> dict[str, float]:
    """The metrics on the last non-blank line of ``stdout``: a JSON object of names (1 to 255
    characters) to finite numbers (not booleans), at least one. MetricsError naming what is wrong:
    no output, a last line that is no JSON object, a value that is not a finite number."""
    line = last_line(stdout)
    if not line:
        raise MetricsError("it printed nothing on stdout; its last line must be a JSON object of metrics, "
                           'e.g. {"loss": 0.31}')
    try:
        data = json.loads(line)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise MetricsError(f"the last line of its stdout is not a JSON object: {_cut(line)!r}")
    if not data:
        raise MetricsError("the JSON object on the last line of its stdout holds no metric")
    out: dict[str, float] = {}
    for name, value in data.items():
        if not name or len(name) > MAX_NAME:
            raise MetricsError(f"metric name {_cut(name)!r} is not 1 to {MAX_NAME} characters long")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise MetricsError(f"metric {_cut(name)!r} is not a number: {_cut(json.dumps(value))}")
        number = float(value)
        if not math.isfinite(number):
            raise MetricsError(f"metric {_cut(name)!r} is not a finite number: {value}")
        out[name] = number
    return out


def last_line(stdout: str) -> str:
    """The last line of ``stdout`` that is not blank, stripped ('' when there is none)."""
    for line in reversed(stdout.splitlines()):
        if line.strip():
            return line.strip()
    return ""


def _cut(text: str, width: int = 200) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def tail(text: str, *, lines: int = STDERR_LINES, chars: int = STDERR_TAIL) -> str:
    """The last ``lines`` lines of ``text`` (without its trailing blank lines), at most ``chars``
    characters of them."""
    kept = "\n".join(text.rstrip().splitlines()[-lines:])
    return kept if len(kept) <= chars else "..." + kept[-(chars - 3):]


# -- running -------------------------------------------------------------------------------------

_live: set[subprocess.Popen[bytes]] = set()
_live_lock = threading.Lock()


def stop_all() -> None:
    """Kill the process group of every command ``run_command`` is running now (a caller that was
    interrupted: the commands run in groups of their own, which Ctrl-C does not reach)."""
    with _live_lock:
        running = list(_live)
    for proc in running:
        _kill_group(proc)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_command(command: str | Sequence[str], path: Path | str, *, rev: str | None = None, step: int | None = None,
                timeout: float | None = None, parse: bool = True, env: Mapping[str, str] | None = None,
                cwd: Path | str | None = None) -> RunOutcome:
    """Run ``command`` on the state at ``path`` (a file or folder: ``exported``) and wait for it.

    A string runs through ``/bin/sh``, a sequence of arguments without a shell; ``{path}``,
    ``{rev}`` (a commit's full id) and ``{step}`` are replaced (``substitute``) and given as
    ``ENV_PATH``, ``ENV_REV``, ``ENV_STEP`` in its environment (``child_env``, over ``env`` or
    this process's). No standard input; its own process group, killed whole after ``timeout``
    seconds. With ``parse``, a run that exits 0 must print its metrics as the last line of
    stdout (``parse_metrics``), or it fails with what is wrong; without, only the exit status
    counts (``ckpt bisect --run``). Never raises for the command's own failures: the outcome says.
    """
    shell = isinstance(command, str)
    if isinstance(command, str):
        args: str | list[str] = substitute(command, path=path, rev=rev, step=step, shell=True)
    else:
        args = [substitute(a, path=path, rev=rev, step=step, shell=False) for a in command]
    started = time.perf_counter()
    try:
        proc = subprocess.Popen(args, shell=shell, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=child_env(path, rev, step, env), cwd=cwd,
                                start_new_session=True)
    except OSError as exc:
        return RunOutcome(None, None, f"could not start: {exc.strerror or exc}", "", "",
                          time.perf_counter() - started)
    with _live_lock:
        _live.add(proc)
    timed_out = False
    try:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            out, err = proc.communicate()
        except BaseException:  # interrupted: the command must not outlive its caller
            _kill_group(proc)
            proc.wait()
            raise
    finally:
        with _live_lock:
            _live.discard(proc)
    seconds = time.perf_counter() - started
    stdout = out[-_STDOUT_KEEP:].decode("utf-8", errors="replace")
    stderr = tail(err[-64 * STDERR_TAIL:].decode("utf-8", errors="replace"))
    line = _cut(last_line(stdout))
    if timed_out:
        return RunOutcome(None, None, f"timed out after {timeout:g} s", stderr, line, seconds, timed_out=True)
    code = proc.returncode
    if code != 0:
        why = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        return RunOutcome(code, None, why, stderr, line, seconds)
    if not parse:
        return RunOutcome(code, None, None, stderr, line, seconds)
    try:
        metrics = parse_metrics(stdout)
    except MetricsError as exc:
        return RunOutcome(code, None, str(exc), stderr, line, seconds)
    return RunOutcome(code, metrics, None, stderr, line, seconds)


@dataclass
class Workspace:
    """Numbered subfolders of one ``private_folder`` for states written at once (``-j``), each
    removed as soon as its run is over (``release``)."""

    root: Path
    _next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def claim(self, fmt: str) -> Path:
        """A new, empty subfolder's ``state_path`` for format ``fmt``."""
        with self._lock:
            self._next += 1
            folder = self.root / f"{self._next:06d}"
        folder.mkdir(mode=0o700)
        return state_path(folder, fmt)

    def release(self, path: Path) -> None:
        """Remove the subfolder of a path ``claim`` gave, with what is in it."""
        shutil.rmtree(path.parent, ignore_errors=True)


def check_options(command: str | Sequence[str], fmt: str, *, timeout: float | None = None, jobs: int = 1) -> str:
    """UsageError unless ``command`` is a non-empty string or list of strings, ``fmt`` one of
    ``STATE_NAMES``, ``timeout`` None or a positive number of seconds and ``jobs`` 1 to 256;
    returns the command as one line of text (the default source of its results: ``eval: TEXT``)."""
    from ckptrepo.errors import UsageError

    if isinstance(command, str):
        text = command.strip()
    elif isinstance(command, Sequence) and all(isinstance(a, str) for a in command):
        text = shlex.join(command)
    else:
        raise UsageError("the command must be a string (run through /bin/sh) or a list of strings (its arguments)")
    if not text:
        raise UsageError("the command is empty", hint="e.g. --run 'python3 eval.py {path}'")
    if fmt not in STATE_NAMES:
        raise UsageError(f"unknown format {fmt!r}", hint=f"Use one of {', '.join(STATE_NAMES)}.")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                or not math.isfinite(timeout) or timeout <= 0):
        raise UsageError(f"timeout {timeout!r} is not a positive number of seconds")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or not 1 <= jobs <= MAX_JOBS:
        raise UsageError(f"jobs {jobs!r} is not a whole number from 1 to {MAX_JOBS}")
    return text
