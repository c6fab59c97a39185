"""Read a query's state and its change feed as DataFrames, outside the query (Spark's ``statestore``).

.. code-block:: python

    read_state(spark, "/data/chk").where("state = 'total'").show()
    read_changes(spark, "/data/chk", from_batch=10, to_batch=12).show()

Both are read only: nothing of the query's state or logs is written, and a
running query can be read. Keys and values come as JSON text (a key of several
columns is a JSON array), of every state; :mod:`.state_variables` reads a PySpark
processor's declared states in the typed columns of Spark's own readers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from dstl.spi import ChangelogHandle

from ..options import BACKEND_MAX_PARALLELISM
from ..tools import describe_change, handle_changes, json_safe
from ._private.checkpoint_reading import InstanceEntries, logged_handles, opened, retained
from .placement import instance_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


__all__ = ["CHANGES_SCHEMA", "STATE_SCHEMA", "read_changes", "read_state"]

STATE_SCHEMA = "batch_id long, instance string, key string, state string, kind string, value string"
CHANGES_SCHEMA = (
    "batch_id long, instance string, sqn long, key_group int, op string, state string, key string, "
    "value string"
)


def read_state(
    spark: SparkSession,
    checkpoint_location: str,
    batch_id: int | None = None,
    *,
    config: Mapping[str, Any] | None = None,
    job_id: str | None = None,
    internal: bool = False,
    allow_pickle: bool = False,
) -> DataFrame:
    """Every key's state at checkpoint ``batch_id`` (default: the newest): one row per key and state.

    Each operator instance is restored in a task of its own (into a temporary LMDB
    file on the executor), so reading costs a restore of the state, not the
    driver's memory. ``internal`` adds dstl's own states (timers).

    Values of states stored with pickle show their size only (``{"bytes": n}``):
    unpickling runs code chosen by whoever wrote the checkpoint. ``allow_pickle=True``
    decodes them, and so trusts the checkpoint's author with the executors.

    :raises InvalidHandleError: when the checkpoint is not retained.
    """
    location, documents, cfg = opened(spark, checkpoint_location, config, job_id)
    chosen = documents[-1] if batch_id is None else retained(documents, batch_id)
    work = [(name, snapshot.to_json()) for name, snapshot in sorted(chosen.snapshots.items())]
    read = _state_reader(
        cfg.raw(),
        chosen.checkpoint_id,
        cfg.get(BACKEND_MAX_PARALLELISM),
        location.url,  # where the documents were found: a Spark location or a plain state directory
        location.job,
        internal=internal,
        allow_pickle=allow_pickle,
    )
    rows = spark.sparkContext.parallelize(work, max(len(work), 1)).mapPartitions(read)
    return spark.createDataFrame(rows, STATE_SCHEMA)


def read_changes(
    spark: SparkSession,
    checkpoint_location: str,
    from_batch: int,
    to_batch: int | None = None,
    *,
    config: Mapping[str, Any] | None = None,
    job_id: str | None = None,
) -> DataFrame:
    """The change feed: every change record of batches ``from_batch`` to ``to_batch`` (inclusive).

    Only batches whose logs the retained checkpoints still reference can be read
    (the log before the last materialization is truncated). Values of states
    stored with pickle show their size only (never unpickled).

    :raises InvalidHandleError: when a batch in the range has no retained log.
    """
    location, documents, cfg = opened(spark, checkpoint_location, config, job_id)
    handles = logged_handles(documents, from_batch, to_batch, checkpoint_location)
    work = [handle.to_json() for handle in handles]
    rows = spark.sparkContext.parallelize(work, max(min(len(work), 64), 1)).mapPartitions(
        _change_reader(cfg.raw())
    )
    return spark.createDataFrame(rows, CHANGES_SCHEMA)


def _json(value: Any) -> str:
    return json.dumps(json_safe(value), default=str)


def _state_reader(
    config: dict[str, Any],
    batch_id: int,
    max_parallelism: int,
    snapshot_dir: str,
    job_id: str,
    *,
    internal: bool,
    allow_pickle: bool,
) -> Callable[[Iterable[tuple[str, str]]], Iterator[tuple[Any, ...]]]:
    """The ``mapPartitions`` function restoring instances and yielding their state rows."""
    restore = InstanceEntries(config, max_parallelism, snapshot_dir, job_id)

    def read(work: Iterable[tuple[str, str]]) -> Iterator[tuple[Any, ...]]:
        for name, text in work:
            for key, state, kind, value in restore.of(
                name, text, internal=internal, allow_pickle=allow_pickle
            ):
                yield batch_id, name, _json(key), state, kind, _json(value)

    return read


def _change_reader(config: dict[str, Any]) -> Callable[[Iterable[str]], Iterator[tuple[Any, ...]]]:
    """The ``mapPartitions`` function decoding handles into change rows."""

    def read(work: Iterable[str]) -> Iterator[tuple[Any, ...]]:
        for text in work:
            handle = ChangelogHandle.from_json(text)
            instance = instance_name(handle.key_groups)
            for change, serializer in handle_changes(handle, config):
                doc = describe_change(change, serializer)
                yield (
                    handle.checkpoint_id,
                    instance,
                    doc["sqn"],
                    doc["key_group"],
                    doc["op"],
                    doc["state"],
                    json.dumps(doc["key"]),
                    json.dumps(doc["args"]),
                )

    return read
