"""Read a query's state and its change feed as DataFrames, outside the query (Spark's ``statestore``).

.. code-block:: python

    read_state(spark, "/data/chk").where("state = 'total'").show()
    read_changes(spark, "/data/chk", from_batch=10, to_batch=12).show()
    read_state_variable(spark, "/data/chk", "numViolations").select("key.id", "value.value")

All are read only: nothing of the query's state or logs is written, and a
running query can be read. ``read_state`` and ``read_changes`` give keys and
values as JSON text (a key of several columns is a JSON array), of every state;
``read_state_variable`` gives one declared state of a PySpark processor in the
typed columns of Spark's ``statestore`` reader.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dstl.spi import ChangelogHandle, Config, ConfigError, InvalidHandleError

from ..changelog import BackendSnapshot
from ..checkpoints import CheckpointLocation, instance_key_groups, restored_read_only
from ..options import BACKEND_MAX_PARALLELISM
from ..tools import describe_change, handle_changes, json_safe, state_entries
from .placement import instance_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from ..checkpoints import CompletedCheckpoint

__all__ = ["CHANGES_SCHEMA", "STATE_SCHEMA", "read_changes", "read_state", "read_state_variable"]

STATE_SCHEMA = "batch_id long, instance string, key string, state string, kind string, value string"
CHANGES_SCHEMA = (
    "batch_id long, instance string, sqn long, key_group int, op string, state string, key string, "
    "value string"
)


def _setup(
    spark: SparkSession, checkpoint_location: str, config: Mapping[str, Any] | None, job_id: str | None
) -> tuple[CheckpointLocation, list[CompletedCheckpoint], Config]:
    from ._private.call_checks import job_config
    from ._private.sessions import require_classic, spark_conf

    require_classic(spark, "reading a state checkpoint into a DataFrame")
    raw = job_config(spark_conf(spark), config, checkpoint_location).raw()
    location = CheckpointLocation(checkpoint_location, job_id, raw)
    documents, _ = location.checkpoints()
    if not documents:
        msg = f"{checkpoint_location} has no readable state checkpoint of job {location.job!r}"
        raise InvalidHandleError(msg)
    return location, documents, location.config(raw)


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
    location, documents, cfg = _setup(spark, checkpoint_location, config, job_id)
    chosen = documents[-1] if batch_id is None else _retained(documents, batch_id)
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


def read_state_variable(
    spark: SparkSession,
    checkpoint_location: str,
    state_var_name: str,
    *,
    batch_id: int | None = None,
    flatten_collection_types: bool = True,
    config: Mapping[str, Any] | None = None,
    job_id: str | None = None,
) -> DataFrame:
    """One state of a PySpark processor, typed by its declared schema, as Spark's ``statestore`` reads it.

    The columns of ``spark.read.format("statestore").option("stateVarName", ...)``:
    ``key`` (a struct of the key columns), then by the state's kind: ``value``; a
    list's ``list_element`` (``list_value``, an array, without ``flatten_collection_types``);
    a map's ``user_map_key`` and ``user_map_value`` (``map_value``, a map, without it);
    and ``partition_id`` (the operator instance). Values written with an older schema
    read by field name under the newest, as in the query.

    :raises ConfigError: when the location records no declared schema for the state
        (a dstl processor's state: use :func:`read_state`).
    :raises InvalidHandleError: when the checkpoint is not retained.
    """
    from ._private.query_record import recorded_shape

    location, documents, cfg = _setup(spark, checkpoint_location, config, job_id)
    shape = recorded_shape(checkpoint_location, cfg.raw())
    declared = None if shape is None else shape.state_schemas.get(state_var_name)
    kind = None if shape is None else shape.state_kinds.get(state_var_name)
    if declared is None or kind is None:
        known = sorted(shape.state_kinds) if shape is not None else []
        msg = (
            f"{checkpoint_location} records no declared state {state_var_name!r} (declared: {known}): "
            "states of dstl's own processors have no schema; read them with read_state"
        )
        raise ConfigError(msg)
    assert shape is not None
    key_ddl = ", ".join(f"`{name}` {kind_}" for name, kind_ in shape.key_columns)
    plan = _VariablePlan(
        state_var_name,
        kind,
        tuple(name for name, _ in shape.key_columns),
        key_ddl,
        declared["value"],
        declared.get("key"),
        shape.versions_of(state_var_name),
        flatten_collection_types,
    )
    chosen = documents[-1] if batch_id is None else _retained(documents, batch_id)
    work = [
        (index, name, snapshot.to_json())
        for index, (name, snapshot) in enumerate(sorted(chosen.snapshots.items()))
    ]
    read = _variable_reader(plan, cfg.raw(), cfg.get(BACKEND_MAX_PARALLELISM), location.url, location.job)
    rows = spark.sparkContext.parallelize(work, max(len(work), 1)).mapPartitions(read)
    return spark.createDataFrame(rows, plan.schema())


@dataclass(frozen=True)
class _VariablePlan:
    """What the executors need to read one declared state (sent with the tasks)."""

    name: str
    kind: str
    key_names: tuple[str, ...]
    key_ddl: str
    value_schema: str
    map_key_schema: str | None
    versions: tuple[str, ...]
    flatten: bool

    def schema(self) -> Any:
        """The DataFrame's schema: Spark's ``statestore`` columns for this kind."""
        from pyspark.sql.types import ArrayType, IntegerType, MapType, StructField, StructType

        key = StructType.fromDDL(self.key_ddl)
        value = StructType.fromJson(json.loads(self.value_schema))
        if self.kind == "list":
            columns = (
                [StructField("list_element", value)]
                if self.flatten
                else [StructField("list_value", ArrayType(value))]
            )
        elif self.kind == "map":
            map_key = StructType.fromJson(json.loads(self.map_key_schema or "{}"))
            columns = (
                [StructField("user_map_key", map_key), StructField("user_map_value", value)]
                if self.flatten
                else [StructField("map_value", MapType(map_key, value))]
            )
        else:
            columns = [StructField("value", value)]
        return StructType([StructField("key", key), *columns, StructField("partition_id", IntegerType())])


def _variable_reader(
    plan: _VariablePlan, config: dict[str, Any], max_parallelism: int, snapshot_dir: str, job_id: str
) -> Callable[[Iterable[tuple[int, str, str]]], Iterator[tuple[Any, ...]]]:
    """The ``mapPartitions`` function restoring instances and yielding the state's typed rows."""

    def read(work: Iterable[tuple[int, str, str]]) -> Iterator[tuple[Any, ...]]:
        from pyspark.sql import Row

        from ._private.state_schemas import TypedValues

        values = TypedValues(plan.name, plan.value_schema, versions=plan.versions)
        map_keys = None if plan.map_key_schema is None else TypedValues(plan.name, plan.map_key_schema, "key")
        make_key = Row(*plan.key_names)
        for index, name, text in work:
            snapshot = BackendSnapshot.from_json(text)
            with restored_read_only(
                snapshot,
                instance_key_groups(name, snapshot),
                config,
                max_parallelism=max_parallelism,
                snapshot_dir=snapshot_dir,
                job_id=job_id,
                allow_pickle=False,  # a pickled value reads as its size: TypedValues refuses it below
            ) as backend:
                for key, state, _, stored in state_entries(backend):
                    if state != plan.name:
                        continue
                    key_row = make_key(*(key if isinstance(key, list) else [key]))
                    yield from _typed_rows(plan, key_row, stored, values, map_keys, index)

    return read


def _typed_rows(
    plan: _VariablePlan, key: Any, stored: Any, values: Any, map_keys: Any, partition: int
) -> Iterator[tuple[Any, ...]]:
    """One key's rows of the state (several for a flattened list or map)."""
    if plan.kind == "list":
        elements = [values.read(item) for item in stored]
        if plan.flatten:
            yield from ((key, element, partition) for element in elements)
        else:
            yield key, elements, partition
    elif plan.kind == "map":
        entries = [(map_keys.read(name), values.read(item)) for name, item in stored.items()]
        if plan.flatten:
            yield from ((key, name, item, partition) for name, item in entries)
        else:
            yield key, dict(entries), partition
    else:
        yield key, values.read(stored), partition


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
    location, documents, cfg = _setup(spark, checkpoint_location, config, job_id)
    last = documents[-1].checkpoint_id if to_batch is None else to_batch
    handles: dict[str, ChangelogHandle] = {}
    for completed in documents:
        for snapshot in completed.snapshots.values():
            for handle in _all_handles(snapshot):
                if handle.checkpoint_id is not None and from_batch <= handle.checkpoint_id <= last:
                    handles.setdefault(handle.to_json(), handle)
    with_log = sorted(
        {
            h.checkpoint_id
            for c in documents
            for s in c.snapshots.values()
            for h in _all_handles(s)
            if h.checkpoint_id is not None
        }
    )
    if not with_log or from_batch < with_log[0]:
        msg = (
            f"batch {from_batch} has no retained log: the log before the last materialization is "
            f"truncated (batches with a log: {with_log[0]}..{with_log[-1]})"
            if with_log
            else f"no retained checkpoint of {checkpoint_location} references a log"
        )
        raise InvalidHandleError(msg)
    work = sorted(handles)
    rows = spark.sparkContext.parallelize(work, max(min(len(work), 64), 1)).mapPartitions(
        _change_reader(cfg.raw())
    )
    return spark.createDataFrame(rows, CHANGES_SCHEMA)


def _retained(documents: list[CompletedCheckpoint], batch_id: int) -> CompletedCheckpoint:
    for completed in documents:
        if completed.checkpoint_id == batch_id:
            return completed
    msg = f"checkpoint {batch_id} is not retained (retained: {[c.checkpoint_id for c in documents]})"
    raise InvalidHandleError(msg)


def _all_handles(snapshot: BackendSnapshot) -> Iterator[ChangelogHandle]:
    yield from snapshot.handles
    for _, part in snapshot.parts:
        yield from _all_handles(part)


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

    def read(work: Iterable[tuple[str, str]]) -> Iterator[tuple[Any, ...]]:
        for name, text in work:
            snapshot = BackendSnapshot.from_json(text)
            with restored_read_only(
                snapshot,
                instance_key_groups(name, snapshot),
                config,
                max_parallelism=max_parallelism,
                snapshot_dir=snapshot_dir,
                job_id=job_id,
                allow_pickle=allow_pickle,
            ) as backend:
                for key, state, kind, value in state_entries(backend, internal=internal):
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
