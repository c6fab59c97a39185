"""Run one of Spark's ``transformWithStateInPandas`` scenarios on Spark's engine or on dstl's.

The query is written once, as a PySpark user writes it for Spark; ``engine`` only
swaps ``df.groupBy(keys).transformWithStateInPandas(...)`` for dstl's
``stateful_stream(df, key_columns=keys, ...)``. Everything after it (per-row steps,
``writeStream``, ``processAllAvailable``, ``lastProgress``) is the same code.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENGINES = ("spark", "dstl")
APIS = ("pandas", "row")


@dataclass(frozen=True)
class Flavour:
    """Which engine runs the stateful step, and which of Spark's APIs the processor is written for."""

    engine: str
    api: str

    @property
    def row_based(self) -> bool:
        return self.api == "row"

    def __str__(self) -> str:
        return f"{self.engine}-{self.api}"


FLAVOURS = tuple(Flavour(engine, api) for api in APIS for engine in ENGINES)

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

#: the session settings of Spark's suites (their ``conf()``)
SUITE_CONF = {
    "spark.sql.shuffle.partitions": "5",
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
    "spark.sql.execution.arrow.transformWithStateInPandas.maxRecordsPerBatch": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
}


@contextmanager
def session_conf(spark: Any, settings: dict[str, str]) -> Iterator[None]:
    """``settings`` on the session for the block, the earlier values back after it."""
    before = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def write_lines(directory: Path, name: str, lines: list[str], order: int) -> None:
    """A text file of the stream; ``order`` fixes its place (the file source goes by modification time)."""
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".{name}.tmp"
    temporary.write_text("".join(f"{line}\n" for line in lines))
    os.utime(temporary, (1_700_000_000 + order, 1_700_000_000 + order))
    temporary.rename(directory / name)


def write_pairs(directory: Path, name: str, first: list[Any], second: list[Any], order: int) -> None:
    """Lines ``"<first>, <second>"``, as the suites' input files."""
    write_lines(directory, name, [f"{a}, {b}" for a, b in zip(first, second, strict=True)], order)


#: the suites' input files: name -> (ids, temperatures)
RESOURCES = {
    1: ("text-test1.txt", [0, 0, 1, 1], [123, 46, 146, 346]),
    2: ("text-test2.txt", [0, 0, 0, 1, 1], [123, 223, 323, 246, 6]),
    3: ("text-test3.txt", [0, 1], [123, 6]),
    4: ("text-test4.txt", [0, 1], [123, 6]),
    5: ("text-test5.txt", [0, 1], [123, 6]),
}


def write_resource(directory: Path, number: int, order: int | None = None) -> None:
    name, ids, temperatures = RESOURCES[number]
    write_pairs(directory, name, ids, temperatures, number if order is None else order)


def text_stream(spark: Any, directory: Path, columns: tuple[tuple[str, str], ...] | None = None) -> Any:
    """The suites' stream: one file per batch, each line split on commas into typed columns."""
    from pyspark.sql.functions import split

    columns = columns or (("id", "string"), ("temperature", "int"))
    lines = spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(str(directory))
    parts = split(lines["value"], ",")
    return lines.select(*(parts.getItem(i).alias(name).cast(kind) for i, (name, kind) in enumerate(columns)))


def stateful(
    flavour: Flavour,
    frame: Any,
    keys: list[str],
    processor: Any,
    output_schema: Any,
    *,
    time_mode: str = "None",
    initial_state: Any = None,
    output_event_time_column: str | None = None,
    output_mode: str = "Update",
    tmp_path: Path | None = None,
) -> Any:
    """The stateful step of ``flavour``: Spark's operator, or dstl's stream with the same arguments."""
    if flavour.engine == "spark":
        grouped_initial = None if initial_state is None else initial_state.groupBy(*keys)
        named = {} if output_event_time_column is None else {"eventTimeColumnName": output_event_time_column}
        grouped = frame.groupBy(*keys)
        operator = grouped.transformWithState if flavour.row_based else grouped.transformWithStateInPandas
        return operator(
            statefulProcessor=processor,
            outputStructType=output_schema,
            outputMode=output_mode,
            timeMode=time_mode,
            initialState=grouped_initial,
            **named,
        )
    from dstl.backend.spark import stateful_stream

    assert tmp_path is not None
    extra: dict[str, Any] = {}
    if output_event_time_column is not None:
        extra["output_event_time_column"] = output_event_time_column
    return stateful_stream(
        frame,
        key_columns=keys,
        processor=processor,
        output_schema=output_schema,
        time_mode=time_mode,
        initial_state=initial_state,
        processor_api=flavour.api,
        config={"dstl.storage": "local", "dstl.spark.working-dir": str(tmp_path / "working")},
        **extra,
    )


Collected = dict[int, list[Any]]


def collect_into(
    into: Collected, check: Callable[[Any, int], None] | None = None
) -> Callable[[Any, int], None]:
    """A ``foreachBatch`` function keeping each batch's rows (and running ``check`` on the frame)."""

    def sink(frame: Any, batch_id: int) -> None:
        into[batch_id] = frame.collect()
        if check is not None:
            check(frame, batch_id)

    return sink


def run_to_end(writer: Any) -> Any:
    """Start, process all available input, stop (the suites' query life); a failed query fails the test."""
    query = writer.start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    query.awaitTermination(10)
    error = query.exception()
    assert error is None, error
    return query


def run_collecting(
    frame: Any, checkpoint: Path, into: Collected, *, query_name: str | None = None, check: Any = None
) -> Any:
    """The suites' usual query: ``frame`` in update mode into ``foreachBatch``, batches kept in ``into``."""
    writer = frame.writeStream if query_name is None else frame.writeStream.queryName(query_name)
    writer = writer.option("checkpointLocation", str(checkpoint)).foreachBatch(collect_into(into, check))
    return run_to_end(writer.outputMode("update"))


def rows_of(collected: Collected) -> dict[int, set[Any]]:
    return {batch: set(rows) for batch, rows in sorted(collected.items())}


def _working(checkpoint: Path) -> dict[str, str]:
    """The config ``stateful`` gives dstl's step (its working directory beside the checkpoint)."""
    return {"dstl.storage": "local", "dstl.spark.working-dir": str(checkpoint.parent / "working")}


def read_state_variable(
    session: Any,
    flavour: Flavour,
    checkpoint: Path,
    name: str,
    *,
    flatten: bool = True,
    change_start: int | None = None,
    partition: int | None = None,
) -> Any:
    """One state of a checkpoint as Spark's ``statestore`` reader gives it (dstl: ``read_state_variable``).

    ``change_start``: its change feed from that batch; ``partition``: one partition's state.
    """
    if flavour.engine == "spark":
        reader = (
            session.read.format("statestore")
            .option("path", str(checkpoint))
            .option("stateVarName", name)
            .option("flattenCollectionTypes", flatten)
        )
        if change_start is not None:
            reader = reader.option("readChangeFeed", True).option("changeStartBatchId", change_start)
        if partition is not None:
            reader = reader.option("snapshotPartitionId", partition).option("snapshotStartBatchId", 0)
        return reader.load()
    from dstl.backend.spark import read_state_variable as read

    return read(
        session,
        str(checkpoint),
        name,
        flatten_collection_types=flatten,
        read_change_feed=change_start is not None,
        change_start_batch_id=change_start,
        partition_id=partition,
        config=_working(checkpoint),
    )


def state_metadata(session: Any, flavour: Flavour, checkpoint: Path) -> Any:
    """Spark's ``state-metadata`` reader of a checkpoint (dstl: ``read_state_metadata``)."""
    if flavour.engine == "spark":
        return session.read.format("state-metadata").load(str(checkpoint))
    from dstl.backend.spark import read_state_metadata

    return read_state_metadata(session, str(checkpoint), config=_working(checkpoint))
