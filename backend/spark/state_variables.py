"""A PySpark processor's declared states, as Spark's ``statestore`` and ``state-metadata`` readers give them.

.. code-block:: python

    # spark.read.format("statestore").option("path", chk).option("stateVarName", "numViolations")
    read_state_variable(spark, chk, "numViolations").selectExpr("key.id", "value.value")
    # ... .option("readChangeFeed", True).option("changeStartBatchId", 0)
    read_state_variable(spark, chk, "numViolations", read_change_feed=True, change_start_batch_id=0)
    # spark.read.format("state-metadata").load(chk)
    read_state_metadata(spark, chk).select("operatorProperties")

Read only, as :mod:`.state_reader`: the query's state and logs are not written,
and a running query can be read. The location's record (``dstl-query.json``)
gives each state's kind and schemas, so values come typed: values written with
an older schema read by field name under the newest, as in the query.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dstl.spi import ChangelogHandle, ConfigError

from ..keyed import TTL_SUFFIX, Op, map_key_from_bytes, unstamp
from ..options import BACKEND_MAX_PARALLELISM
from ..serialization import untrusted_serializer_for
from ..tools import handle_changes
from ._private.checkpoint_reading import InstanceEntries, logged_handles, opened, retained
from .placement import instance_name
from .query_progress import OPERATOR_NAME

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from ._private.query_record import QueryShape

__all__ = ["METADATA_SCHEMA", "read_state_metadata", "read_state_variable"]

#: Spark's ``state-metadata`` columns
METADATA_SCHEMA = (
    "operatorId int, operatorName string, stateStoreName string, numPartitions int, minBatchId long, "
    "maxBatchId long, operatorProperties string"
)
_VARIABLE_TYPES = {"value": "ValueState", "list": "ListState", "map": "MapState"}
_TIME_MODES = {"none": "NoTime", "processing": "ProcessingTime", "event": "EventTime"}
_TIMERS = {"processing": "$procTimers_keyToTimestamp", "event": "$eventTimers_keyToTimestamp"}


def read_state_variable(  # noqa: PLR0913 - the options of Spark's statestore reader
    spark: SparkSession,
    checkpoint_location: str,
    state_var_name: str,
    *,
    batch_id: int | None = None,
    partition_id: int | None = None,
    flatten_collection_types: bool = True,
    read_change_feed: bool = False,
    change_start_batch_id: int | None = None,
    change_end_batch_id: int | None = None,
    config: Mapping[str, Any] | None = None,
    job_id: str | None = None,
) -> DataFrame:
    """One declared state in the typed columns of ``spark.read.format("statestore")``.

    ``key`` (a struct of the key columns), then by the state's kind: ``value``; a
    list's ``list_element`` (``list_value``, an array, without ``flatten_collection_types``);
    a map's ``user_map_key`` and ``user_map_value`` (``map_value``, a map, without it);
    and ``partition_id`` (the operator instance; ``partition_id=`` reads only it, as
    Spark's ``snapshotPartitionId``). ``batch_id`` picks the checkpoint (Spark's
    ``batchId``). With ``read_change_feed`` (value states), the changes of batches
    ``change_start_batch_id`` to ``change_end_batch_id``: ``batch_id``,
    ``change_type`` (``update`` or ``delete``), ``key``, ``value``, ``partition_id``.

    :raises ConfigError: when the location records no declared state of that name
        (a dstl processor's states have no schema: use :func:`~.state_reader.read_state`),
        or for a change feed of a list or map state.
    :raises InvalidHandleError: when the checkpoint, or a batch's log, is not retained.
    """
    from ._private.query_record import recorded_shape

    location, documents, cfg = opened(spark, checkpoint_location, config, job_id)
    shape = recorded_shape(checkpoint_location, cfg.raw())
    plan = _VariablePlan.of(shape, state_var_name, checkpoint_location, flatten_collection_types)
    chosen = documents[-1] if batch_id is None else retained(documents, batch_id)
    partitions = {name: index for index, name in enumerate(sorted(chosen.snapshots))}
    if read_change_feed:
        if plan.kind != "value":
            msg = f"the change feed of {plan.kind} state {state_var_name!r} is not typed: use read_changes"
            raise ConfigError(msg)
        start = documents[0].checkpoint_id if change_start_batch_id is None else change_start_batch_id
        handles = logged_handles(documents, start, change_end_batch_id, checkpoint_location)
        work = [
            (partitions.get(instance_name(handle.key_groups), -1), handle.to_json())
            for handle in handles
            if partition_id is None or partitions.get(instance_name(handle.key_groups)) == partition_id
        ]
        changes = spark.sparkContext.parallelize(work, max(min(len(work), 64), 1)).mapPartitions(
            _change_reader(plan, cfg.raw())
        )
        return spark.createDataFrame(changes, plan.change_schema())
    snapshots = [
        (index, name, chosen.snapshots[name].to_json())
        for name, index in partitions.items()
        if partition_id is None or index == partition_id
    ]
    read = _snapshot_reader(plan, cfg.raw(), cfg.get(BACKEND_MAX_PARALLELISM), location.url, location.job)
    rows = spark.sparkContext.parallelize(snapshots, max(len(snapshots), 1)).mapPartitions(read)
    return spark.createDataFrame(rows, plan.schema())


def read_state_metadata(
    spark: SparkSession,
    checkpoint_location: str,
    *,
    config: Mapping[str, Any] | None = None,
    job_id: str | None = None,
) -> DataFrame:
    """The operator's row of ``spark.read.format("state-metadata")``.

    ``operatorProperties`` is JSON with ``timeMode`` and ``stateVariables`` (each
    ``stateName``, ``stateVariableType``, ``ttlEnabled``; timers as Spark names them);
    ``numPartitions`` counts the operator instances of the newest checkpoint, and
    the batch ids span the retained checkpoints.
    """
    from ._private.query_record import recorded_shape

    _, documents, cfg = opened(spark, checkpoint_location, config, job_id)
    shape = recorded_shape(checkpoint_location, cfg.raw())
    variables: list[dict[str, Any]] = []
    mode = "none" if shape is None else shape.time_mode
    if shape is not None:
        variables = [
            {
                "stateName": name,
                "stateVariableType": _VARIABLE_TYPES[kind],
                "ttlEnabled": name in shape.expiring_states,
            }
            for name, kind in sorted(shape.state_kinds.items())
        ]
    if mode in _TIMERS:
        variables.append({"stateName": _TIMERS[mode], "stateVariableType": "TimerState", "ttlEnabled": False})
    properties = {"timeMode": _TIME_MODES.get(mode, mode), "stateVariables": variables}
    row = (
        0,
        OPERATOR_NAME,
        "default",
        len(documents[-1].snapshots),
        documents[0].checkpoint_id,
        documents[-1].checkpoint_id,
        json.dumps(properties),
    )
    return spark.createDataFrame([row], METADATA_SCHEMA)


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

    @classmethod
    def of(cls, shape: QueryShape | None, name: str, where: str, flatten: bool) -> _VariablePlan:
        declared = None if shape is None else shape.state_schemas.get(name)
        kind = None if shape is None else shape.state_kinds.get(name)
        if shape is None or declared is None or kind is None:
            known = sorted(shape.state_kinds) if shape is not None else []
            msg = (
                f"{where} records no declared state {name!r} (declared: {known}): states of dstl's own "
                "processors have no schema; read them with read_state"
            )
            raise ConfigError(msg)
        return cls(
            name,
            kind,
            tuple(column for column, _ in shape.key_columns),
            ", ".join(f"`{column}` {kind_}" for column, kind_ in shape.key_columns),
            declared["value"],
            declared.get("key"),
            shape.versions_of(name),
            flatten,
        )

    def schema(self) -> Any:
        """Spark's ``statestore`` columns for this kind."""
        from pyspark.sql.types import ArrayType, IntegerType, MapType, StructField, StructType

        key = StructType.fromDDL(self.key_ddl)
        value = StructType.fromJson(json.loads(self.value_schema))
        if self.kind == "list":
            element = (
                StructField("list_element", value)
                if self.flatten
                else StructField("list_value", ArrayType(value))
            )
            columns = [element]
        elif self.kind == "map":
            map_key = StructType.fromJson(json.loads(self.map_key_schema or '{"fields": []}'))
            columns = (
                [StructField("user_map_key", map_key), StructField("user_map_value", value)]
                if self.flatten
                else [StructField("map_value", MapType(map_key, value))]
            )
        else:
            columns = [StructField("value", value)]
        return StructType([StructField("key", key), *columns, StructField("partition_id", IntegerType())])

    def change_schema(self) -> Any:
        """Spark's change feed columns of a value state."""
        from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

        return StructType(
            [
                StructField("batch_id", LongType()),
                StructField("change_type", StringType()),
                StructField("key", StructType.fromDDL(self.key_ddl)),
                StructField("value", StructType.fromJson(json.loads(self.value_schema))),
                StructField("partition_id", IntegerType()),
            ]
        )


def _key_row(plan: _VariablePlan) -> Callable[[Any], Any]:
    from pyspark.sql import Row

    make = Row(*plan.key_names)
    return lambda key: make(*(key if isinstance(key, list | tuple) else [key]))


def _snapshot_reader(
    plan: _VariablePlan, config: dict[str, Any], max_parallelism: int, snapshot_dir: str, job_id: str
) -> Callable[[Iterable[tuple[int, str, str]]], Iterator[tuple[Any, ...]]]:
    """The ``mapPartitions`` function restoring instances and yielding the state's typed rows."""
    restore = InstanceEntries(config, max_parallelism, snapshot_dir, job_id)

    def read(work: Iterable[tuple[int, str, str]]) -> Iterator[tuple[Any, ...]]:
        from ._private.state_schemas import TypedValues

        values = TypedValues(plan.name, plan.value_schema, versions=plan.versions)
        map_keys = None if plan.map_key_schema is None else TypedValues(plan.name, plan.map_key_schema, "key")
        key_row = _key_row(plan)
        for index, name, text in work:
            # a pickled value shows as its size (no code runs): TypedValues refuses it, naming why
            for key, state, _, stored in restore.of(name, text):
                if state == plan.name:
                    yield from _typed_rows(plan, key_row(key), stored, values, map_keys, index)

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


def _change_reader(
    plan: _VariablePlan, config: dict[str, Any]
) -> Callable[[Iterable[tuple[int, str]]], Iterator[tuple[Any, ...]]]:
    """The ``mapPartitions`` function decoding a value state's changes, typed."""

    def read(work: Iterable[tuple[int, str]]) -> Iterator[tuple[Any, ...]]:
        from ._private.state_schemas import TypedValues

        values = TypedValues(plan.name, plan.value_schema, versions=plan.versions)
        key_row = _key_row(plan)
        for partition, text in work:
            handle = ChangelogHandle.from_json(text)
            for change, stored_format in handle_changes(handle, config):
                if change.state != plan.name or change.op not in (Op.VALUE_PUT, Op.CLEAR):
                    continue
                key = key_row(map_key_from_bytes(change.key))
                if change.op is Op.CLEAR:
                    yield handle.checkpoint_id, "delete", key, None, partition
                    continue
                yield (
                    handle.checkpoint_id,
                    "update",
                    key,
                    values.read(_decoded(change.args[0], stored_format)),
                    partition,
                )

    return read


def _decoded(payload: bytes, stored_format: str) -> Any:
    """A logged value, decoded only by a serializer that runs no code (pickle shows its size)."""
    serializer, stamped, _ = stored_format.partition(TTL_SUFFIX)
    if stamped:  # the write time first: the value never counts as expired here
        payload = unstamp(payload, float("inf"), 0.0) or b""
    return untrusted_serializer_for(serializer).loads(payload)
