"""The ``ckpt`` command line: global options, the command list, and the one place errors become exit codes.

Every command is a thin function over ``ckptrepo.Repo`` (in the ``*_commands`` modules);
``CkptGroup.invoke`` turns any exception a command raises into ``error:`` and ``hint:``
lines on stderr and an exit code (see ``failures``); under ``--json``, into one JSON line on
stderr, Typer's own usage errors too. Typer's own usage errors exit 2.
"""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING, Annotated, Any

import typer
import typer.main
from typer.core import TyperGroup

from . import failures
from .options import DebugOpt, ReadOnlyOpt, RepoOpt
from .session import Session, begin, current

if TYPE_CHECKING:
    from typer._click.core import Command  # Typer's vendored click, which Typer does not export


class CkptGroup(TyperGroup):
    """A command group that reports failures of its commands as one error line plus a hint."""

    # ctx is Typer's vendored click Context, which Typer does not export.
    def invoke(self, ctx: Any) -> Any:
        # The command's own arguments, looked at before they are parsed: a usage error found while
        # parsing them (an unknown option) comes before --json's callback could run.
        protected = ctx._protected_args if hasattr(ctx, "_protected_args") else ctx.protected_args  # click < 8.2
        asks_json = _asks_json([*protected, *ctx.args])
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort):
            raise  # --help and explicit exits keep Typer's handling
        except typer.TyperException as exc:
            if not (asks_json or current().json):
                raise  # usage errors (exit 2) keep Typer's handling
            raise typer.Exit(failures.emit(failures.usage(exc))) from exc
        except (Exception, KeyboardInterrupt) as exc:
            raise typer.Exit(failures.report(exc, debug=current().debug, as_json=current().json)) from exc


def _asks_json(args: list[str]) -> bool:
    """Whether ``--json`` is among a command line's options (before a ``--``, after which every
    word is an argument)."""
    return "--json" in (args[: args.index("--")] if "--" in args else args)


GC_THRESHOLD = 50_000  # allocations between two collections of the youngest generation (``main``)

REPOSITORY, COMMITS, REFS, ANALYSIS, REMOTES = "Repository", "Commits", "Branches and tags", "Analysis", "Remotes"
GROUP = ""  # the function of a group of commands (``_GROUPS``)

# Every command and group, in the order of ``ckpt --help``: name -> (module, function, help panel).
# A command's module is imported, and its click command built, when the command is looked up
# (``_Commands``): ``ckpt log`` imports and builds ``log`` alone, not the other commands (whose
# modules import the formats, plotting, sockets, and whose signatures Typer reads one by one).
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "init": ("repo_commands", "init", REPOSITORY),
    "status": ("repo_commands", "status", REPOSITORY),
    "commit": ("state_commands", "commit", COMMITS),
    "import-run": ("state_commands", "import_run", COMMITS),
    "checkout": ("state_commands", "checkout", COMMITS),
    "log": ("history_commands", "log", COMMITS),
    "show": ("history_commands", "show", COMMITS),
    "annotate": ("history_commands", "annotate", COMMITS),
    "merge": ("merge_commands", "merge", COMMITS),
    "branch": ("ref_commands", "branch", REFS),
    "tag": ("ref_commands", "tag", REFS),
    "stats": ("repo_commands", "stats", REPOSITORY),
    "verify": ("verify_commands", "verify", REPOSITORY),
    "gc": ("verify_commands", "gc", REPOSITORY),
    "prune": ("retention_commands", "prune", REPOSITORY),
    "repack": ("verify_commands", "repack", REPOSITORY),
    "lineage": ("lineage_commands", GROUP, COMMITS),
    "best": ("lineage_commands", "best", COMMITS),
    "db": ("repo_commands", GROUP, REPOSITORY),
    "demo": ("repo_commands", "demo", REPOSITORY),
    "diff": ("analysis_commands", "diff", ANALYSIS),
    "history": ("analysis_commands", "history", ANALYSIS),
    "similar": ("similar_commands", "similar", ANALYSIS),
    "eval": ("explore_commands", "eval_", ANALYSIS),
    "bisect": ("explore_commands", "bisect", ANALYSIS),
    "interpolate": ("merge_commands", "interpolate", ANALYSIS),
    "plot": ("analysis_commands", GROUP, ANALYSIS),
    "ui": ("ui_commands", "ui", ANALYSIS),
    "mount": ("mount_commands", "mount", ANALYSIS),
    "remote": ("remote_commands", GROUP, REMOTES),
    "clone": ("remote_commands", "clone", REMOTES),
    "fetch": ("remote_commands", "fetch", REMOTES),
    "pull": ("remote_commands", "pull", REMOTES),
    "push": ("remote_commands", "push", REMOTES),
}
# Each group's help and its commands: (command name, function of the group's module).
_GROUPS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "lineage": ("Query the lineage graph: ancestors, descendants, paths, merge bases.",
                [("ancestors", "ancestors"), ("descendants", "descendants"), ("path", "path"),
                 ("merge-base", "merge_base")]),
    "db": ("Manage the repository database.",
           [("upgrade", "db_upgrade"), ("rebuild", "db_rebuild"), ("manifests", "db_manifests")]),
    "remote": ("Manage remotes: stores (folders, s3:// prefixes) that push, fetch and clone move commits to and from.",
               [("add", "remote_add"), ("list", "remote_list"), ("remove", "remote_remove")]),
    "plot": ("Draw PNG charts of tensor history and metrics (needs matplotlib).",
             [("history", "plot_history"), ("metrics", "plot_metrics")]),
}


def _build(name: str) -> Command:
    """The click command (or group) ``name`` of ``_COMMANDS``, its module imported now."""
    module_name, function, panel = _COMMANDS[name]
    module = importlib.import_module(f"{__package__}.{module_name}")
    if function == GROUP:
        help_text, members = _GROUPS[name]
        group = typer.Typer(cls=CkptGroup, name=name, help=help_text, no_args_is_help=True, add_completion=False)
        for command, member in members:
            group.command(command)(getattr(module, member))
        built = typer.main.get_group(group)
        built.rich_help_panel = panel  # as ``add_typer(rich_help_panel=...)`` sets it
        return built
    single = typer.Typer(add_completion=False)
    single.command(name, rich_help_panel=panel)(getattr(module, function))
    return typer.main.get_command(single)


class _Commands(MutableMapping[str, "Command"]):
    """The top-level commands by name, each built by ``_build`` at its first lookup; iterating
    gives the names alone (``_ORDER``), building nothing."""

    def __init__(self) -> None:
        self._built: dict[str, Command] = {}
        self._names = list(_COMMANDS)

    def __getitem__(self, name: str) -> Command:
        if name not in self._built:
            if name not in self._names:
                raise KeyError(name)
            self._built[name] = _build(name)
        return self._built[name]

    def __setitem__(self, name: str, command: Command) -> None:
        if name not in self._names:
            self._names.append(name)
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        self._names.remove(name)
        self._built.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._names))

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names


class _CkptApp(CkptGroup):
    """The ``ckpt`` group: its commands are ``_Commands``, loaded as they are looked up."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = _Commands()

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # the names, without building every command (TyperGroup's takes items())


app = typer.Typer(
    cls=_CkptApp,
    name="ckpt",
    help="A lineage-aware checkpoint repository for PyTorch: commit, branch and restore training state.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        _print_version()
        raise typer.Exit()


def _print_version() -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        typer.echo(f"ckpt {version('ckptrepo')}")
    except PackageNotFoundError:
        typer.echo("ckpt (version unknown: ckptrepo is not installed)")


@app.callback()
def _global(
    repo: RepoOpt = None,
    read_only: ReadOnlyOpt = False,
    debug: DebugOpt = False,
    show_version: Annotated[
        bool | None,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = None,
) -> None:
    begin(Session(repo=repo, debug=debug, read_only=read_only))


def main() -> None:
    """Console-script entry point (``ckpt``). ``ckpt --version`` alone is answered before any
    command module is imported (they import rich, the result types and the formats), in about
    the time Python takes to import Typer.

    The cyclic garbage collector is tuned for a process that starts, runs one command and exits:
    starting creates some 70,000 objects that live until the exit (modules, classes, SQLAlchemy's
    and rich's tables), over which the default first-generation threshold (700 allocations) ran
    about 150 collections in ``ckpt log``, and the exit a full one more. A collection runs every
    ``GC_THRESHOLD`` allocations instead, and what exists once the command has returned is frozen
    (``gc.freeze``), so the exit does not traverse it: together ~0.15 s of a 0.7 s ``ckpt log``
    here. A long command still collects its garbage."""
    if sys.argv[1:] == ["--version"]:
        _print_version()
        return
    gc.set_threshold(GC_THRESHOLD)
    try:
        app(prog_name="ckpt")
    finally:
        gc.freeze()


if __name__ == "__main__":
    main()
