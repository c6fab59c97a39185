"""Sinks for the output of a stateful query: written once per batch, idempotent on replay."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["ParquetBatchSink"]


class ParquetBatchSink:
    """Parquet under ``<path>/batch_id=<id>``; a replayed batch overwrites its own directory.

    Read it back with ``spark.read.parquet(path)`` (``batch_id`` becomes a column).
    """

    def __init__(self, path: str) -> None:
        self.path = path.rstrip("/")

    def __call__(self, output: DataFrame, batch_id: int) -> None:
        """Write the batch's rows."""
        output.write.mode("overwrite").parquet(f"{self.path}/batch_id={batch_id}")
