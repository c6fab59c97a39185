"""What a running snapshot costs the batches beside it: encoded in their process, or by an encoder process.

A materialization runs in a thread of the task's Python process. Encoding a snapshot
there shares the GIL with the batches; encoded by a separate Python process
(``state.changelog.materialization.encode-apart-from``) it shares none, and costs that
process's memory instead. Measured in one run, on fresh LMDB files of ``--keys``
values: batches with no snapshot running (the baseline), then back-to-back batches
while a full snapshot is encoded in the process, then while the encoder process
encodes it. Each batch writes ``--batch-keys`` random keys and rewrites a quarter of a
resident heap of ``--heap-mb`` (in place: what made a forked child's copy-on-write
memory grow, session 30). Sampled every 20 ms: the child's private dirty memory
(``Private_Dirty`` of its ``smaps_rollup``: the pages it alone holds; the copy it reads
is page cache) and the parent's anonymous RSS.

    python -m bench.encode_apart_bench [--keys N] [--batch-keys K] [--heap-mb M] [--json PATH] [--plot PNG]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

from bench.dstl_bench import _table
from bench.spark_stores import KEY_SHAPES
from dstl.backend.changelog.materializer import Materializer
from dstl.backend.changelog.snapshot_encoding import SnapshotEncoding
from dstl.backend.delegate import LmdbDelegate
from dstl.backend.pacing import foreground
from dstl.spi import KeyGroupRange

_STATE, _GROUPS = "count", 128
_MODES = {"in the task's process": 0, "encoder process": 1}
_PAGE = 4096


class _Target:
    """The part of a backend a materializer reads (``MaterializationTarget``)."""

    job_id, operator_id, log_id = "bench", "op", "op.kg0-128"
    key_groups = KeyGroupRange(0, _GROUPS)

    def __init__(self, delegate: LmdbDelegate) -> None:
        self.delegate = delegate

    def begin_materialization(self) -> int:
        return 1

    def registrations(self) -> dict[str, tuple[str, str]]:
        return {_STATE: ("value", "msgpack")}

    def ttl_states(self) -> dict[str, tuple[str, float]]:
        return {}

    def clock(self) -> float:
        return time.time()


def _kib(path: str, fields: tuple[str, ...]) -> int:
    """The sum of ``fields`` (kB lines) in a /proc status-like file; 0 once the process is gone."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return 0
    return sum(int(line.split()[1]) for line in lines if line.split(":")[0] in fields)


def _children() -> list[int]:
    pids: list[int] = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            pids += [int(pid) for pid in (task / "children").read_text().split()]
        except OSError:
            continue
    return pids


class _Sampler(threading.Thread):
    """Samples the child processes' private dirty memory and this process's anonymous RSS."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.began = time.perf_counter()
        self.samples: list[tuple[float, float, float]] = []  # (s, child private MB, parent anon MB)
        self._ending = threading.Event()

    def run(self) -> None:
        while not self._ending.wait(0.02):
            child = sum(
                _kib(f"/proc/{pid}/smaps_rollup", ("Private_Dirty",)) for pid in _children()
            )
            parent = _kib("/proc/self/status", ("RssAnon",))
            self.samples.append((time.perf_counter() - self.began, child / 1024, parent / 1024))

    def stop(self) -> None:
        self._ending.set()
        self.join()


def _batch(
    delegate: LmdbDelegate, keys: list[bytes], count: int, heap: list[bytearray], rng: random.Random
) -> float:
    """One batch's work as foreground work; its wall ms."""
    began = time.perf_counter()
    with foreground():
        chosen = rng.sample(keys, count)
        delegate.put_values(_STATE, [zlib.crc32(key) % _GROUPS for key in chosen], chosen, [b"\x02"] * count)
        start = rng.randrange(4)
        for block in heap[start::4]:  # a quarter of the resident heap, rewritten in place
            block[::_PAGE] = b"\x01" * len(range(0, len(block), _PAGE))
    return (time.perf_counter() - began) * 1000


def run_mode(
    mode: str, keys: list[bytes], batch_keys: int, heap_mb: int, progress: Progress
) -> dict[str, Any]:
    """A fresh file: batches alone, then batches beside a full snapshot encoded as ``mode`` says."""
    rng = random.Random(7)
    heap = [bytearray(1 << 20) for _ in range(heap_mb)]
    with tempfile.TemporaryDirectory() as workdir:
        delegate = LmdbDelegate(Path(workdir) / "state", map_size=1 << 36)
        delegate.put_values(_STATE, [zlib.crc32(key) % _GROUPS for key in keys], keys, [b"\x01"] * len(keys))
        alone = [_batch(delegate, keys, batch_keys, heap, rng) for _ in range(5)]
        encoding = SnapshotEncoding("zstd", _MODES[mode])
        materializer = Materializer(
            _Target(delegate), (Path(workdir) / "snap").as_uri(), 3, encoding=encoding
        )
        task = progress.add_task(f"{mode}: batches beside the snapshot", total=None)
        sampler = _Sampler()
        sampler.start()
        began = time.perf_counter()
        running = materializer.start()
        beside: list[float] = []
        while not running.done():
            beside.append(_batch(delegate, keys, batch_keys, heap, rng))
            progress.advance(task)
        snapshot_s = time.perf_counter() - began
        ref = running.result()
        sampler.stop()
        materializer.close()
        delegate.close()
        progress.remove_task(task)
    return {
        "mode": mode,
        "batch_alone_p50_ms": statistics.median(alone),
        "batch_beside_p50_ms": statistics.median(beside) if beside else None,
        "batches_beside": len(beside),
        "snapshot_s": snapshot_s,
        "snapshot_mb": ref.size / 2**20,
        "child_private_max_mb": max((sample[1] for sample in sampler.samples), default=0.0),
        "parent_anon_max_mb": max((sample[2] for sample in sampler.samples), default=0.0),
        "samples": sampler.samples,
    }


def _plot(results: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (memory, times) = plt.subplots(1, 2, figsize=(11, 4))
    for result in results:
        samples = result["samples"]
        memory.plot(
            [s[0] for s in samples], [s[1] for s in samples], label=f"{result['mode']}: child private"
        )
        memory.plot(
            [s[0] for s in samples], [s[2] for s in samples], "--", label=f"{result['mode']}: parent anon"
        )
    memory.set_xlabel("s since the snapshot began")
    memory.set_ylabel("MB")
    memory.legend(fontsize=7)
    labels = ["alone"] + [result["mode"] for result in results]
    values = [results[0]["batch_alone_p50_ms"]] + [result["batch_beside_p50_ms"] or 0 for result in results]
    times.bar(labels, values)
    times.set_ylabel("batch p50 ms")
    times.set_title("a batch beside a full snapshot")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    """Run both modes and print (and optionally write) the figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keys", type=int, default=2_000_000)
    parser.add_argument("--batch-keys", type=int, default=100_000)
    parser.add_argument("--heap-mb", type=int, default=256)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--plot", metavar="PNG")
    args = parser.parse_args(argv)
    console = Console()
    spell = KEY_SHAPES["random"]
    keys = [spell(number).encode() for number in range(args.keys)]
    with Progress(console=console, transient=True) as progress:
        results = [run_mode(mode, keys, args.batch_keys, args.heap_mb, progress) for mode in _MODES]
    rows = [
        [
            result["mode"],
            f"{result['batch_alone_p50_ms']:,.0f}",
            f"{result['batch_beside_p50_ms'] or 0:,.0f}",
            str(result["batches_beside"]),
            f"{result['snapshot_s']:.2f}",
            f"{result['child_private_max_mb']:,.0f}",
            f"{result['parent_anon_max_mb']:,.0f}",
        ]
        for result in results
    ]
    headers = [
        "snapshot encoded",
        "batch alone p50 ms",
        "beside p50 ms",
        "batches",
        "snapshot s",
        "child MB",
        "parent MB",
    ]
    console.print(
        _table(f"{args.keys:,} keys, {args.batch_keys:,} keys a batch, heap {args.heap_mb} MB", headers, rows)
    )
    settings = {"keys": args.keys, "batch_keys": args.batch_keys, "heap_mb": args.heap_mb}
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": settings, "results": results}, indent=2))
    if args.plot:
        _plot(results, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
