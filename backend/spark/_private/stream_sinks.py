"""``writeStream`` formats as per-batch writers: what a stateful stream's batch is written with.

A dstl stateful step runs in ``foreachBatch``, so Spark's streaming sinks cannot
take its output directly; each format here writes one batch the way its
streaming sink would, keyed by the batch id so a replayed batch does not write
twice where the format allows it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dstl.spi import ConfigError

from ..sinks import DirectoryPerBatchSink
from .sessions import is_connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["OUTPUT_MODES", "batch_writer"]

#: Spark's output modes for transformWithState: each row the processor returns is emitted once.
OUTPUT_MODES = ("append", "update")
#: Formats written through ``DataFrame.write``, their files published into the path (replays replace them).
_FILE_FORMATS = ("parquet", "json", "csv", "orc", "text", "avro")

BatchWriter = Callable[["DataFrame", int], None]


def batch_writer(
    fmt: str, options: Mapping[str, str], path: str | None, query_name: str | None, session: Any
) -> BatchWriter:
    """The function that writes one batch of a stream started with ``writeStream.format(fmt)``.

    :param session: the caller's session (where the memory sink's table is queried).
    :raises ConfigError: for what the format needs and was not given (a path, a query name).
    """
    fmt = fmt.lower()
    options = dict(options)
    if fmt == "console":
        return ConsoleWriter(
            int(options.get("numRows", 20)), options.get("truncate", "true").lower() == "true"
        )
    if fmt == "memory":
        if not query_name:
            msg = "format('memory') needs a queryName: the table the rows are queried from"
            raise ConfigError(msg)
        if is_connect(session):
            msg = (
                "format('memory') keeps the rows in the driver: on Spark Connect use foreachBatch or a table"
            )
            raise ConfigError(msg)
        return MemoryWriter(query_name, session)
    if fmt == "noop":
        return lambda frame, batch_id: frame.write.format("noop").mode("overwrite").save()
    if fmt == "kafka":  # at least once on a replay, as Spark's Kafka sink
        return lambda frame, batch_id: frame.write.format("kafka").options(**options).save()
    if path is None:
        path = options.pop("path", None)
    if path is None:
        msg = f"format({fmt!r}) needs a path: start(path) or option('path', ...)"
        raise ConfigError(msg)
    if fmt == "delta":  # Delta's idempotent writes: one table version per (application, batch)
        return DeltaWriter(path, options)
    if fmt in _FILE_FORMATS:
        return PublishedFilesWriter(fmt, path, options)
    msg = (
        f"format({fmt!r}) is not one dstl writes batch by batch: use console, memory, noop, kafka, delta, "
        f"{', '.join(_FILE_FORMATS)}, or foreachBatch(fn) to write each batch yourself"
    )
    raise ConfigError(msg)


class PublishedFilesWriter:
    """Spark's file sink layout: every batch's files directly under ``path``, no extra column.

    Read back with ``spark.read.format(fmt).load(path)``.

    A batch is written whole to a hidden staging directory (``_dstl_staging``, which
    Spark's readers skip), then its files are moved into ``path`` named by the batch
    (``part-b<batch>-...``); a replayed batch first removes the files it published
    before, so each batch's rows are there once.
    """

    def __init__(self, fmt: str, path: str, options: Mapping[str, str]) -> None:
        self.staging = DirectoryPerBatchSink(fmt, f"{path.rstrip('/')}/_dstl_staging", options)
        self.path = path

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        from ...filesystems import checkpoint_fs

        self.staging(frame, batch_id)
        fs, root = checkpoint_fs(self.path)
        staged = f"{root}/_dstl_staging/batch_id={batch_id}"
        prefix = f"part-b{batch_id:012d}-"
        for old in fs.glob(f"{root}/{prefix}*"):
            fs.rm(old)
        for written in fs.ls(staged, detail=False):
            name = written.rstrip("/").rsplit("/", 1)[-1]
            if not name.startswith(("_", ".")):  # Spark's markers (_SUCCESS) and checksums stay behind
                fs.mv(written, f"{root}/{prefix}{name}")
        fs.rm(staged, recursive=True)


class ConsoleWriter:
    """Prints each batch as Spark's console sink does."""

    def __init__(self, num_rows: int, truncate: bool) -> None:
        self.num_rows = num_rows
        self.truncate = truncate

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        rule = "-" * 43
        print(f"{rule}\nBatch: {batch_id}\n{rule}")
        frame.show(self.num_rows, self.truncate)


class MemoryWriter:
    """Spark's memory sink: every batch's rows, queryable as the temporary view ``name`` (tests, demos).

    A replayed batch replaces its own rows. The rows live in the driver, as Spark's do.
    """

    def __init__(self, name: str, session: Any) -> None:
        self.name = name
        self._session = session  # the caller's: a batch's own session is a clone whose views it cannot see
        self._lock = threading.Lock()
        self._batches: dict[int, list[Any]] = {}

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        rows = frame.collect()
        with self._lock:
            self._batches[batch_id] = rows
            everything = [row for batch in sorted(self._batches) for row in self._batches[batch]]
        self._session.createDataFrame(everything, frame.schema).createOrReplaceTempView(self.name)


class DeltaWriter:
    """Appends to a Delta table once per batch (``txnAppId``/``txnVersion``: a replay is skipped)."""

    def __init__(self, path: str, options: Mapping[str, str]) -> None:
        self.path = path
        self.options = dict(options)

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        writer = frame.write.format("delta").options(**self.options)
        writer = writer.option("txnAppId", self.options.get("txnAppId", self.path)).option(
            "txnVersion", batch_id
        )
        writer.mode("append").save(self.path)
