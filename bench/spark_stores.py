"""The same stateful Spark job on dstl and on Spark's built-in state stores, in one run.

The job keeps a running count per key (a ValueState; most keys new, the rest
updated), ``rows`` rows per micro-batch, processed key by key (pandas) on:

- ``dstl``: :func:`dstl.backend.spark.transform_with_state`, local storage;
- ``applyInPandasWithState``: Spark's HDFS-backed state store;
- ``transformWithStateInPandas``: Spark's RocksDB state store with changelog
  checkpointing (``spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled``).

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


@dataclass
class StoreResult:
    """Per-batch figures of one engine."""

    engine: str
    commit_ms: list[float] = field(default_factory=list)
    batch_ms: list[float] = field(default_factory=list)
    rows: int = 0
    state_bytes: int = 0  # what the checkpoint holds for the state at the end, on disk
    materializing: list[bool] = field(default_factory=list)  # per batch (dstl): it started a snapshot

    @property
    def records_per_s(self) -> float:
        """Rows over the summed batch durations."""
        return self.rows / (sum(self.batch_ms) / 1000) if self.batch_ms else 0.0


def write_inputs(directory: Path, batches: int, rows: int, new_share: float = 0.8) -> None:
    """``batches`` files of ``rows`` keys each, mostly new keys, in processing order."""
    rng = random.Random(3)
    directory.mkdir(parents=True, exist_ok=True)
    next_key = 0
    for index in range(batches):
        keys = []
        for _ in range(rows):
            if next_key == 0 or rng.random() < new_share:
                keys.append(next_key)
                next_key += 1
            else:
                keys.append(rng.randrange(next_key))
        path = directory / f".f{index:05d}.tmp"
        path.write_text("".join(json.dumps({"k": f"k{k}"}) + "\n" for k in keys))
        os.utime(path, (FILE_TIME + index, FILE_TIME + index))
        path.replace(directory / f"f{index:05d}.json")


def _dir_bytes(*directories: Path) -> int:
    """Bytes of the files under ``directories``."""
    return sum(f.stat().st_size for d in directories for f in d.rglob("*") if f.is_file())


def _source(spark: Any, inputs: Path) -> Any:  # noqa: ANN401
    return spark.readStream.schema("k string").option("maxFilesPerTrigger", 1).json(str(inputs))


def _counts(key: Any, rows: Any, previous: int) -> Any:  # noqa: ANN401
    import pandas as pd

    return pd.DataFrame({"k": [key[0] if isinstance(key, tuple) else key], "n": [previous + len(rows)]})


def run_dstl(spark: Any, inputs: Path, workdir: Path) -> StoreResult:  # noqa: ANN401
    """The job on dstl's changelog backend (local storage, LMDB working copies)."""
    from dstl.backend.spark import StatefulProcessor, transform_with_state

    class Count(StatefulProcessor):
        def init(self, context: Any) -> None:  # noqa: ANN401
            self.count = context.get_value_state("n")

        def handle_input_rows(self, key: Any, rows: Any) -> Any:  # noqa: ANN401
            out = _counts(key, rows, self.count.value() or 0)
            self.count.update(int(out["n"].iloc[0]))
            return out

    query = transform_with_state(
        _source(spark, inputs),
        key_columns=["k"],
        processor=Count,
        output_schema="k string, n long",
        sink=lambda frame, batch_id: frame.write.format("noop").mode("overwrite").save(),
        checkpoint_location=str(workdir / "dstl-checkpoint"),
        config={
            "dstl.storage": "local",
            "dstl.spark.working-dir": str(workdir / "dstl-working"),
            "state.changelog.materialization.interval": "10s",
        },
        trigger={"availableNow": True},
        job_id="stores",
    )
    query.await_termination()
    if query.exception() is not None:
        raise query.exception()
    result = StoreResult("dstl (changelog, local)")
    durations = [p.batchDuration for p in query.query.recentProgress if p.numInputRows > 0]
    for batch, duration in zip(query.progress, durations, strict=True):
        result.commit_ms.append(batch.checkpoint_ms)
        result.batch_ms.append(float(duration))  # Spark's own trigger duration, as for the other engines
        result.materializing.append(bool(batch.materialized))
        result.rows += batch.rows
    checkpoint = workdir / "dstl-checkpoint"
    result.state_bytes = _dir_bytes(checkpoint / "dstl-state", checkpoint / "dstl-changelog")
    return result


def _spark_query_result(engine: str, output: Any, checkpoint: Path) -> StoreResult:  # noqa: ANN401
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
    result = StoreResult(engine)
    for progress in query.recentProgress:
        operators = progress.stateOperators
        if not operators or progress.numInputRows == 0:
            continue
        result.commit_ms.append(float(sum(op.commitTimeMs for op in operators)))
        result.batch_ms.append(float(progress.batchDuration))
        result.rows += progress.numInputRows
    result.state_bytes = _dir_bytes(checkpoint / "state")
    return result


def run_apply_in_pandas_with_state(spark: Any, inputs: Path, workdir: Path) -> StoreResult:  # noqa: ANN401
    """The job on ``applyInPandasWithState`` (HDFS-backed state store)."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    def count(key: Any, frames: Iterator[Any], state: Any) -> Iterator[Any]:  # noqa: ANN401
        rows = sum(len(f) for f in frames)
        previous = state.get[0] if state.exists else 0
        state.update((previous + rows,))
        yield _counts(key, range(rows), previous)

    spark.conf.set("spark.sql.streaming.stateStore.providerClass", HDFS)
    output = (
        _source(spark, inputs)
        .groupBy("k")
        .applyInPandasWithState(count, "k string, n long", "n long", "update", GroupStateTimeout.NoTimeout)
    )
    return _spark_query_result("applyInPandasWithState (HDFS store)", output, workdir / "hdfs-checkpoint")


def run_transform_with_state_rocksdb(spark: Any, inputs: Path, workdir: Path) -> StoreResult:  # noqa: ANN401
    """The job on ``transformWithStateInPandas`` (RocksDB store, changelog checkpointing)."""
    from pyspark.sql.streaming import StatefulProcessor

    class Count(StatefulProcessor):
        def init(self, handle: Any) -> None:  # noqa: ANN401
            self.count = handle.getValueState("n", "n long")

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:  # noqa: ANN401, N802, N803
            previous = self.count.get()[0] if self.count.exists() else 0
            total = sum(len(r) for r in rows)
            self.count.update((previous + total,))
            yield _counts(key, range(total), previous)

        def close(self) -> None:
            pass

    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    output = (
        _source(spark, inputs)
        .groupBy("k")
        .transformWithStateInPandas(Count(), "k string, n long", "Update", "None")
    )
    return _spark_query_result(
        "transformWithStateInPandas (RocksDB, changelog)", output, workdir / "rocksdb-checkpoint"
    )


ENGINES = (run_dstl, run_apply_in_pandas_with_state, run_transform_with_state_rocksdb)


def compare(spark: Any, workdir: Path, batches: int, rows: int) -> list[StoreResult]:  # noqa: ANN401
    """Run the job on every engine over the same input files."""
    inputs = workdir / "input"
    write_inputs(inputs, batches, rows)
    results = []
    for engine in ENGINES:
        results.append(engine(spark, inputs, workdir))
    return results


def summary_rows(results: list[StoreResult]) -> list[list[str]]:
    """Table rows: commit p50/p99, batch p50, records/s, state on disk (the first batch, JVM warm-up, is
    left out of the commit and batch figures)."""
    from bench.dstl_bench import percentile

    rows = []
    for r in results:
        commits, batches = r.commit_ms[1:] or r.commit_ms, r.batch_ms[1:] or r.batch_ms
        rows.append(
            [
                r.engine,
                f"{statistics.median(commits):.1f}",
                f"{percentile(commits, 99):.1f}",
                f"{statistics.median(batches):.0f}",
                f"{r.records_per_s:,.0f}",
                f"{r.state_bytes / 1e6:.2f}",
            ]
        )
    return rows


def materialization_cost(result: StoreResult) -> str | None:
    """What materializing costs a batch: p99 of the batches that start a snapshot against the others' p50.

    The batch after each materializing one is reported too (the snapshot is written in
    the background while it runs). The first batch (JVM warm-up) is left out.
    """
    from bench.dstl_bench import percentile

    flags, durations = result.materializing[1:], result.batch_ms[1:]
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
