"""The tamper campaign: random damage to a repository's store, then ``verify --full``, checkout
of every commit, ``db rebuild`` and checkout of every commit again (``tampering.py`` has the
template and the oracle).

Each case copies the template, applies one to three damages (a flipped bit, a truncation, a
deletion, a swap of two objects or a rename, on packs, manifests, journal entries or the
store's identity), and checks:

- no call raises anything but a ckptrepo error (never a crash, never the "bug" hint);
- ``verify(full=True)`` on the intact database is not ok whenever a damage was effective
  (changed information; ``tampering`` says which are inert) — ``detected / effective`` is
  reported and must be 100%;
- every checkout, before and after the rebuild, is bit-exact or refused with a ckptrepo error:
  never wrong data;
- every commit the damage cannot reach (``Template.needs``) restores bit-exactly before and
  after the rebuild (a pruned one is refused before, and bit-exact or refused after: its data
  may be gone).

On SQLite and PostgreSQL. ``CKPT_TAMPER_CASES`` sets the number of cases per database (by
default 120 on SQLite and 50 on PostgreSQL, as CI runs it; runnable at 10,000),
``CKPT_TAMPER_SEED`` the first seed; each failure names its seed and damages. A summary goes to
``test-artifacts/tamper-campaign-*.json``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import tampering

import ckptrepo
from ckptrepo.errors import CkptError, CommitPruned
from ckptrepo.testing import assert_states_equal


def _cases(default: int) -> int:
    return int(os.environ.get("CKPT_TAMPER_CASES", default))


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def template(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, pg_schemas: Any
             ) -> Iterator[tuple[str, tampering.Template, Any]]:
    """The template repository, and ``pg_schemas`` (fresh PostgreSQL schemas for the rebuilds)."""
    root = tmp_path_factory.mktemp("template")
    if request.param == "sqlite":
        yield "sqlite", tampering.build(root, None), None
        return
    if pg_schemas is None:
        pytest.skip("CKPT_TEST_POSTGRES_URL is not set")
    with pg_schemas() as url:
        yield "postgres", tampering.build(root, url), pg_schemas


def _checkout_all(repo: ckptrepo.Repo, template: tampering.Template, untouched: set[str], *, rebuilt: bool,
                  case: str) -> Counter[str]:
    """Check out every template commit: bit-exact or a ckptrepo error, and bit-exact when the
    damage cannot reach it (a pruned one: refused before the rebuild). Returns outcome counts."""
    seen: Counter[str] = Counter()
    for cid, state in template.expected.items():
        try:
            got = repo.checkout(cid)
        except CkptError as exc:
            seen[type(exc).__name__] += 1
            if cid in untouched and cid not in template.pruned:
                raise AssertionError(f"{case}: undamaged commit {cid[:10]} refused ({exc!r})") from exc
            if cid in untouched and not rebuilt:
                assert isinstance(exc, CommitPruned), f"{case}: {exc!r}"
            continue
        assert_states_equal(got, state, path=f"{case}: commit {cid[:10]}")
        assert rebuilt or cid not in template.pruned, f"{case}: pruned commit {cid[:10]} was read"
        seen["exact"] += 1
    return seen


def _run_case(kind: str, template: tampering.Template, seed: int, work: Path, stack: ExitStack,
              pg_schemas: Any) -> dict[str, Any]:
    rng = random.Random(seed)
    damages = tampering.random_damages(rng)
    rebuild_url = stack.enter_context(pg_schemas()) if kind == "postgres" else None
    # The damaged copy is checked against the intact database: the template's SQLite file (copied),
    # or its PostgreSQL schema (shared, read only: verify and checkout write nothing once layouts
    # are indexed).
    repo_dir = tampering.copy_for_case(template, work)
    applied = tampering.apply(repo_dir / "store", damages, template)
    case = f"seed {seed}: {'; '.join(applied.described)}"
    untouched = {cid for cid, needs in template.needs.items() if not needs & applied.touched}
    with ckptrepo.Repo.open(repo_dir) as repo:
        report = repo.verify(full=True)
        if applied.effective:
            assert not report.ok, f"{case}: verify --full found nothing"
        else:
            assert report.ok, f"{case}: inert damage reported: {report.to_json()['errors']}"
        before = _checkout_all(repo, template, untouched, rebuilt=False, case=case)
    # Rebuild from the damaged store alone, into an empty database.
    if kind == "sqlite":
        for p in repo_dir.glob("db.sqlite*"):
            p.unlink()
    else:
        tampering.replace_db_url(repo_dir, rebuild_url)
    rebuilt = ckptrepo.Repo.rebuild_database(repo_dir)
    with ckptrepo.Repo.open(repo_dir) as repo:
        after = _checkout_all(repo, template, untouched, rebuilt=True, case=case)
    return {"effective": applied.effective, "detected": not report.ok, "damages": len(applied.described),
            "before": before, "after": after, "rebuild_ok": rebuilt.ok, "damaged_after": rebuilt.damaged}


def test_random_damage_is_detected_and_never_returns_wrong_data(template: tuple[str, tampering.Template, Any],
                                                                 tmp_path: Path) -> None:
    kind, tpl, pg_schemas = template
    cases = _cases(120 if kind == "sqlite" else 25)
    first = int(os.environ.get("CKPT_TAMPER_SEED", 1))
    totals: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    started = time.perf_counter()
    for seed in range(first, first + cases):
        work = tmp_path / f"case-{seed}"
        with ExitStack() as stack:
            got = _run_case(kind, tpl, seed, work, stack, pg_schemas)
        shutil.rmtree(work)
        totals["cases"] += 1
        totals["damages"] += got["damages"]
        totals["effective"] += got["effective"]
        totals["inert"] += not got["effective"]
        totals["detected"] += got["effective"] and got["detected"]
        totals["rebuilds_not_ok"] += not got["rebuild_ok"]
        outcomes.update({f"before:{k}": v for k, v in got["before"].items()})
        outcomes.update({f"after:{k}": v for k, v in got["after"].items()})
    summary = {"database": kind, "first_seed": first, **totals, "outcomes": dict(sorted(outcomes.items())),
               "seconds": round(time.perf_counter() - started, 1)}
    out = Path("test-artifacts")
    out.mkdir(exist_ok=True)
    (out / f"tamper-campaign-{kind}.json").write_text(json.dumps(summary, indent=1))
    print(f"tamper campaign ({kind}): detected {totals['detected']} / effective {totals['effective']} "
          f"({totals['inert']} inert of {totals['cases']} cases); {summary}")
    assert totals["detected"] == totals["effective"]
    assert totals["effective"] > 0 or cases < 10  # a campaign that damaged nothing would prove nothing
