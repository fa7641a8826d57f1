"""The ``ckpt`` command line: global options, the command list, and the one place errors become exit codes.

Every command is a thin function over ``ckptrepo.Repo`` (in the ``*_commands`` modules);
``CkptGroup.invoke`` turns any exception a command raises into ``error:`` and ``hint:``
lines on stderr and an exit code (see ``failures``); under ``--json``, into one JSON line on
stderr, Typer's own usage errors too. Typer's own usage errors exit 2.
"""

from __future__ import annotations

import functools
import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from . import failures
from .options import DebugOpt, ReadOnlyOpt, RepoOpt
from .session import Session, begin, current


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


_app = typer.Typer(  # public as ``app`` once its commands are registered (``__getattr__``)
    cls=CkptGroup,
    name="ckpt",
    help="A lineage-aware checkpoint repository for PyTorch: commit, branch and restore training state.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
db_app = typer.Typer(cls=CkptGroup, help="Manage the repository database.", no_args_is_help=True)
lineage_app = typer.Typer(
    cls=CkptGroup, help="Query the lineage graph: ancestors, descendants, paths, merge bases.", no_args_is_help=True
)
plot_app = typer.Typer(
    cls=CkptGroup, help="Draw PNG charts of tensor history and metrics (needs matplotlib).", no_args_is_help=True
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


@_app.callback()
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


REPOSITORY, COMMITS, REFS, ANALYSIS = "Repository", "Commits", "Branches and tags", "Analysis"


@functools.cache
def _commands() -> typer.Typer:
    """The app with every command registered: their modules are imported here, once, so that
    ``ckpt --version`` (``main``) imports none of them."""
    from . import (
        analysis_commands,
        history_commands,
        lineage_commands,
        ref_commands,
        repo_commands,
        retention_commands,
        state_commands,
        ui_commands,
        verify_commands,
    )

    app = _app
    app.command(rich_help_panel=REPOSITORY)(repo_commands.init)
    app.command(rich_help_panel=REPOSITORY)(repo_commands.status)
    app.command(rich_help_panel=COMMITS)(state_commands.commit)
    app.command("import-run", rich_help_panel=COMMITS)(state_commands.import_run)
    app.command(rich_help_panel=COMMITS)(state_commands.checkout)
    app.command(rich_help_panel=COMMITS)(history_commands.log)
    app.command(rich_help_panel=COMMITS)(history_commands.show)
    app.command(rich_help_panel=REFS)(ref_commands.branch)
    app.command(rich_help_panel=REFS)(ref_commands.tag)
    app.command(rich_help_panel=REPOSITORY)(repo_commands.stats)
    app.command(rich_help_panel=REPOSITORY)(verify_commands.verify)
    app.command(rich_help_panel=REPOSITORY)(verify_commands.gc)
    app.command(rich_help_panel=REPOSITORY)(retention_commands.prune)
    app.command(rich_help_panel=REPOSITORY)(verify_commands.repack)
    app.add_typer(lineage_app, name="lineage", rich_help_panel=COMMITS)
    lineage_app.command("ancestors")(lineage_commands.ancestors)
    lineage_app.command("descendants")(lineage_commands.descendants)
    lineage_app.command("path")(lineage_commands.path)
    lineage_app.command("merge-base")(lineage_commands.merge_base)
    app.command(rich_help_panel=COMMITS)(lineage_commands.best)
    app.add_typer(db_app, name="db", rich_help_panel=REPOSITORY)
    db_app.command("upgrade")(repo_commands.db_upgrade)
    db_app.command("rebuild")(repo_commands.db_rebuild)
    db_app.command("manifests")(repo_commands.db_manifests)
    app.command(rich_help_panel=REPOSITORY)(repo_commands.demo)
    app.command(rich_help_panel=ANALYSIS)(analysis_commands.diff)
    app.command(rich_help_panel=ANALYSIS)(analysis_commands.history)
    app.add_typer(plot_app, name="plot", rich_help_panel=ANALYSIS)
    plot_app.command("history")(analysis_commands.plot_history)
    plot_app.command("metrics")(analysis_commands.plot_metrics)
    app.command(rich_help_panel=ANALYSIS)(ui_commands.ui)
    return app


def __getattr__(name: str) -> typer.Typer:
    """``app``: the ``ckpt`` Typer app, its commands registered at first use (PEP 562)."""
    if name == "app":
        return _commands()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Console-script entry point (``ckpt``). ``ckpt --version`` alone is answered before any
    command module is imported (they import rich, the result types and the formats), in about
    the time Python takes to import Typer."""
    if sys.argv[1:] == ["--version"]:
        _print_version()
        return
    _commands()(prog_name="ckpt")


if __name__ == "__main__":
    main()
