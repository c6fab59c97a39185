"""Reproduce the 2022 changelog evaluation table at a smaller scale, and compare with Spark's stores.

The reference (Flink 1.15, S3, parallelism 50): ValueState checkpoint duration
p90 664 ms vs 6 s and p99.9 1 s vs 10 s with changelog on vs off, ~30% more
space, recovery 35-65 s vs 20-21 s; sliding windows ~3x faster checkpoints but
45x the space. Here, in one run and on one machine:

- both workloads (:mod:`bench.paper_workloads`) under changelog on ``local``,
  ``filesystem`` (file:// and s3 on moto) and ``kafka`` (Tansu), and changelog off
  with full and with incremental snapshots;
- the equivalent Spark job on dstl, ``applyInPandasWithState`` and
  ``transformWithStateInPandas`` on RocksDB with changelog checkpointing
  (:mod:`bench.spark_stores`).

    python -m bench.paper_bench --preset small|medium|large [--repeat N] [--no-spark]

Writes ``paper-<preset>.md`` and PNG plots (checkpoint duration distribution,
full checkpoint size over time, recovery time) to ``--results``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from bench.dstl_bench import PERCENTILES, _markdown, _table, percentile
from bench.paper_workloads import PRESETS, Preset, RunResult, run

CONFIGURATIONS = (
    "changelog-local",
    "changelog-filesystem-file",
    "changelog-filesystem-s3",
    "changelog-kafka",
    "full",
    "incremental",
)


@contextmanager
def storage_configs(workdir: Path) -> Iterator[dict[str, dict[str, str]]]:
    """The log storage of every configuration (services started here, stopped on exit)."""
    from dstl.dfs.testing import moto_s3_server
    from dstl.kafka.testing import kafka_broker

    with ExitStack() as stack:
        s3 = stack.enter_context(moto_s3_server())
        bootstrap = stack.enter_context(kafka_broker())

        def configs() -> dict[str, dict[str, str]]:
            unique = uuid.uuid4().hex[:8]
            return {
                "changelog-local": {
                    "dstl.storage": "local",
                    "dstl.local.dir": str(workdir / f"local-{unique}"),
                },
                "changelog-filesystem-file": {
                    "dstl.storage": "filesystem",
                    "dstl.dfs.base-path": (workdir / f"dfs-{unique}").as_uri(),
                },
                "changelog-filesystem-s3": {"dstl.storage": "filesystem", **s3.config(prefix=unique)},
                "changelog-kafka": {
                    "dstl.storage": "kafka",
                    "dstl.kafka.bootstrap.servers": bootstrap,
                    "dstl.kafka.topic": f"paper-{unique}",
                },
                # Changelog off: the backend's log goes nowhere durable; checkpoints are snapshots.
                "full": {"dstl.storage": "memory", "dstl.memory.namespace": f"full-{unique}"},
                "incremental": {"dstl.storage": "memory", "dstl.memory.namespace": f"incr-{unique}"},
            }

        yield configs


def _median_result(results: list[RunResult]) -> RunResult:
    """Per-metric medians over repeats (durations pooled)."""
    first = results[0]
    merged = RunResult(first.workload, first.configuration)
    for r in results:
        merged.durations_ms.extend(r.durations_ms)
    merged.checkpointed = results[len(results) // 2].checkpointed
    merged.full_sizes = results[len(results) // 2].full_sizes
    merged.recovery_s = statistics.median(r.recovery_s for r in results)
    merged.records_per_s = statistics.median(r.records_per_s for r in results)
    merged.state_entries = first.state_entries
    merged.state_bytes = int(statistics.median(r.state_bytes for r in results))
    merged.spread = {
        "recovery": (min(r.recovery_s for r in results), max(r.recovery_s for r in results)),
        "p99": (
            min(percentile(r.durations_ms, 99) for r in results),
            max(percentile(r.durations_ms, 99) for r in results),
        ),
    }
    return merged


def _rows(results: list[RunResult]) -> list[list[str]]:
    rows = []
    for r in results:
        rows.append(
            [
                r.configuration,
                *(f"{percentile(r.durations_ms, q):.1f}" for q in PERCENTILES),
                f"{statistics.median(r.checkpointed) / 1e6:.2f}",
                f"{r.full_sizes[-1] / 1e6:.2f}",
                f"{r.full_sizes[-1] / r.state_bytes:.2f}",
                f"{r.recovery_s * 1000:.0f}",
                f"{r.records_per_s:,.0f}",
            ]
        )
    return rows


COLUMNS = [
    "configuration",
    *(f"ckpt p{q:g} ms" for q in PERCENTILES),
    "checkpointed MB (median)",
    "full checkpoint MB",
    "full / state",
    "recovery ms",
    "records/s",
]


def _verdicts(by_workload: dict[str, dict[str, RunResult]], preset: str) -> list[str]:
    """The targets of the issue, met or not, stated plainly."""
    lines = []
    value, window = by_workload.get("value", {}), by_workload.get("window", {})
    if value:
        local, full = value["changelog-local"], value["full"]
        ratio = percentile(full.durations_ms, 99) / percentile(local.durations_ms, 99)
        lines.append(
            f"- ValueState p99 checkpoint: full snapshots / changelog-local = {ratio:.1f}x "
            f"(target >= 10x at 1M keys; preset {preset}): {'MET' if ratio >= 10 else 'NOT MET'}"
        )
        recovery = local.recovery_s / full.recovery_s
        lines.append(
            f"- ValueState recovery: changelog-local / full = {recovery:.2f}x (target <= 1.2x): "
            f"{'MET' if recovery <= 1.2 else 'NOT MET'}"
        )
        space = local.full_sizes[-1] / local.state_bytes
        lines.append(
            f"- ValueState full checkpoint size / state size = {space:.2f} (target <= 1.3): "
            f"{'MET' if space <= 1.3 else 'NOT MET'}"
        )
    if window:
        local = window["changelog-local"]
        space = local.full_sizes[-1] / local.state_bytes
        lines.append(
            f"- Window full checkpoint size / state size = {space:.2f} (target <= 3): "
            f"{'MET' if space <= 3 else 'NOT MET'}"
        )
    return lines


def _plot(path: Path, by_workload: dict[str, dict[str, RunResult]], console: Console) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        console.print("matplotlib not installed: no plot (pip install 'dstl[bench]')")
        return
    workloads = list(by_workload)
    figure, axes = plt.subplots(len(workloads), 3, figsize=(16, 4.5 * len(workloads)), squeeze=False)
    for row, workload in enumerate(workloads):
        durations, sizes, recovery = axes[row]
        results = by_workload[workload]
        for name, r in results.items():
            ordered = sorted(r.durations_ms)
            durations.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=name)
            sizes.plot(range(1, len(r.full_sizes) + 1), [s / 1e6 for s in r.full_sizes], label=name)
        recovery.barh(list(results), [r.recovery_s * 1000 for r in results.values()])
        durations.set(title=f"{workload}: checkpoint duration CDF", xlabel="ms", xscale="log", ylabel="share")
        sizes.set(title=f"{workload}: full checkpoint size", xlabel="checkpoint", ylabel="MB")
        recovery.set(title=f"{workload}: recovery time", xlabel="ms")
        durations.legend(fontsize=7)
        sizes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    """Run every configuration of both workloads (and the Spark job) and write the report."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="small")
    parser.add_argument("--repeat", type=int, default=1, help="runs per configuration; medians reported")
    parser.add_argument("--workloads", default="value,window")
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark state-store comparison")
    parser.add_argument("--spark-batches", type=int, default=12)
    parser.add_argument("--spark-rows", type=int, default=10_000)
    parser.add_argument("--results", default="bench/results")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON (Spark: per engine)")
    args = parser.parse_args(argv)
    preset: Preset = PRESETS[args.preset]
    console = Console()
    by_workload: dict[str, dict[str, RunResult]] = {}
    workloads = args.workloads.split(",")
    with tempfile.TemporaryDirectory(prefix="dstl-paper-") as tmp, storage_configs(Path(tmp)) as configs:
        with Progress(console=console) as progress:
            total = len(workloads) * len(CONFIGURATIONS) * args.repeat * preset.checkpoints
            task = progress.add_task(f"preset {args.preset}", total=total)
            for workload in workloads:
                for configuration in CONFIGURATIONS:
                    progress.update(task, description=f"{workload} / {configuration}")
                    runs = [
                        run(
                            workload,
                            configuration,
                            configs()[configuration],
                            (Path(tmp) / f"snap-{uuid.uuid4().hex[:8]}").as_uri(),
                            preset,
                            Path(tmp),
                            lambda: progress.advance(task),
                        )
                        for _ in range(args.repeat)
                    ]
                    by_workload.setdefault(workload, {})[configuration] = _median_result(runs)
        spark_rows: list[list[str]] = []
        spark_notes: list[str] = []
        spark_figures: dict[str, dict] = {}
        if not args.no_spark:
            from bench.spark_stores import compare, materialization_cost, speedups, summary_rows
            from dstl.backend.spark.demo.run import spark_session

            console.print(
                f"Spark job on three state stores: {args.spark_batches} batches of {args.spark_rows:,} rows"
            )
            spark = spark_session("dstl-paper-bench")
            spark.sparkContext.setLogLevel("ERROR")
            try:
                spark_results = compare(spark, Path(tmp) / "spark", args.spark_batches, args.spark_rows)
                spark_rows = summary_rows(spark_results)
                spark_notes = speedups(spark_results)
                spark_notes += [note for r in spark_results if (note := materialization_cost(r))]
                spark_figures = {r.key: r.figures() for r in spark_results}
            finally:
                spark.stop()
    lines = [f"# Changelog evaluation, preset {args.preset} (repeat {args.repeat}, medians)", ""]
    lines += [
        f"{preset.checkpoints} checkpoints of {preset.records_per_checkpoint:,} records "
        f"(value: {preset.new_key_share:.0%} new keys; window: {preset.window_keys:,} keys, "
        f"window {preset.window} / slide {preset.slide} checkpoint intervals); changelog configurations "
        f"materialize when the log exceeds {preset.max_log_ratio} x the materialized state and "
        f"squash repeated updates ({preset.squash_updates}: window only, value keys are mostly new); "
        "snapshots on file://. Recovery: median "
        f"of {preset.recovery_repeat} fresh processes each restoring the last checkpoint "
        "(`restore()` alone: interpreter start excluded).",
        "",
    ]
    for workload, results in by_workload.items():
        rows = _rows(list(results.values()))
        console.print(_table(f"{workload} workload, preset {args.preset}", COLUMNS, rows))
        lines += [f"## {workload}", "", *_markdown(COLUMNS, rows), ""]
        if args.repeat > 1:
            lines += [
                "Noise across repeats (min-max): "
                + "; ".join(
                    f"{name}: p99 {r.spread['p99'][0]:.1f}-{r.spread['p99'][1]:.1f} ms, recovery "
                    f"{r.spread['recovery'][0] * 1000:.0f}-{r.spread['recovery'][1] * 1000:.0f} ms"
                    for name, r in results.items()
                ),
                "",
            ]
    verdicts = _verdicts(by_workload, args.preset)
    lines += ["## Targets", "", *verdicts, ""]
    if spark_rows:
        from bench.spark_stores import SUMMARY_COLUMNS as columns

        console.print(_table("The same Spark job on dstl and on Spark's state stores", columns, spark_rows))
        lines += ["## Spark job, per-batch state commit", "", *_markdown(columns, spark_rows), ""]
        for note in spark_notes:
            console.print(note)
            lines += [note, ""]
    for line in verdicts:
        console.print(line)
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    report = out / f"paper-{args.preset}.md"
    report.write_text("\n".join(lines))
    if args.json:
        import json

        Path(args.json).write_text(json.dumps({"preset": args.preset, "spark": spark_figures}, indent=2))
    _plot(out / f"paper-{args.preset}.png", by_workload, console)
    console.print(f"report: {report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
