"""Changelog vs full vs incremental snapshots: a ValueState workload, measured in one run.

Each configuration loads the same keys, takes a full snapshot, then runs the
same checkpoints, each after updating the same random 1% of the keys:

- **changelog**: a checkpoint persists the log since the last materialization
  (local storage); a materialization starts in the background every
  ``--materialize-every`` checkpoints; confirmed checkpoints truncate the log.
- **full snapshot**: a checkpoint writes every key (changelog off).
- **incremental snapshot**: a checkpoint writes the keys changed since the last
  one (changelog off; a full one when the increments reach a full one's size).

Reported per configuration: checkpoint duration p50/p90/p99/p99.9, bytes uploaded
per checkpoint (checkpointed size) and bytes a restore reads (full checkpoint size).

    python -m bench.backend_bench                 # 1M keys, 30 checkpoints
    python -m bench.backend_bench --keys 100000 --checkpoints 20
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from bench.checkpointing import take_checkpoint
from bench.dstl_bench import PERCENTILES, _markdown, _table, percentile
from dstl.backend.changelog import ChangelogKeyedStateBackend
from dstl.spi import KeyGroupRange, load_storage

ALL = KeyGroupRange(0, 128)
MODES = ("changelog", "full snapshot", "incremental snapshot")


@dataclass
class Result:
    """Per-checkpoint figures of one configuration."""

    mode: str
    durations_ms: list[float] = field(default_factory=list)
    checkpointed: list[int] = field(default_factory=list)
    full_sizes: list[int] = field(default_factory=list)
    state_bytes: int = 0
    load_seconds: float = 0.0


def _update(backend: ChangelogKeyedStateBackend, state, keys, round_: int) -> None:
    for key in keys:
        backend.set_current_key(key)
        state.update(f"value-{key}-{round_:04d}")


def run_mode(
    mode: str, keys: int, checkpoints: int, fraction: float, every: int, workdir: Path, progress
) -> Result:
    """Load, snapshot, then ``checkpoints`` rounds of update + checkpoint for one configuration."""
    config = {"dstl.storage": "local", "dstl.local.dir": str(workdir / f"log-{uuid.uuid4().hex}")}
    snapshots = (workdir / f"snap-{uuid.uuid4().hex}").as_uri()
    result = Result(mode)
    rng = random.Random(42)  # same updated keys in every configuration
    task = progress.add_task(f"{mode}: load {keys:,} keys", total=checkpoints)
    with load_storage(config, job_id="bench") as storage:
        backend = ChangelogKeyedStateBackend(
            storage,
            "op",
            ALL,
            snapshot_dir=snapshots,
            full_materialization_every={"changelog": 5, "full snapshot": 1, "incremental snapshot": 10**6}[
                mode
            ],
        )
        state = backend.value_state("value")
        began = time.perf_counter()
        _update(backend, state, range(keys), 0)
        result.load_seconds = time.perf_counter() - began
        first = backend.materialize().result(timeout=600)
        result.state_bytes = first.size
        if mode == "changelog":
            backend.notify_checkpoint_complete(backend.checkpoint(0).result(timeout=600))
        progress.update(task, description=mode)
        for checkpoint_id in range(1, checkpoints + 1):
            _update(backend, state, rng.sample(range(keys), int(keys * fraction)), checkpoint_id)
            if mode == "changelog" and checkpoint_id % every == 0:
                backend.materialize()  # background; the next checkpoints use it once done
            figures = take_checkpoint(backend, checkpoint_id, mode)
            result.checkpointed.append(figures.checkpointed)
            result.full_sizes.append(figures.full_size)
            elapsed = figures.seconds
            result.durations_ms.append(elapsed * 1000)
            progress.advance(task)
        backend.close()
    return result


def _mb(value: float) -> str:
    return f"{value / 1e6:.2f} MB"


def _rows(results: list[Result]) -> list[list[str]]:
    return [
        [
            r.mode,
            *(f"{percentile(r.durations_ms, q):.1f}" for q in PERCENTILES),
            _mb(statistics.median(r.checkpointed)),
            _mb(r.full_sizes[-1]),
            f"{r.full_sizes[-1] / r.state_bytes:.2f}",
        ]
        for r in results
    ]


def _plot(path: Path, results: list[Result], console: Console) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        console.print("matplotlib not installed: no plot (pip install 'dstl[bench]')")
        return
    figure, (durations, sizes) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in results:
        ids = range(1, len(r.durations_ms) + 1)
        durations.plot(ids, r.durations_ms, marker=".", label=r.mode)
        sizes.plot(ids, [s / 1e6 for s in r.full_sizes], marker=".", label=r.mode)
    durations.set(title="checkpoint duration", xlabel="checkpoint", ylabel="ms", yscale="log")
    sizes.set(title="full checkpoint size", xlabel="checkpoint", ylabel="MB")
    durations.legend()
    sizes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    """Run the three configurations and print/write the comparison."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--checkpoints", type=int, default=30)
    parser.add_argument("--fraction", type=float, default=0.01, help="share of keys updated per checkpoint")
    parser.add_argument(
        "--materialize-every", type=int, default=10, help="changelog: checkpoints between materializations"
    )
    parser.add_argument("--quick", action="store_true", help="20k keys, 8 checkpoints (smoke test)")
    parser.add_argument("--results", default="bench/results")
    args = parser.parse_args(argv)
    if args.quick:
        args.keys, args.checkpoints, args.materialize_every = 20_000, 8, 4
    console = Console()
    results = []
    with (
        tempfile.TemporaryDirectory(prefix="dstl-backend-bench-") as tmp,
        Progress(console=console) as progress,
    ):
        for mode in MODES:
            results.append(
                run_mode(
                    mode,
                    args.keys,
                    args.checkpoints,
                    args.fraction,
                    args.materialize_every,
                    Path(tmp),
                    progress,
                )
            )
    columns = [
        "configuration",
        *(f"p{q:g} ms" for q in PERCENTILES),
        "checkpointed (median)",
        "full size",
        "full/state",
    ]
    rows = _rows(results)
    title = (
        f"ValueState, {args.keys:,} keys, {args.fraction:.0%} updated per checkpoint, "
        f"{args.checkpoints} checkpoints"
    )
    console.print(_table(title, columns, rows))
    changelog, full, incremental = results
    speedup_full = percentile(full.durations_ms, 99) / percentile(changelog.durations_ms, 99)
    speedup_incr = percentile(incremental.durations_ms, 99) / percentile(changelog.durations_ms, 99)
    summary = [
        f"changelog p99 is {speedup_full:.1f}x lower than full snapshots and {speedup_incr:.1f}x lower than "
        "incremental snapshots (same run)",
        f"state size (first full snapshot): {_mb(changelog.state_bytes)}; load: "
        + ", ".join(f"{r.mode} {r.load_seconds:.1f} s" for r in results),
    ]
    for line in summary:
        console.print(line)
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    report = out / "backend-bench.md"
    report.write_text("\n".join([f"# {title}", "", *_markdown(columns, rows), "", *summary, ""]))
    _plot(out / "backend-bench.png", results, console)
    console.print(f"report: {report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
