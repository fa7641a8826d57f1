"""Tampering with a remote: random damage to what a push stored (packs, manifests, ref objects,
the journal, the marker, the identity), then a clone and a checkout of every commit.

Each case copies the template remote, applies one to three damages (a flipped byte, a
truncation, a deletion, a swap of two objects), and checks that nothing but a ckptrepo error is
ever raised, and that every commit the clone shows restores bit-exactly or is refused: never
wrong data. ``CKPT_REMOTE_TAMPER_CASES`` sets the number of cases (default 40),
``CKPT_TAMPER_SEED`` the first seed; a failure names its seed and damages.
"""

from __future__ import annotations

import os
import random
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptrepo
from ckptrepo.errors import CkptError
from ckptrepo.testing import assert_states_equal

CHUNK = 16 * 1024


def _state(i: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(i)
    return {"w": torch.randn(CHUNK // 2 + 100 * i, generator=g), "b": torch.full((3,), float(i))}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("remote-template")
    expected: dict[str, Any] = {}
    with ckptrepo.Repo.init(root / "origin", chunk_size=CHUNK) as repo:
        for i in range(5):
            expected[repo.commit(_state(i), step=i).wait().id] = _state(i)
        repo.branch("exp", at="main~2")
        expected[repo.commit(_state(9), branch="exp", step=9).wait().id] = _state(9)
        repo.tag("v1", at="main~1")
        repo.add_remote("origin", str(root / "remote"))
        repo.push(all=True)
    return root / "remote", expected


def _damage(rng: random.Random, root: Path) -> str:
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    target = rng.choice(files)
    what = rng.choice(["flip", "truncate", "delete", "swap"])
    rel = target.relative_to(root)
    data = target.read_bytes()
    if what == "flip" and data:
        pos = rng.randrange(len(data))
        target.write_bytes(data[:pos] + bytes([data[pos] ^ (1 << rng.randrange(8))]) + data[pos + 1:])
    elif what == "truncate":
        target.write_bytes(data[: rng.randrange(len(data) + 1)])
    elif what == "delete":
        target.unlink()
    else:
        other = rng.choice(files)
        if other != target and other.exists():
            a, b = target.read_bytes(), other.read_bytes()
            target.write_bytes(b)
            other.write_bytes(a)
            return f"swap {rel} {other.relative_to(root)}"
    return f"{what} {rel}"


def test_damage_on_a_remote_never_reads_back_as_data(template: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    source, expected = template
    cases = int(os.environ.get("CKPT_REMOTE_TAMPER_CASES", "40"))
    first = int(os.environ.get("CKPT_TAMPER_SEED", "0"))
    outcomes: Counter[str] = Counter()
    for seed in range(first, first + cases):
        rng = random.Random(seed)
        remote = tmp_path / f"remote-{seed}"
        shutil.copytree(source, remote)
        damages = [_damage(rng, remote) for _ in range(rng.randint(1, 3))]
        case = f"seed {seed}: {'; '.join(damages)}"
        try:
            clone = ckptrepo.Repo.clone(str(remote), tmp_path / f"clone-{seed}")
        except CkptError as exc:
            outcomes[f"clone {type(exc).__name__}"] += 1
            continue
        except Exception as exc:
            raise AssertionError(f"{case}: clone raised {exc!r}") from exc
        with clone:
            for cid, state in expected.items():
                try:
                    got = clone.checkout(cid)
                except CkptError as exc:
                    outcomes[type(exc).__name__] += 1
                    continue
                except Exception as exc:
                    raise AssertionError(f"{case}: checkout of {cid[:10]} raised {exc!r}") from exc
                assert_states_equal(got, state, path=f"{case}: commit {cid[:10]}")
                outcomes["exact"] += 1
        shutil.rmtree(remote)
        shutil.rmtree(tmp_path / f"clone-{seed}")
    assert outcomes["exact"] > 0, outcomes
