"""filesystem-storage benchmark on S3 (moto's server on loopback).

A. Overhead: persist latency against a raw S3 ``put_object`` of the same batch
   bytes to the same endpoint, interleaved in alternating order, same run.
B. Hedging: a fault-injecting proxy stalls a fraction of PUTs (1% for 2 s by
   default); persist latency with hedging (``retry-policy=fixed``) against a
   single attempt (``retry-policy=none``), same run.
C. Hedging on the fsspec path (``memory://``): the same stalls injected into the
   filesystem's writes; hedges must not queue behind the stalled attempt.

Writes ``dfs-bench-s3.md`` and ``dfs-bench-s3.json`` under ``--results``.

    python -m bench.dfs_bench [--persists N] [--quick]
"""

from __future__ import annotations

import json
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from bench.dstl_bench import _markdown, _table, bench_parser, percentile
from dstl.dfs.testing import FaultInjectingProxy, S3Endpoint, moto_s3_server
from dstl.spi import KeyGroupRange, load_storage

KG = KeyGroupRange(0, 128)


def _storage(endpoint: S3Endpoint, **overrides: str):
    config = {
        "dstl.storage": "filesystem",
        **endpoint.config(prefix=f"bench-{uuid.uuid4().hex[:8]}"),
        **overrides,
    }
    return load_storage(config, job_id="bench")


def _persist_once(storage, writer, checkpoint: int, changes: int, data: bytes) -> tuple[float, int]:
    start = writer.next_sqn()
    for i in range(changes):
        writer.append(i & 127, data)
    before = storage.metrics.counter("uploaded_bytes")
    began = time.perf_counter()
    handle = writer.persist(start, checkpoint).result(timeout=120)
    elapsed = time.perf_counter() - began
    writer.confirm(start, handle.sqn_range.end, checkpoint)
    writer.truncate(handle.sqn_range.end)
    # As a job does once the checkpoint is subsumed: the bucket stays small.
    storage.discard([handle])
    return elapsed, storage.metrics.counter("uploaded_bytes") - before


def overhead(endpoint: S3Endpoint, persists: int, changes: int, progress) -> dict[str, list[float]]:
    """Persist vs. raw requests of the same bytes, in rotating order, same run.

    Floors: a raw ``put_object``; and a raw ``put_object`` with a parallel
    ``list_objects_v2`` of the epoch markers, the least any per-upload fencing
    check costs. Batch delay 0: one writer gains nothing from waiting.
    """
    client = endpoint.client()
    pool = ThreadPoolExecutor(2)
    data = os.urandom(100)
    payload = os.urandom(changes * 200 + 4096)
    results: dict[str, list[float]] = {
        "persist": [],
        "raw put_object": [],
        "raw put_object || list (fencing floor)": [],
    }
    task = progress.add_task("A: persist vs raw put_object", total=persists)
    with _storage(endpoint, **{"dstl.dfs.batch.persist-delay": "0ms"}) as storage:
        writer = storage.create_writer("overhead", KG)
        markers = f"{storage.store.prefix}/{storage.job_id}/epochs/"  # type: ignore[attr-defined]
        size = changes * 110

        def raw_put(checkpoint: int) -> None:
            key = f"floor/{checkpoint}"
            began = time.perf_counter()
            client.put_object(Bucket=endpoint.bucket, Key=key, Body=payload[:size])
            results["raw put_object"].append(time.perf_counter() - began)
            client.delete_object(Bucket=endpoint.bucket, Key=key)

        def raw_put_and_list(checkpoint: int) -> None:
            key = f"floor2/{checkpoint}"
            began = time.perf_counter()
            put = pool.submit(client.put_object, Bucket=endpoint.bucket, Key=key, Body=payload[:size])
            listed = pool.submit(client.list_objects_v2, Bucket=endpoint.bucket, Prefix=markers)
            put.result()
            listed.result()
            results["raw put_object || list (fencing floor)"].append(time.perf_counter() - began)
            client.delete_object(Bucket=endpoint.bucket, Key=key)

        def dstl_persist(checkpoint: int) -> None:
            nonlocal size
            elapsed, size = _persist_once(storage, writer, checkpoint, changes, data)
            results["persist"].append(elapsed)

        steps = [dstl_persist, raw_put, raw_put_and_list]
        for checkpoint in range(1, persists + 1):
            for step in steps[checkpoint % 3 :] + steps[: checkpoint % 3]:
                step(checkpoint)
            progress.advance(task)
    pool.shutdown()
    return results


def hedging(endpoint: S3Endpoint, persists: int, changes: int, stall: float, seconds: float, progress):
    """Persist latency under stalled PUTs, per retry configuration."""
    configs = {
        "retry-policy=none": {"dstl.dfs.upload.retry-policy": "none"},
        "hedging, timeout 1s (default)": {
            "dstl.dfs.upload.retry-policy": "fixed",
            "dstl.dfs.upload.timeout": "1s",
        },
        "hedging, timeout 250ms": {
            "dstl.dfs.upload.retry-policy": "fixed",
            "dstl.dfs.upload.timeout": "250ms",
        },
    }
    data = os.urandom(100)
    results: dict[str, list[float]] = {}
    stalls: dict[str, int] = {}
    for name, overrides in configs.items():
        task = progress.add_task(f"B: {name}", total=persists)
        with FaultInjectingProxy(endpoint.url, stall_fraction=stall, stall_seconds=seconds) as proxy:
            config = {
                "dstl.dfs.s3.endpoint-url": proxy.url,
                "dstl.dfs.batch.persist-delay": "0ms",
                **overrides,
            }
            with _storage(endpoint, **config) as storage:
                writer = storage.create_writer("hedging", KG)
                latencies = []
                for checkpoint in range(1, persists + 1):
                    latencies.append(_persist_once(storage, writer, checkpoint, changes, data)[0])
                    progress.advance(task)
            stalls[name] = proxy.stalled
        results[name] = latencies
    return results, stalls


def fsspec_hedging(persists: int, changes: int, stall: float, seconds: float, progress):
    """Persist latency on ``memory://`` (the fsspec path) with a share of data writes stalled."""
    import threading

    from fsspec.implementations.memory import MemoryFileSystem

    real_pipe = MemoryFileSystem.pipe_file
    lock = threading.Lock()
    counter = {"puts": 0, "stalled": 0}

    def stalling_pipe(self, path, value, mode="overwrite", **kwargs):
        if "/data/" in path:
            with lock:
                counter["puts"] += 1
                stalled = int(counter["puts"] * stall) > int((counter["puts"] - 1) * stall)
                counter["stalled"] += stalled
            if stalled:
                time.sleep(seconds)
        return real_pipe(self, path, value, mode=mode, **kwargs)

    configs = {
        "fsspec, retry-policy=none": {"dstl.dfs.upload.retry-policy": "none"},
        "fsspec, hedging, timeout 250ms": {
            "dstl.dfs.upload.retry-policy": "fixed",
            "dstl.dfs.upload.timeout": "250ms",
        },
    }
    data = os.urandom(100)
    results: dict[str, list[float]] = {}
    MemoryFileSystem.pipe_file = stalling_pipe
    try:
        for name, overrides in configs.items():
            task = progress.add_task(f"C: {name}", total=persists)
            config = {
                "dstl.storage": "filesystem",
                "dstl.dfs.base-path": f"memory://bench-{uuid.uuid4().hex[:8]}",
                "dstl.dfs.batch.persist-delay": "0ms",
                **overrides,
            }
            with load_storage(config, job_id="bench") as storage:
                writer = storage.create_writer("hedging", KG)
                latencies = []
                for checkpoint in range(1, persists + 1):
                    latencies.append(_persist_once(storage, writer, checkpoint, changes, data)[0])
                    progress.advance(task)
            results[name] = latencies
    finally:
        MemoryFileSystem.pipe_file = real_pipe
    return results


def _quantiles(values: list[float], qs: tuple[float, ...]) -> dict[str, float]:
    return {"n": len(values), **{f"p{q:g}_ms": percentile(values, q) * 1000 for q in qs}}


def _rows(results: dict[str, list[float]], qs: tuple[float, ...]) -> list[list[str]]:
    return [
        [name, str(len(v)), *(f"{percentile(v, q) * 1000:.1f}" for q in qs)] for name, v in results.items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--persists", type=int, default=1000, help="persists per hedging configuration")
    parser.add_argument("--changes", type=int, default=100, help="100-byte changes per persist")
    parser.add_argument("--stall-fraction", type=float, default=0.01)
    parser.add_argument("--stall-seconds", type=float, default=2.0)
    args = parser.parse_args(argv)
    console = Console()
    persists = 60 if args.quick else args.persists
    stall_fraction = 0.05 if args.quick else args.stall_fraction
    stall_seconds = 0.5 if args.quick else args.stall_seconds
    with moto_s3_server() as endpoint, Progress(console=console) as progress:
        over = overhead(endpoint, max(40, persists // 2), args.changes, progress)
        hedge, stalls = hedging(endpoint, persists, args.changes, stall_fraction, stall_seconds, progress)
        fsspec = fsspec_hedging(persists, args.changes, stall_fraction, stall_seconds, progress)
    qs = (50, 90, 99)
    over_rows = _rows(over, qs)
    p99 = {name: percentile(v, 99) for name, v in over.items()}
    overhead_pct = (p99["persist"] / p99["raw put_object"] - 1) * 100
    fencing_floor_pct = (p99["persist"] / p99["raw put_object || list (fencing floor)"] - 1) * 100
    hedge_qs = (50, 99, 99.9)
    hedge_rows = [row + [str(stalls[row[0]])] for row in _rows(hedge, hedge_qs)]
    none = percentile(hedge["retry-policy=none"], 99.9)
    reductions = {
        name: (1 - percentile(v, 99.9) / none) * 100
        for name, v in hedge.items()
        if name != "retry-policy=none"
    }
    over_cols = ["", "n", *(f"p{q:g} ms" for q in qs)]
    hedge_cols = ["configuration", "n", *(f"p{q:g} ms" for q in hedge_qs), "stalled PUTs"]
    console.print(
        _table("A: persist vs. raw S3 put_object of the same bytes (moto, loopback)", over_cols, over_rows)
    )
    console.print(f"persist p99 overhead over raw put_object: {overhead_pct:+.1f}%")
    console.print(f"persist p99 overhead over raw put_object || list: {fencing_floor_pct:+.1f}%")
    title = f"B: {stall_fraction:.0%} of PUTs stalled {stall_seconds:g} s"
    console.print(_table(title, hedge_cols, hedge_rows))
    fsspec_cols = ["configuration", "n", *(f"p{q:g} ms" for q in hedge_qs)]
    fsspec_rows = _rows(fsspec, hedge_qs)
    fsspec_title = f"C: fsspec path (memory://), {stall_fraction:.0%} of writes stalled {stall_seconds:g} s"
    console.print(_table(fsspec_title, fsspec_cols, fsspec_rows))
    for name, reduction in reductions.items():
        console.print(f"p99.9 with {name}: {reduction:.1f}% lower than retry-policy=none")
    results_dir = Path(args.results)
    results_dir.mkdir(parents=True, exist_ok=True)
    report = results_dir / "dfs-bench-s3.md"
    lines = [
        "# filesystem storage on S3 (moto, loopback)",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M:%S')}",
        "",
    ]
    lines += ["## A. persist vs. raw put_object", "", *_markdown(over_cols, over_rows), ""]
    lines += [
        f"persist p99 overhead: {overhead_pct:+.1f}%",
        "",
        f"## {title}",
        "",
        *_markdown(hedge_cols, hedge_rows),
    ]
    lines += [
        "",
        *(f"- p99.9 with {n}: {r:.1f}% lower than retry-policy=none" for n, r in reductions.items()),
        "",
    ]
    lines += [f"## {fsspec_title}", "", *_markdown(fsspec_cols, fsspec_rows), ""]
    report.write_text("\n".join(lines))
    figures = {
        "overhead": {name: _quantiles(v, qs) for name, v in over.items()},
        "overhead_p99_pct": {"raw put_object": overhead_pct, "raw put_object || list": fencing_floor_pct},
        "hedging_s3": {name: _quantiles(v, hedge_qs) for name, v in hedge.items()},
        "hedging_fsspec": {name: _quantiles(v, hedge_qs) for name, v in fsspec.items()},
    }
    report.with_suffix(".json").write_text(json.dumps(figures, indent=2))
    console.print(f"report: {report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
