"""Sinks for the output of a stateful query: written once per batch, idempotent on replay."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["DirectoryPerBatchSink", "ParquetBatchSink"]


class DirectoryPerBatchSink:
    """Files of ``fmt`` under ``<path>/batch_id=<id>``; a replayed batch overwrites its own directory.

    Read them back with ``spark.read.format(fmt).load(path)`` (``batch_id`` becomes a column).
    """

    def __init__(self, fmt: str, path: str, options: Mapping[str, str] | None = None) -> None:
        self.fmt = fmt
        self.path = path.rstrip("/")
        self.options = dict(options or {})

    def __call__(self, output: DataFrame, batch_id: int) -> None:
        """Write the batch's rows."""
        target = f"{self.path}/batch_id={batch_id}"
        output.write.format(self.fmt).options(**self.options).mode("overwrite").save(target)


class ParquetBatchSink(DirectoryPerBatchSink):
    """Parquet under ``<path>/batch_id=<id>``; read it back with ``spark.read.parquet(path)``."""

    def __init__(self, path: str) -> None:
        super().__init__("parquet", path)
