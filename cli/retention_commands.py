"""``ckpt prune``: retention that keeps the lineage, and the stored retention setting."""

from __future__ import annotations

from typing import Any

from ckptrepo import errors

from . import render
from .options import (
    ForgetRulesOpt,
    JsonOpt,
    KeepBestOpt,
    KeepDenseEarlyOpt,
    KeepEveryOpt,
    KeepLastOpt,
    KeepYoungerOpt,
    MaximizeOpt,
    PruneBranchOpt,
    PruneDamagedOpt,
    PruneDryRunOpt,
    SavedRulesOpt,
    SaveRulesOpt,
)
from .session import current

LISTED = 20  # pruned commits listed by the table output


def prune(
    keep_last: KeepLastOpt = None,
    keep_every: KeepEveryOpt = None,
    keep_best: KeepBestOpt = None,
    maximize: MaximizeOpt = False,
    keep_dense_early: KeepDenseEarlyOpt = False,
    keep_younger_than: KeepYoungerOpt = None,
    branch: PruneBranchOpt = None,
    dry_run: PruneDryRunOpt = False,
    save: SaveRulesOpt = False,
    saved: SavedRulesOpt = False,
    forget: ForgetRulesOpt = False,
    damaged: PruneDamagedOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Drop the data of commits no keep rule keeps; they stay in the lineage. `ckpt gc` then frees it.

    A commit is kept if any rule keeps it on any branch's first-parent line; branch heads, tags,
    fork points and merge and transfer sources are always kept. A pruned commit keeps its
    metadata, metrics and tensor statistics (log, show, history, diff) but can no longer be
    checked out or exported. At least one rule is needed. --save also stores the rules as the
    repository's setting, applied after every commit; --saved prunes by it; --forget removes it.
    --damaged instead marks the damaged commits a rebuild left pruned (accepting their loss).
    """
    given = any(x not in (None, False) for x in (keep_last, keep_every, keep_best, keep_dense_early,
                                                   keep_younger_than)) or bool(branch)
    if damaged and (given or save or saved or forget):
        raise errors.UsageError("--damaged takes no rules", hint="Run `ckpt prune --damaged` alone, then with rules.")
    if forget:
        if given or save or saved or dry_run:
            raise errors.UsageError("--forget removes the stored retention setting and takes no rules",
                                    hint="Run `ckpt prune --forget` alone.")
        with current().open() as repo:
            previous = repo.retention()
            repo.set_retention(None)
        if as_json:
            render.emit_json({"forgot": previous.to_json() if previous else None})
        else:
            render.out.print("retention setting removed" if previous else "no retention setting was stored",
                             markup=False)
        return
    if saved and (given or save):
        raise errors.UsageError("--saved prunes by the stored rules and takes no others",
                                hint="Run `ckpt prune --saved`, or give rules (with --save to store them).")
    if save and dry_run:
        raise errors.UsageError("--dry-run changes nothing, so it cannot --save",
                                hint="Look first with --dry-run, then run the same command with --save.")
    with current().open() as repo:
        if damaged:
            report = repo.prune(damaged=True, dry_run=dry_run)
        elif saved:
            rules = repo.retention()
            if rules is None:
                raise errors.UsageError("no retention setting is stored",
                                        hint="Store one with `ckpt prune --keep-last N ... --save`.")
            report = repo.prune(rules=rules, dry_run=dry_run)
        else:
            report = repo.prune(keep_last=keep_last, keep_every=keep_every, keep_best=keep_best, maximize=maximize,
                                keep_dense_early=keep_dense_early, keep_younger_than=keep_younger_than,
                                branches=branch or None, dry_run=dry_run)
            if save:
                repo.set_retention(report.rules)
        listed = repo.commits(report.pruned[:LISTED]) if not as_json else []
    if as_json:
        document: dict[str, Any] = {**report.to_json(), "saved": save}
        render.emit_json(document)
        return
    if listed:
        render.out.print(render.prune_table(listed, len(report.pruned) - len(listed)))
        render.out.print()
    shown = "--damaged (every damaged commit)" if damaged else _rules_text(report.rules.to_json())
    render.out.print(render.prune_summary(report, shown, save or saved))


def _rules_text(rules: dict[str, Any]) -> str:
    """The rules as the options that give them."""
    parts = []
    for key, flag in (("keep_last", "--keep-last"), ("keep_every", "--keep-every")):
        if rules.get(key) is not None:
            parts.append(f"{flag} {rules[key]}")
    if rules.get("keep_best") is not None:
        name, n = rules["keep_best"]
        parts.append(f"--keep-best {name}:{n}" + (" --max" if rules.get("maximize") else ""))
    if rules.get("keep_dense_early"):
        parts.append("--keep-dense-early")
    if rules.get("keep_younger_than") is not None:
        parts.append(f"--keep-younger-than {rules['keep_younger_than']:g}s")
    parts.extend(f"--branch {b}" for b in rules.get("branches") or ())
    return " ".join(parts)
