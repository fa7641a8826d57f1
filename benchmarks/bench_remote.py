"""Remotes and tiers against plain transfers, on a real S3-protocol server behind a proxy.

Every transfer goes through one TCP proxy on loopback in front of a moto S3 server (started
here): the proxy counts the bytes each way and, with ``--mbps``, paces them to that rate in each
direction (a network link; default 200 MiB/s, ``0``: unpaced). Figures, each measured in this run:

1. Push size: a lineage of ``--commits`` commits of a ``--mib``-MiB model whose every step
   changes ``--change`` of its elements pushed to an empty remote, then one more commit pushed:
   bytes the proxy carried to the server / the stored bytes of the chunks pushed (goal <= 1.1),
   for both pushes; then a push of the unchanged branch (goal: no pack uploaded).
2. Push throughput: the first push above / a plain boto3 ``upload_file`` (the transfer manager,
   same settings) of the same bytes (the repository's pack files) to the same server through the
   same proxy; ratio of MiB/s (goal >= 0.9), alternating, ``--rounds`` rounds, median.
3. Lazy clone of a ``--lineage``-commit lineage (default 2,000; each commit a 512 KiB state
   whose every element moves, as a training step moves them), pushed to the remote first:
   seconds to clone (goal <= 10 s) and bytes read through the proxy / the remote's bytes (goal
   <= 5%), against plain boto3 reading what a clone must read at least (16 threads: the
   listings, every manifest, the last 2 KiB of every pack) and against a clone of the same
   lineage from a folder remote (the clone's own cost); then the first checkout of one commit
   (the middle one): bytes read / the stored bytes of that commit's chunks (its whole state:
   nothing of it is here yet; goal <= 1.2).
4. Recovery point: a training loop (``--steps`` steps of a 4 MiB model, one commit every
   ``--every`` steps, each step ~``--step-ms`` of compute) on a repository that replicates to the
   remote: after every commit, how many commits of the branch the remote does not hold yet; the
   median and the maximum, and the remote's lag at close.

    python benchmarks/bench_remote.py [--mbps 200] [--rounds 3] [--lineage 2000] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import goal_note, report

import ckptrepo
from ckptrepo.testing import parts

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}


class Proxy:
    """A TCP proxy on loopback: counts bytes each way, paces each direction to ``rate`` bytes/s."""

    def __init__(self, target: tuple[str, int], rate: float) -> None:
        self.target, self.rate = target, rate
        self.up = 0  # client -> server
        self.down = 0  # server -> client
        self._lock = threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._buckets = {"up": [0.0, time.monotonic()], "down": [0.0, time.monotonic()]}
        threading.Thread(target=self._accept, daemon=True).start()

    def counts(self) -> tuple[int, int]:
        with self._lock:
            return self.up, self.down

    def _pace(self, way: str, n: int) -> None:
        if self.rate <= 0:
            return
        with self._lock:
            bucket = self._buckets[way]
            now = time.monotonic()
            start = max(bucket[1], now)  # the link is busy until bucket[1]
            bucket[1] = start + n / self.rate
            wait = bucket[1] - now
        if wait > 0:
            time.sleep(wait)

    def _accept(self) -> None:
        while True:
            client, _ = self._sock.accept()
            server = socket.create_connection(self.target)
            for src, dst, way in ((client, server, "up"), (server, client, "down")):
                threading.Thread(target=self._pipe, args=(src, dst, way), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, way: str) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                self._pace(way, len(data))
                with self._lock:
                    if way == "up":
                        self.up += len(data)
                    else:
                        self.down += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


def _server() -> tuple[Any, int]:
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server, port


def _bucket(endpoint: str) -> str:
    import boto3

    name = f"bench-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=name)
    return name


def _model(mib: float, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = int(mib * (1 << 20)) // 4 // 8
    return {f"layer{i}.weight": torch.randn(n, generator=g) for i in range(8)}


def _step(state: dict[str, torch.Tensor], change: float, g: torch.Generator) -> None:
    for t in state.values():
        k = max(1, int(t.numel() * change))
        idx = torch.randint(0, t.numel(), (k,), generator=g)
        t[idx] += 1e-3 * torch.randn(k, generator=g)


def _stored(repo: ckptrepo.Repo, chunk_ids: set[str] | None = None) -> int:
    from sqlalchemy import func, select

    from ckptrepo.db.models import Chunk

    with parts(repo).sessions() as s:
        q = select(func.sum(Chunk.length))
        if chunk_ids is not None:
            q = q.where(Chunk.id.in_(sorted(chunk_ids)))
        return int(s.scalar(q) or 0)


def _chunks_of(repo: ckptrepo.Repo, rev: str) -> set[str]:
    from ckptrepo.db import catalog
    from ckptrepo.remote.transfer import closure

    with parts(repo).sessions() as s:
        ids = {c for cl in catalog.chunk_lists_of(s, [repo.resolve(rev)]).values() for c in cl}
        return set(closure(ids, lambda x: catalog.chunks_by_id(s, sorted(x))))


def bench_push(work: Path, url: str, endpoint: str, proxy: Proxy, args: argparse.Namespace) -> dict[str, Any]:
    import boto3
    from boto3.s3.transfer import TransferConfig

    from ckptrepo.storage.s3 import _TRANSFER

    repo = ckptrepo.Repo.init(work / "push-src", encode="inline")
    state, g = _model(args.mib), torch.Generator().manual_seed(1)
    for step in range(args.commits):
        _step(state, args.change, g)
        repo.commit(state, step=step, blocking=True)
    out: dict[str, Any] = {}
    results = []
    for r in range(args.rounds):
        remote = f"{url.split('?')[0]}/push{r}?endpoint_url={endpoint}"
        name = f"r{r}"
        repo.add_remote(name, remote)
        up0 = proxy.counts()[0]
        t0 = time.perf_counter()
        pushed = repo.push(name)
        push_s = time.perf_counter() - t0
        carried = proxy.counts()[0] - up0
        # The same bytes (the repository's packs) uploaded by boto3's transfer manager.
        client = boto3.client("s3", endpoint_url=endpoint)
        bucket = url.split("/")[2].split("?")[0]
        files = [p for p in (work / "push-src" / ".ckpt" / "store" / "packs").rglob("*.pack")]
        nbytes = sum(p.stat().st_size for p in files)
        t0 = time.perf_counter()
        for p in files:
            client.upload_file(str(p), bucket, f"plain{r}/{p.name}", Config=TransferConfig(
                multipart_threshold=_TRANSFER.multipart_threshold, multipart_chunksize=_TRANSFER.multipart_chunksize,
                max_concurrency=_TRANSFER.max_concurrency))
        plain_s = time.perf_counter() - t0
        results.append((pushed.bytes_uploaded / push_s, nbytes / plain_s, carried, pushed))
    speed = statistics.median(a / b for a, b, _, _ in results)
    pushed = results[0][3]
    stored = _stored(repo)
    out["push_bytes_over_stored"] = results[0][2] / stored
    out["push_mib_s"] = statistics.median(a for a, _, _, _ in results) / (1 << 20)
    out["boto3_mib_s"] = statistics.median(b for _, b, _, _ in results) / (1 << 20)
    out["push_over_boto3"] = speed
    out["push_rounds"] = [round(a / b, 3) for a, b, _, _ in results]
    # One more commit, pushed: what it uploads against its new chunks' stored bytes.
    before = _chunks_of(repo, "main")
    _step(state, args.change, g)
    repo.commit(state, step=args.commits, blocking=True)
    new = _chunks_of(repo, "main") - before
    up0 = proxy.counts()[0]
    repo.push("r0")
    out["incremental_bytes_over_stored"] = (proxy.counts()[0] - up0) / max(1, _stored(repo, new))
    again = repo.push("r0")
    out["unchanged_push_packs"] = again.packs
    out["pushed_commits"] = pushed.commits
    repo.close()
    return out


def bench_clone(work: Path, url: str, endpoint: str, proxy: Proxy, args: argparse.Namespace) -> dict[str, Any]:
    repo = ckptrepo.Repo.init(work / "lineage", chunk_size=64 << 10, encode="inline")
    g = torch.Generator().manual_seed(2)
    state = {"w": torch.randn(1 << 17, generator=g)}  # 512 KiB, every element moving at every step
    t0 = time.perf_counter()
    for step in range(args.lineage):
        state["w"] += 1e-3 * torch.randn(state["w"].shape, generator=g)
        repo.commit(state, step=step, metrics={"loss": 1.0 / (step + 1)}, blocking=True)
    build_s = time.perf_counter() - t0
    remote = f"{url.split('?')[0]}/lineage?endpoint_url={endpoint}"
    repo.add_remote("origin", remote)
    repo.push("origin")
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    bucket = url.split("/")[2].split("?")[0]
    total = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="repo/lineage/"):
        total += sum(int(o["Size"]) for o in page.get("Contents", ()))
    down0 = proxy.counts()[1]
    t0 = time.perf_counter()
    clone = ckptrepo.Repo.clone(remote, work / "lineage-clone")
    clone_s = time.perf_counter() - t0
    read = proxy.counts()[1] - down0
    middle = clone.resolve(f"main~{args.lineage // 2}")
    unique = _stored(repo, _chunks_of(repo, middle))
    down0 = proxy.counts()[1]
    clone.checkout(middle)
    first = proxy.counts()[1] - down0
    # The peer: what a clone must read at least, read by plain boto3 with as many threads (one
    # listing of the manifests and of the packs; every manifest; every pack's last 2 KiB).
    from concurrent.futures import ThreadPoolExecutor

    listed: list[tuple[str, int]] = []
    t0 = time.perf_counter()
    for prefix in ("manifests/", "packs/"):
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                     Prefix=f"repo/lineage/{prefix}"):
            listed += [(str(o["Key"]), int(o["Size"])) for o in page.get("Contents", ())]

    def get(item: tuple[str, int]) -> int:
        key, size = item
        extra = {"Range": f"bytes={max(0, size - 2048)}-{size - 1}"} if "/packs/" in key else {}
        return len(client.get_object(Bucket=bucket, Key=key, **extra)["Body"].read())

    with ThreadPoolExecutor(16) as pool:
        sum(pool.map(get, listed))
    plain_s = time.perf_counter() - t0
    # The same lineage from a folder remote: the clone's own cost, without the server's.
    repo.add_remote("folder", str(work / "lineage-remote"))
    repo.push("folder")
    t0 = time.perf_counter()
    ckptrepo.Repo.clone(str(work / "lineage-remote"), work / "lineage-clone-folder").close()
    folder_s = time.perf_counter() - t0
    out = {"lineage_commits": args.lineage, "build_s": build_s, "clone_s": clone_s, "remote_bytes": total,
           "clone_read_bytes": read, "clone_read_share": read / total,
           "plain_gets_s": plain_s, "clone_over_plain_gets": clone_s / plain_s, "folder_clone_s": folder_s,
           "first_checkout_over_unique": first / unique}
    clone.close()
    repo.close()
    return out


def bench_recovery(work: Path, url: str, endpoint: str, args: argparse.Namespace) -> dict[str, Any]:
    from ckptrepo import Checkpointer
    from ckptrepo.policy import Every

    remote = f"{url.split('?')[0]}/tier?endpoint_url={endpoint}"
    repo = ckptrepo.Repo.init(work / "tiered", replicate_to=remote)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)])  # ~4 MiB
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    lags: list[int] = []
    with Checkpointer(repo, model=model, optimizer=opt, policy=Every(args.every), rng=False) as ck:
        for step in range(1, args.steps + 1):
            t0 = time.perf_counter()
            loss = model(torch.randn(16, 512)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            while time.perf_counter() - t0 < args.step_ms / 1000:
                pass
            if ck.after_step(step) is not None:
                ck.flush()
                status = repo.replication()
                assert status is not None
                lags.append(status.points[0].commits_at_risk if status.points else 0)
        status = repo.replication()
    repo.close()
    return {"commits": len(lags), "median_lag_commits": statistics.median(lags) if lags else 0,
            "max_lag_commits": max(lags, default=0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mbps", type=float, default=200.0, help="MiB/s each way through the proxy (0: unpaced)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--commits", type=int, default=10)
    parser.add_argument("--mib", type=float, default=32.0)
    parser.add_argument("--change", type=float, default=0.01)
    parser.add_argument("--lineage", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.commits, args.mib, args.lineage, args.steps = 1, 3, 4.0, 100, 40
    os.environ.update(CREDENTIALS)
    server, port = _server()
    proxy = Proxy(("127.0.0.1", port), args.mbps * (1 << 20))
    endpoint = f"http://127.0.0.1:{proxy.port}"
    bucket = _bucket(endpoint)
    url = f"s3://{bucket}/repo?endpoint_url={endpoint}"
    try:
        with tempfile.TemporaryDirectory(prefix="ckpt-bench-remote-") as tmp:
            work = Path(tmp)
            print(f"# bench_remote: moto S3 behind a proxy paced to {args.mbps:g} MiB/s each way")
            push = bench_push(work, url, endpoint, proxy, args)
            clone = bench_clone(work, url, endpoint, proxy, args)
            rec = bench_recovery(work, url, endpoint, args)
            rows = [
                ("RATIO push bytes carried / stored bytes pushed, full", push["push_bytes_over_stored"],
                 goal_note(push["push_bytes_over_stored"], 1.1)),
                ("RATIO the same, one more commit", push["incremental_bytes_over_stored"],
                 goal_note(push["incremental_bytes_over_stored"], 1.1)),
                ("packs uploaded by a push of an unchanged branch", float(push["unchanged_push_packs"]),
                 goal_note(push["unchanged_push_packs"], 0)),
                ("RATIO push MiB/s / boto3 upload_file MiB/s, same bytes and proxy", push["push_over_boto3"],
                 f"{goal_note(push['push_over_boto3'], 0.9, at_most=False)}  rounds {push['push_rounds']}, "
                 f"{push['push_mib_s']:.1f} vs {push['boto3_mib_s']:.1f} MiB/s"),
                (f"lazy clone of {clone['lineage_commits']} commits, s", clone["clone_s"],
                 f"{goal_note(clone['clone_s'], 10)}  from a folder remote {clone['folder_clone_s']:.1f} s"),
                ("RATIO lazy clone / plain boto3 reads of what it must read", clone["clone_over_plain_gets"],
                 f"plain GETs {clone['plain_gets_s']:.1f} s"),
                ("RATIO clone bytes read / the remote's bytes, %", 100 * clone["clone_read_share"],
                 goal_note(100 * clone["clone_read_share"], 5.0)),
                ("RATIO first checkout bytes read / the commit's stored bytes", clone["first_checkout_over_unique"],
                 goal_note(clone["first_checkout_over_unique"], 1.2)),
                ("replication lag, commits: median", float(rec["median_lag_commits"]),
                 f"max {rec['max_lag_commits']} over {rec['commits']} commits, one every {args.every} steps"),
            ]
            report("remotes and tiers", rows, {"push": push, "clone": clone, "recovery": rec})
    finally:
        server.stop()


if __name__ == "__main__":
    main()
