"""What a long snapshot read costs the LMDB working state: a view held on the live file, or detached.

An LMDB reader keeps every page replaced after it began from reuse. A materialization
reading its view while batches run therefore makes the file grow by the pages each
batch rewrites; a view detached onto a copy (:meth:`StateView.detach`) lets the file
reuse them. Both measured in the same run, on fresh files: ``--keys`` values, then
``--batches`` batches each rewriting ``--share`` of the keys (random ones) while one
view stays open; then the view is read to the end, as a full snapshot reads it.

    python -m bench.lmdb_view_bench [--keys N] [--batches B] [--share S] [--json PATH] [--plot PNG]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

from bench.dstl_bench import _table
from bench.spark_stores import KEY_SHAPES
from dstl.backend.delegate import LmdbDelegate

_STATE, _GROUPS = "count", 128
_MODES = ("live view", "detached")
_MAP = 1 << 38  # no growth in the run: a held view would block it (this bench reads it only at the end)


def _keys(count: int) -> list[bytes]:
    spell = KEY_SHAPES["random"]  # keys like user ids, as the Spark bench spells them
    return [spell(number).encode() for number in range(count)]


def _file_mb(path: Path) -> float:
    return os.path.getsize(path / "data.mdb") / 2**20


def run_mode(mode: str, keys: list[bytes], batches: int, share: float, progress: Progress) -> dict[str, Any]:
    """One fresh file: load, open a view (detached or not), run the batches, read the view to the end."""
    rng = random.Random(7)
    groups = [zlib.crc32(key) % _GROUPS for key in keys]
    with tempfile.TemporaryDirectory() as workdir:
        path = Path(workdir) / "state"
        delegate = LmdbDelegate(path, map_size=_MAP)
        delegate.put_values(_STATE, groups, keys, [b"\x01"] * len(keys))
        loaded = _file_mb(path)
        view = delegate.view()
        detach_ms = 0.0
        if mode == "detached":
            began = time.perf_counter()
            view.detach()
            detach_ms = (time.perf_counter() - began) * 1000
        sizes, batch_ms = [], []
        task = progress.add_task(f"{mode}: batches", total=batches)
        for batch in range(batches):
            chosen = sorted(rng.sample(range(len(keys)), int(len(keys) * share)))
            began = time.perf_counter()
            delegate.put_values(
                _STATE,
                [groups[i] for i in chosen],
                [keys[i] for i in chosen],
                [bytes([batch + 2])] * len(chosen),
            )
            batch_ms.append((time.perf_counter() - began) * 1000)
            sizes.append(_file_mb(path))
            progress.advance(task)
        began = time.perf_counter()
        read = sum(len(rows) for _, rows in view.sections(range(_GROUPS)))
        read_s = time.perf_counter() - began
        view.close()
        delegate.close()
    return {
        "mode": mode,
        "loaded_mb": round(loaded, 1),
        "file_mb": [round(size, 1) for size in sizes],
        "batch_ms": [round(ms, 1) for ms in batch_ms],
        "detach_ms": round(detach_ms, 1),
        "read_s": round(read_s, 2),
        "read_entries": read,
    }


def _plot(results: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for result in results:
        axes.plot(range(1, len(result["file_mb"]) + 1), result["file_mb"], marker="o", label=result["mode"])
    axes.set_xlabel("batches while the snapshot's view is open")
    axes.set_ylabel("LMDB file, MB")
    axes.set_title("A snapshot view held on the live file vs detached onto a copy")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=2_000_000)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--share", type=float, default=0.25, help="share of the keys each batch rewrites")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--plot", metavar="PNG")
    args = parser.parse_args(argv)
    console = Console()
    keys = _keys(args.keys)
    with Progress(console=console, transient=True) as progress:
        results = [
            run_mode(mode, keys, args.batches, args.share, progress) for mode in ("live view", "detached")
        ]
    rows = [
        [
            result["mode"],
            f"{result['loaded_mb']:.0f}",
            f"{result['file_mb'][-1]:.0f}",
            f"{result['detach_ms']:.0f}",
            f"{sorted(result['batch_ms'])[len(result['batch_ms']) // 2]:.0f}",
            f"{result['read_s']:.2f}",
        ]
        for result in results
    ]
    headers = ["view", "loaded MB", f"after {args.batches} batches MB", "detach ms", "batch p50 ms", "read s"]
    console.print(_table(f"{args.keys:,} keys, {args.share:.0%} rewritten a batch", headers, rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), "results": results}, indent=2))
    if args.plot:
        _plot(results, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
