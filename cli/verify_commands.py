"""``ckpt verify`` (check the database against the pack store, read-only but for indexing pending
layouts), ``ckpt gc`` and ``ckpt repack``."""

from __future__ import annotations

from ckptrepo import errors

from . import render
from .options import CompactBelowOpt, DryRunOpt, FullOpt, GraceOpt, JsonOpt
from .session import current


def verify(full: FullOpt = False, as_json: JsonOpt = False) -> None:
    """Check that every commit's chunks sit in intact packs and every ref names a commit; list leftovers.

    Also that every commit has its manifest and every recorded journal entry is in the store, and
    that the store is this repository's; with --full, every chunk, manifest and journal entry is
    read and checked. Exits 0 when nothing is missing, corrupt, damaged or inconsistent
    (unreferenced packs and temporary files are warnings: gc reclaims them; so are objects in the
    store that ckptrepo does not write, which gc leaves: move them out by hand), else 5. With --full,
    or when something is broken, it names per branch the newest commit nothing broke (last known
    good, to resume from).
    Changes nothing but indexing the commits' pending layouts first (their rows are what it
    checks); on a read-only repository not even that (they are indexed in a private copy).
    """
    with current().open() as repo, render.phases(enabled=not as_json) as phase:
        phase("reading and checking every chunk, manifest and journal entry" if full
              else "checking packs, chunks, commits and manifests")
        report = repo.verify(full=full)
    if as_json:
        render.emit_json(report.to_json())
    else:
        render.out.print(render.verify_summary(report))
        problems = [*report.errors, *report.warnings]
        if problems:
            render.out.print()
            render.out.print(render.problem_table(problems))
        if report.full or not report.ok:
            render.out.print()
            render.out.print(render.last_good_table(report))
        render.out.print()
        render.out.print(render.verify_verdict(report))
    if not report.ok:
        damaged = report.damaged_commits
        raise errors.IntegrityError(
            detail=f"verify found {len(report.errors)} errors; {len(damaged)} commits cannot be restored",
            hint="Restore the packs named above from a backup (or copy them back from where they came); "
            "`ckpt verify --json` lists every problem and commit for scripts.",
        )


def gc(dry_run: DryRunOpt = False, grace: GraceOpt = 3600.0, as_json: JsonOpt = False) -> None:
    """Remove commits no branch or tag reaches, and the tensors, chunks, packs and leftover files only they used.

    Packs and temporary files younger than --grace seconds stay, and so do those a running
    commit or repack may own (its lease in the store), whatever --grace. Delete branches or
    tags first (`ckpt branch -d NAME`) to make their commits garbage; `--dry-run` shows what
    would go.
    """
    with current().open() as repo, render.phases(enabled=not as_json) as phase:
        phase("finding what no ref reaches" if dry_run else "removing what no ref reaches")
        report = repo.gc(grace=grace, dry_run=dry_run)
    if as_json:
        render.emit_json(report.to_json())
    else:
        render.out.print(render.gc_summary(report))


def repack(compact_below: CompactBelowOpt = 0.0, dry_run: DryRunOpt = False, as_json: JsonOpt = False) -> None:
    """Encode the chunks commits stored raw (deferred encoding) and optionally compact sparse packs.

    New packs are made durable first, then one transaction per pack moves the chunks; the old
    packs are retired, and a `ckpt gc` deletes them once retired for longer than its --grace.
    Chunk ids and every commit's bytes stay as they were. Safe to interrupt at any point.
    """
    with current().open() as repo, render.phases(enabled=not as_json) as phase:
        phase("counting what to repack" if dry_run else "encoding and moving chunks")
        report = repo.repack(compact_below=compact_below, dry_run=dry_run)
    if as_json:
        render.emit_json(report.to_json())
    else:
        render.out.print(render.repack_summary(report))
