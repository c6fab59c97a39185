"""The same stateful Spark job on dstl and on Spark's built-in state stores, in one run.

The job keeps a running count per key (a ValueState; most keys new, the rest
updated), ``rows`` rows per micro-batch, on:

- ``dstl-batch``: :func:`dstl.backend.spark.transform_with_state` with the batch
  API (keys grouped once, state read and written in bulk, output column-wise),
  local storage;
- ``dstl-per-key``: the same with the per-key API (``handle_input_rows``);
- ``floor``: no state at all: ``foreachBatch``, the same shuffle by key and one
  vectorized ``mapInArrow`` per partition (what moving the rows costs);
- ``jvm-count``: Spark's own JVM aggregation of the same job, ``groupBy("k").count()``;
- ``transformWithState``: PySpark's row-based API (4.1+), the one Spark recommends
  for many keys;
- ``applyInPandasWithState``: Spark's HDFS-backed state store;
- ``transformWithStateInPandas``.

Spark's RocksDB-backed engines run with changelog checkpointing
(``spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled``).

Per batch: the state commit time (Spark: ``stateOperators[].commitTimeMs``; dstl:
the slowest instance's persist) and the batch duration. At the end: the bytes of
state the checkpoint holds on disk (Spark: ``<checkpoint>/state``, with its default
retention of 100 batches; dstl: its log and snapshots, retention 2 checkpoints).
"""

from __future__ import annotations

import json
import os
import random
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FILE_TIME = 1_750_000_000
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
#: Every engine's output rows: the key and its running count.
OUTPUT = "k string, n long"


@dataclass
class StoreResult:
    """Per-batch figures of one engine.

    :ivar key: the engine's short name (the key of the machine-readable figures).
    """

    key: str
    engine: str
    commit_ms: list[float] = field(default_factory=list)
    batch_ms: list[float] = field(default_factory=list)
    rows: int = 0
    state_bytes: int = 0  # what the checkpoint holds for the state at the end: the files' sizes
    state_disk_bytes: int = 0  # the disk blocks those files occupy (``du``: holes not counted)
    materializing: list[bool] = field(default_factory=list)  # per batch (dstl): it started a snapshot
    phases: list[dict[str, float]] = field(default_factory=list)  # per batch (dstl): driver and task ms
    #: per batch: Spark's own phases (``durationMs`` of its progress: planning, offsets, ``addBatch``...)
    spark_phases: list[dict[str, float]] = field(default_factory=list)

    batch_rows: list[int] = field(default_factory=list)
    #: Leading batches left out of the figures: the first (one-time set-up) or those loading the state.
    warm_up: int = 1

    @property
    def records_per_s(self) -> float:
        """Steady-state throughput: rows over the summed batch durations, the warm-up batches left out.

        The first batch of a query pays its one-time set-up (Python workers, state
        store providers), which says nothing about a streaming job's throughput.
        """
        rows, durations = self.steady(self.batch_rows), self.steady(self.batch_ms)
        return sum(rows) / (sum(durations) / 1000) if durations and sum(durations) else 0.0

    def steady(self, values: list[Any]) -> list[Any]:
        """``values`` (one per batch) without the warm-up batches."""
        return values[self.warm_up :] or values

    def figures(self) -> dict[str, Any]:
        """The machine-readable figures (the first batch, JVM warm-up, left out of the percentiles)."""
        from bench.dstl_bench import percentile

        commits, batches = self.steady(self.commit_ms), self.steady(self.batch_ms)
        return {
            "engine": self.engine,
            "records_per_s": self.records_per_s,
            "batch_p50_ms": statistics.median(batches) if batches else 0.0,
            "batch_p99_ms": percentile(batches, 99) if batches else 0.0,
            "commit_p50_ms": statistics.median(commits) if commits else 0.0,
            "commit_p99_ms": percentile(commits, 99) if commits else 0.0,
            "state_bytes": self.state_bytes,
            "state_disk_bytes": self.state_disk_bytes,
            "rows": self.rows,
            "batches": len(self.batch_ms),
            "warm_up_batches": self.warm_up,
            "batch_ms": self.batch_ms,
            "materializing": self.materializing,
            "phases": self.phases,
            "spark_phases": self.spark_phases,
        }


#: How the job's keys are spelled: numbered as they first appear, or as scattered as user ids.
KEY_SHAPES = {
    "sequential": lambda number: f"k{number}",
    "random": lambda number: f"u{(number * 0x9E3779B97F4A7C15) % (1 << 64):016x}",  # a bijection
}


def write_inputs(
    directory: Path,
    batches: int,
    rows: int,
    new_share: float = 0.8,
    state_keys: int = 0,
    key_shape: str = "sequential",
) -> int:
    """``batches`` files of ``rows`` keys each, in processing order; returns how many load files come first.

    Without ``state_keys``, most keys are new (``new_share``). With it, files of
    ``rows`` new keys load that many keys first, and the ``batches`` after them
    mostly update (a fifth new keys): state of a given size, then steady updates.
    ``key_shape`` (:data:`KEY_SHAPES`): new keys numbered in order, or scattered
    like user ids (what a store's page locality sees of real keys).
    """
    spell = KEY_SHAPES[key_shape]
    rng = random.Random(3)
    directory.mkdir(parents=True, exist_ok=True)
    load = -(-state_keys // rows)
    next_key = 0
    for index in range(load + batches):
        keys = []
        for _ in range(min(rows, state_keys - next_key) if index < load else rows):
            share = 1.0 if index < load else (0.2 if state_keys else new_share)
            if next_key == 0 or rng.random() < share:
                keys.append(next_key)
                next_key += 1
            else:
                keys.append(rng.randrange(next_key))
        path = directory / f".f{index:05d}.tmp"
        path.write_text("".join(json.dumps({"k": spell(k)}) + "\n" for k in keys))
        os.utime(path, (FILE_TIME + index, FILE_TIME + index))
        path.replace(directory / f"f{index:05d}.json")
    return load


def _dir_bytes(*directories: Path) -> tuple[int, int]:
    """Bytes of the files under ``directories``: their sizes, and the disk blocks they occupy."""
    stats = [f.stat() for d in directories for f in d.rglob("*") if f.is_file()]
    return sum(st.st_size for st in stats), sum(st.st_blocks * 512 for st in stats)


def file_source(spark: Any, inputs: Path) -> Any:
    """The job's input: the JSON files of ``inputs``, one file a batch (as every engine reads them)."""
    return spark.readStream.schema("k string").option("maxFilesPerTrigger", 1).json(str(inputs))


def _counts(key: Any, rows: Any, previous: int) -> Any:
    import pandas as pd

    return pd.DataFrame({"k": [key[0] if isinstance(key, tuple) else key], "n": [previous + len(rows)]})


def count_processors() -> tuple[type, type]:
    """The job's processor on the per-key API and on the batch API (defined where Spark can pickle them)."""
    from dstl.backend.spark import StatefulProcessor

    class CountPerKey(StatefulProcessor):
        def init(self, context: Any) -> None:
            self.count = context.get_value_state("n")

        def handle_input_rows(self, key: Any, rows: Any) -> Any:
            total = (self.count.value() or 0) + len(rows)
            self.count.update(total)
            return [{"k": key, "n": total}]  # a row dict, the per-key API's idiom (README)

    class CountBatch(CountPerKey):
        def handle_batch(self, batch: Any, context: Any) -> Any:
            previous = self.count.get_many(batch.key_set)
            totals = [(p or 0) + c for p, c in zip(previous, batch.counts().tolist(), strict=True)]
            self.count.update_many(batch.key_set, totals)
            return {"k": batch.keys, "n": totals}

    return CountPerKey, CountBatch


def _run_dstl(
    spark: Any, inputs: Path, workdir: Path, *, batch_api: bool, encode_here: bool = False
) -> StoreResult:
    """The job on dstl's changelog backend (local storage, LMDB working copies).

    :param encode_here: snapshots encoded in the task's Python process, not by an encoder
        process (``state.changelog.materialization.encode-apart-from=0``).
    """
    from dstl.backend.spark import transform_with_state, wait_for_snapshots

    per_key, batch = count_processors()
    name = ("batch" if batch_api else "per-key") + ("-encode-here" if encode_here else "")
    query = transform_with_state(
        file_source(spark, inputs),
        key_columns=["k"],
        processor=batch if batch_api else per_key,
        output_schema="k string, n long",
        sink=lambda frame, batch_id: frame.write.format("noop").mode("overwrite").save(),
        checkpoint_location=str(workdir / f"dstl-{name}-checkpoint"),
        config={
            "dstl.storage": "local",
            "dstl.spark.working-dir": str(workdir / f"dstl-{name}-working"),
            "state.changelog.materialization.interval": "10s",
            **({"state.changelog.materialization.encode-apart-from": "0"} if encode_here else {}),
        },
        trigger={"availableNow": True},
        job_id=f"stores-{name}",
    )
    query.await_termination()
    if query.exception() is not None:
        raise query.exception()
    # the instances stay warm: a snapshot of the last batches may still write into workdir
    wait_for_snapshots(workdir / f"dstl-{name}-working", timeout=300)
    where = ", snapshots encoded in the task's process" if encode_here else ""
    api = "batch" if batch_api else "per-key"
    result = StoreResult(f"dstl-{name}", f"dstl {api} API (changelog, local{where})")
    spark_side = {p.batchId: p for p in query.query.recentProgress if p.numInputRows > 0}
    for progress in query.progress:
        if progress.batch_id not in spark_side:  # no input rows: the other engines' figures leave it out too
            continue
        duration = spark_side[progress.batch_id].batchDuration
        result.spark_phases.append(_spark_phases(spark_side[progress.batch_id]))
        result.commit_ms.append(progress.checkpoint_ms)
        result.batch_ms.append(float(duration))  # Spark's own trigger duration, as for the other engines
        result.materializing.append(bool(progress.materialized))
        result.batch_rows.append(progress.rows)
        result.phases.append(dstl_phases(progress))
        result.rows += progress.rows
    checkpoint = workdir / f"dstl-{name}-checkpoint"
    result.state_bytes, result.state_disk_bytes = _dir_bytes(
        checkpoint / "dstl-state", checkpoint / "dstl-changelog"
    )
    return result


def run_dstl_batch(spark: Any, inputs: Path, workdir: Path) -> StoreResult:
    """The job on dstl with the batch API."""
    return _run_dstl(spark, inputs, workdir, batch_api=True)


def run_dstl_batch_encode_here(spark: Any, inputs: Path, workdir: Path) -> StoreResult:
    """The job on dstl with the batch API, snapshots encoded in the task's process."""
    return _run_dstl(spark, inputs, workdir, batch_api=True, encode_here=True)


def run_dstl_per_key(spark: Any, inputs: Path, workdir: Path) -> StoreResult:
    """The job on dstl with the per-key API."""
    return _run_dstl(spark, inputs, workdir, batch_api=False)


def _spark_query_result(key: str, engine: str, output: Any, checkpoint: Path) -> StoreResult:
    """Run ``output`` (a stateful DataFrame) to the end of the input; its per-batch state commit."""
    query = (
        output.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise query.exception()
    result = StoreResult(key, engine)
    for progress in query.recentProgress:
        operators = progress.stateOperators
        if not operators or progress.numInputRows == 0:
            continue
        result.commit_ms.append(float(sum(op.commitTimeMs for op in operators)))
        result.spark_phases.append(_spark_phases(progress))
        result.batch_ms.append(float(progress.batchDuration))
        result.batch_rows.append(progress.numInputRows)
        result.rows += progress.numInputRows
    result.state_bytes, result.state_disk_bytes = _dir_bytes(checkpoint / "state")
    return result


def dstl_phases(progress: Any) -> dict[str, float]:
    """dstl's phases of a batch: the driver's, and the slowest instance's task phases (``task ...``), ms."""
    return {**progress.phases_ms, **{f"task {k}": v for k, v in progress.task_phases_ms.items()}}


def _spark_phases(progress: Any) -> dict[str, float]:
    """Spark's own phases of a batch (``durationMs``), ms."""
    return {name: float(ms) for name, ms in (progress.durationMs or {}).items()}


def _use_rocksdb(spark: Any) -> None:
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")


def run_apply_in_pandas_with_state(spark: Any, inputs: Path, workdir: Path) -> StoreResult:
    """The job on ``applyInPandasWithState`` (HDFS-backed state store)."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    def count(key: Any, frames: Iterator[Any], state: Any) -> Iterator[Any]:
        rows = sum(len(f) for f in frames)
        previous = state.get[0] if state.exists else 0
        state.update((previous + rows,))
        yield _counts(key, range(rows), previous)

    spark.conf.set("spark.sql.streaming.stateStore.providerClass", HDFS)
    output = (
        file_source(spark, inputs)
        .groupBy("k")
        .applyInPandasWithState(count, "k string, n long", "n long", "update", GroupStateTimeout.NoTimeout)
    )
    return _spark_query_result(
        "applyInPandasWithState", "applyInPandasWithState (HDFS store)", output, workdir / "hdfs-checkpoint"
    )


def run_transform_with_state_rocksdb(spark: Any, inputs: Path, workdir: Path) -> StoreResult:
    """The job on ``transformWithStateInPandas`` (RocksDB store, changelog checkpointing)."""
    from pyspark.sql.streaming import StatefulProcessor

    class Count(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.count = handle.getValueState("n", "n long")

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            previous = self.count.get()[0] if self.count.exists() else 0
            total = sum(len(r) for r in rows)
            self.count.update((previous + total,))
            yield _counts(key, range(total), previous)

        def close(self) -> None:
            pass

    _use_rocksdb(spark)
    output = (
        file_source(spark, inputs)
        .groupBy("k")
        .transformWithStateInPandas(Count(), "k string, n long", "Update", "None")
    )
    return _spark_query_result(
        "transformWithStateInPandas",
        "transformWithStateInPandas (RocksDB, changelog)",
        output,
        workdir / "rocksdb-checkpoint",
    )


def run_transform_with_state_rows(spark: Any, inputs: Path, workdir: Path) -> StoreResult:
    """The job on PySpark's row-based ``transformWithState`` (4.1+; RocksDB store, changelog)."""
    from pyspark.sql import Row
    from pyspark.sql.streaming import StatefulProcessor

    class Count(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.count = handle.getValueState("n", "n long")

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            previous = self.count.get()[0] if self.count.exists() else 0
            total = previous + sum(1 for _ in rows)
            self.count.update((total,))
            yield Row(k=key[0], n=total)

        def close(self) -> None:
            pass

    _use_rocksdb(spark)
    output = (
        file_source(spark, inputs)
        .groupBy("k")
        .transformWithState(Count(), "k string, n long", "Update", "None")
    )
    return _spark_query_result(
        "transformWithState",
        "transformWithState, row-based (RocksDB, changelog)",
        output,
        workdir / "rows-checkpoint",
    )


def run_jvm_count(spark: Any, inputs: Path, workdir: Path) -> StoreResult:
    """The job as Spark's JVM aggregation: ``groupBy("k").count()`` (RocksDB store, changelog)."""
    _use_rocksdb(spark)
    output = file_source(spark, inputs).groupBy("k").count()
    return _spark_query_result(
        "jvm-count", "Spark JVM groupBy().count() (RocksDB, changelog)", output, workdir / "jvm-checkpoint"
    )


def _count_in_batch(batches: Iterator[Any]) -> Iterator[Any]:
    """The floor's per-partition work: one vectorized count per key of the partition, no state."""
    import pyarrow as pa

    table = pa.Table.from_batches(list(batches))
    if table.num_rows == 0:
        return
    counted = table.group_by("k").aggregate([("k", "count")]).rename_columns(["k", "n"])
    schema = pa.schema([("k", pa.string()), ("n", pa.int64())])  # as Spark declared the output
    yield from counted.cast(schema).to_batches()


def run_floor(spark: Any, inputs: Path, workdir: Path) -> StoreResult:
    """The floor: ``foreachBatch``, the same shuffle by key and one ``mapInArrow`` per partition, no state."""
    from pyspark.sql import functions as F

    def move(frame: Any, batch_id: int) -> None:
        shuffled = frame.repartition(F.col("k"))
        shuffled.mapInArrow(_count_in_batch, "k string, n long").write.format("noop").mode("overwrite").save()

    query = (
        file_source(spark, inputs)
        .writeStream.foreachBatch(move)
        .option("checkpointLocation", str(workdir / "floor-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise query.exception()
    result = StoreResult("floor", "floor: foreachBatch + shuffle by key + mapInArrow, no state")
    for progress in query.recentProgress:
        if progress.numInputRows == 0:
            continue
        result.commit_ms.append(0.0)
        result.spark_phases.append(_spark_phases(progress))
        result.batch_ms.append(float(progress.batchDuration))
        result.batch_rows.append(progress.numInputRows)
        result.rows += progress.numInputRows
    return result


ENGINES = {
    "dstl-batch": run_dstl_batch,
    "dstl-batch-encode-here": run_dstl_batch_encode_here,
    "dstl-per-key": run_dstl_per_key,
    "floor": run_floor,
    "jvm-count": run_jvm_count,
    "transformWithState": run_transform_with_state_rows,
    "applyInPandasWithState": run_apply_in_pandas_with_state,
    "transformWithStateInPandas": run_transform_with_state_rocksdb,
}

#: What a user would pick (the default): the rest are variants of dstl's for a comparison.
USER_ENGINES = [name for name in ENGINES if name != "dstl-batch-encode-here"]


def compare(
    spark: Any,
    workdir: Path,
    batches: int,
    rows: int,
    engines: list[str] | None = None,
    state_keys: int = 0,
    key_shape: str = "sequential",
) -> list[StoreResult]:
    """Run the job on every engine (or those named) over the same input files.

    Every engine first runs a short throwaway job (two batches of 500 rows), so no
    engine pays the JVM's warm-up for the others. With ``state_keys``, batches load
    that many keys first; they are left out of the figures.
    """
    names = engines or USER_ENGINES
    warm_up = workdir / "warm-up"
    write_inputs(warm_up / "input", 2, 500)
    for name in names:
        ENGINES[name](spark, warm_up / "input", warm_up / name)
    inputs = workdir / "input"
    load = write_inputs(inputs, batches, rows, state_keys=state_keys, key_shape=key_shape)
    results = [ENGINES[name](spark, inputs, workdir) for name in names]
    for result in results:
        result.warm_up = max(1, load)
    return results


def phase_rows(result: StoreResult) -> list[list[str]]:
    """Median ms per phase over the steady batches (no warm-up): driver, then the slowest task."""
    batches = result.steady(result.phases)
    names = list(dict.fromkeys(name for phases in batches for name in phases))
    return [[name, f"{statistics.median(p.get(name, 0.0) for p in batches):.1f}"] for name in names]


def main(argv: list[str] | None = None) -> int:
    """Run the Spark job on the engines; print the table and dstl's per-phase breakdown."""
    import argparse
    import json
    import tempfile

    from rich.console import Console
    from rich.progress import track

    from bench.dstl_bench import _table
    from dstl.backend.spark.demo.run import spark_session

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--engines", default=",".join(USER_ENGINES))
    parser.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    parser.add_argument("--runs", type=int, default=1, help="repeat the comparison; report median and spread")
    parser.add_argument(
        "--state-keys", type=int, default=0, help="load this many keys first (left out), then mostly updates"
    )
    parser.add_argument(
        "--keys",
        choices=sorted(KEY_SHAPES),
        default="sequential",
        help="keys numbered, or scattered as user ids",
    )
    args = parser.parse_args(argv)
    console = Console(width=160)  # the table stays readable when piped to a file
    spark = spark_session("dstl-spark-stores")
    spark.sparkContext.setLogLevel("ERROR")
    # every batch's progress, loading ones included (Spark keeps the last 100 by default)
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")
    runs: list[list[StoreResult]] = []
    try:
        for _ in track(range(args.runs), description="runs", console=console, disable=args.runs == 1):
            with tempfile.TemporaryDirectory(prefix="dstl-stores-") as tmp:
                engines = args.engines.split(",")
                runs.append(
                    compare(spark, Path(tmp), args.batches, args.rows, engines, args.state_keys, args.keys)
                )
    finally:
        spark.stop()
    results = runs[-1]
    title = (
        f"{args.batches} batches of {args.rows:,} rows"
        + (f" over {args.state_keys:,} keys of state" if args.state_keys else "")
        + (f", {args.keys} keys" if args.keys != "sequential" else "")
    )
    console.print(_table(title + ": the last run", SUMMARY_COLUMNS, summary_rows(results)))
    for line in speedups(results):
        console.print(line)
    if len(runs) > 1:
        console.print(
            _table(f"{title}: median (min-max) of {len(runs)} runs", SPREAD_COLUMNS, spread_rows(runs))
        )
        for line in goal_spread(runs):
            console.print(line)
    for r in results:
        if r.phases:
            console.print(_table(f"{r.key}: median ms per phase", ["phase", "ms"], phase_rows(r)))
    if args.json:
        figures = {
            "settings": {
                "batches": args.batches,
                "rows": args.rows,
                "state_keys": args.state_keys,
                "keys": args.keys,
            },
            "spark": {r.key: r.figures() for r in results},
            "runs": [{r.key: r.figures() for r in run} for run in runs],
        }
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


SPREAD_COLUMNS = ["engine", "batch p50 ms", "records/s"]


def _spread(values: list[float]) -> str:
    """``median (min-max)`` of ``values``."""
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def spread_rows(runs: list[list[StoreResult]]) -> list[list[str]]:
    """Per engine over the runs: batch p50 and records/s, each as median (min-max)."""
    by_key: dict[str, list[StoreResult]] = {}
    for results in runs:
        for result in results:
            by_key.setdefault(result.key, []).append(result)
    return [
        [
            results[0].engine,
            _spread([r.figures()["batch_p50_ms"] for r in results]),
            _spread([r.records_per_s for r in results]),
        ]
        for results in by_key.values()
    ]


def goal_spread(runs: list[list[StoreResult]]) -> list[str]:
    """Each goal's ratio over the runs, median (min-max), with the verdict of the median."""
    ratios: dict[tuple[str, str, float, bool], list[float]] = {}
    for results in runs:
        for goal, ratio in goal_ratios(results):
            ratios.setdefault(goal, []).append(ratio)
    lines = []
    for (engine, baseline, target, bounds_time), values in ratios.items():
        middle = statistics.median(values)
        met = middle <= target if bounds_time else middle >= target
        what = "batch time" if bounds_time else "records/s"
        lines.append(
            f"{engine} {what} / {baseline}'s: {middle:.2f}x ({min(values):.2f}-{max(values):.2f}) over "
            f"{len(values)} runs; target {'at most ' if bounds_time else ''}{target:g}x: "
            f"{'MET' if met else 'NOT MET'}."
        )
    return lines


SUMMARY_COLUMNS = [
    "engine",
    "commit p50 ms",
    "commit p99 ms",
    "batch p50 ms",
    "batch p99 ms",
    "records/s",
    "state files MB",
    "state disk MB",
]


def summary_rows(results: list[StoreResult]) -> list[list[str]]:
    """Table rows of :data:`SUMMARY_COLUMNS` (the first batch, JVM warm-up, left out of the percentiles)."""
    rows = []
    for r in results:
        f = r.figures()
        rows.append(
            [
                r.engine,
                f"{f['commit_p50_ms']:.1f}",
                f"{f['commit_p99_ms']:.1f}",
                f"{f['batch_p50_ms']:.0f}",
                f"{f['batch_p99_ms']:.0f}",
                f"{f['records_per_s']:,.0f}",
                f"{f['state_bytes'] / 1e6:.2f}",
                f"{f['state_disk_bytes'] / 1e6:.2f}",
            ]
        )
    return rows


#: The speed goals, each against a baseline measured in the same run: (dstl engine, baseline,
#: target, whether the target bounds batch time from above rather than records/s from below).
GOALS: tuple[tuple[str, str, float, bool], ...] = (
    ("dstl-batch", "floor", 1.3, True),  # state costs at most 30% over moving the rows
    ("dstl-batch", "jvm-count", 1.0, False),  # as fast as Spark's own JVM aggregation
    ("dstl-batch", "transformWithState", 5.0, False),  # PySpark's newest (row-based) API
    ("dstl-per-key", "transformWithState", 2.0, False),
    ("dstl-batch", "pandas-apis", 5.0, False),  # the better of Spark's pandas APIs (the last round's)
    ("dstl-per-key", "pandas-apis", 2.0, False),
)
PANDAS_APIS = ("applyInPandasWithState", "transformWithStateInPandas")


def _goal_engines(results: list[StoreResult]) -> Iterator[tuple[tuple[str, str, float, bool], Any, Any]]:
    """``(goal, dstl's result, the baseline's)`` of each goal whose engines both ran."""
    by_key = {r.key: r for r in results}
    pandas = [by_key[key] for key in PANDAS_APIS if key in by_key]
    if pandas:
        by_key["pandas-apis"] = max(pandas, key=lambda r: r.records_per_s)
    for goal in GOALS:
        ours, theirs = by_key.get(goal[0]), by_key.get(goal[1])
        if ours is None or theirs is None:
            continue
        baseline = theirs.figures()["batch_p50_ms"] if goal[3] else theirs.records_per_s
        if baseline:
            yield goal, ours, theirs


def goal_ratios(results: list[StoreResult]) -> list[tuple[tuple[str, str, float, bool], float]]:
    """Each goal's ratio in one run: dstl's batch time over the baseline's, or its records/s over theirs."""
    return [
        (
            goal,
            ours.figures()["batch_p50_ms"] / theirs.figures()["batch_p50_ms"]
            if goal[3]
            else ours.records_per_s / theirs.records_per_s,
        )
        for goal, ours, theirs in _goal_engines(results)
    ]


def speedups(results: list[StoreResult]) -> list[str]:
    """A verdict per goal whose engines both ran: dstl's ratio to the baseline and the target."""
    lines = []
    for ((engine, _, target, bounds_time), ratio), (_, ours, theirs) in zip(
        goal_ratios(results), _goal_engines(results), strict=True
    ):
        if bounds_time:
            ours_ms, theirs_ms = ours.figures()["batch_p50_ms"], theirs.figures()["batch_p50_ms"]
            verdict = "MET" if ratio <= target else "NOT MET"
            lines.append(
                f"{engine}: batch p50 {ours_ms:,.0f} ms = {ratio:.2f}x {theirs.key}'s ({theirs_ms:,.0f} ms); "
                f"target at most {target:g}x: {verdict}."
            )
            continue
        verdict = "MET" if ratio >= target else "NOT MET"
        lines.append(
            f"{engine}: {ours.records_per_s:,.0f} records/s = {ratio:.2f}x {theirs.key}'s "
            f"({theirs.records_per_s:,.0f}); target {target:g}x: {verdict}."
        )
    return lines


def materialization_cost(result: StoreResult) -> str | None:
    """What materializing costs a batch: p99 of the batches that start a snapshot against the others' p50.

    The batch after each materializing one is reported too (the snapshot is written in
    the background while it runs). The first batch (JVM warm-up) is left out.
    """
    from bench.dstl_bench import percentile

    if len(result.materializing) != len(result.batch_ms):
        return None  # not a dstl run: Spark's stores snapshot in their own maintenance
    flags, durations = result.materializing[result.warm_up :], result.batch_ms[result.warm_up :]
    materializing = [d for d, m in zip(durations, flags, strict=True) if m]
    others = [d for d, m in zip(durations, flags, strict=True) if not m]
    if not materializing or not others:
        return None
    after = [durations[i + 1] for i, m in enumerate(flags[:-1]) if m and not flags[i + 1]]
    base = statistics.median(others)
    line = (
        f"{result.engine}: {len(materializing)} of {len(durations)} batches materialized; their batch p99 "
        f"{percentile(materializing, 99):.0f} ms against {base:.0f} ms p50 of the others "
        f"({percentile(materializing, 99) / base:.2f}x)"
    )
    if after:
        next_p50 = statistics.median(after)
        line += f"; the batch after one: p50 {next_p50:.0f} ms ({next_p50 / base:.2f}x)"
    return line + "."


if __name__ == "__main__":
    raise SystemExit(main())
