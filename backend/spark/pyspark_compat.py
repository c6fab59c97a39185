"""Run an unmodified PySpark ``StatefulProcessor`` (``transformWithStateInPandas``) on dstl.

A job moves by changing one call: the processor class stays as it is, and
:func:`~.query.transform_with_state` takes it in place of
``groupBy(...).transformWithStateInPandas(...)``:

.. code-block:: python

    # Spark's store:
    df.groupBy("user").transformWithStateInPandas(
        statefulProcessor=CountWithTimeout(), outputStructType=schema,
        outputMode="Update", timeMode="ProcessingTime")
    # dstl:
    transform_with_state(df, key_columns=["user"], processor=CountWithTimeout,
        output_schema=schema, time_mode="ProcessingTime", sink=..., checkpoint_location=...)

The processor gets a handle whose ``getValueState``/``getListState``/``getMapState``,
``registerTimer``/``deleteTimer``/``listTimers`` and ``deleteIfExists`` work on
dstl's keyed state and timers; values are tuples as in PySpark, typed by the
declared schemas and stored as values of Spark SQL types (no pickle: reading a
checkpoint runs no code; map keys must be plain data: numbers, strings, bytes and
tuples of them). ``ttlDurationMs`` becomes the state's TTL.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._private.input_chunks import InputChunks
from ._private.state_schemas import TypedValues
from .processor import StateContext, StatefulProcessor, plain

if TYPE_CHECKING:
    import pandas as pd

    from ..keyed import ListState, MapState, ValueState

__all__ = ["PySparkProcessor", "PySparkProcessorFactory", "is_pyspark_processor", "pyspark_processor"]

#: PySpark's state values are Python values of Spark SQL types: stored without pickle, so restoring
#: or reading a checkpoint runs no code of whoever could write it
_SERIALIZER = "spark"
#: states checkpointed before (with pickle) keep it until migrated through a savepoint
_LEGACY_SERIALIZER = "pickle"


def _pyspark_api() -> Any:
    from pyspark.sql.streaming import stateful_processor

    return stateful_processor


def is_pyspark_processor(processor: Any) -> bool:
    """Whether ``processor`` is a PySpark ``StatefulProcessor`` subclass or instance."""
    try:
        base = _pyspark_api().StatefulProcessor
    except ImportError:
        return False
    return isinstance(processor, base) or (isinstance(processor, type) and issubclass(processor, base))


def pyspark_processor(
    processor: Any, *, row_based: bool = False, chunks: InputChunks | None = None
) -> Callable[[], StatefulProcessor]:
    """A factory of dstl processors that each run a fresh copy of the PySpark ``processor``.

    Runs the processor's ``init`` once here, as Spark does on the driver, to learn the
    schemas of its states (the tasks check and type values by them).

    :param processor: a PySpark ``StatefulProcessor`` subclass (instantiated without
        arguments) or an instance (copied for each task, as Spark ships its own copy).
    :param row_based: written for the row-based ``transformWithState`` (rows in and
        out as ``Row`` objects), not for ``transformWithStateInPandas``.
    :param chunks: Spark's Arrow batch limits: a key's rows reach ``handleInputRows`` in
        frames of at most that size, as on Spark (Spark's defaults when not given).
    :raises ConfigError: when ``init`` fails or declares a schema Spark cannot parse.
    """
    from ._private.state_schemas import declared_states

    make = processor if isinstance(processor, type) else functools.partial(copy.deepcopy, processor)
    declared = declared_states(make)
    return PySparkProcessorFactory(
        make,
        row_based,
        declared.schemas,
        chunks or InputChunks(),
        declared.metrics(),
        declared.kinds,
        declared.expiring,
    )


@dataclass(frozen=True)
class PySparkProcessorFactory:
    """Makes a :class:`PySparkProcessor` per task; knows the states the processor declares.

    :ivar schemas: state name -> ``{"value": schema JSON, "key": schema JSON}`` (map states).
    :ivar chunks: Spark's Arrow batch limits, which cut a key's input into frames.
    """

    make: Callable[[], Any]
    row_based: bool
    schemas: Mapping[str, Mapping[str, str]]
    chunks: InputChunks = InputChunks()
    #: Spark's state-variable counts of the processor (``numValueStateVars``...), for ``customMetrics``
    state_counts: Mapping[str, int] = field(default_factory=dict)
    #: state name -> ``value``, ``list`` or ``map``
    state_kinds: Mapping[str, str] = field(default_factory=dict)
    #: the states declared with a TTL
    expiring_states: frozenset[str] = frozenset()
    #: state name -> every value schema its values were written with (the checkpoint's record)
    value_versions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __call__(self) -> PySparkProcessor:
        """A fresh processor (a fresh copy of the user's) for one task."""
        return PySparkProcessor(
            self.make,
            row_based=self.row_based,
            schemas=self.schemas,
            chunks=self.chunks,
            value_versions=self.value_versions,
        )


def _key(key: Any) -> tuple[Any, ...]:
    """The grouping key as PySpark passes it: a tuple of the key columns' values."""
    return key if isinstance(key, tuple) else (key,)


def _row(value: Iterable[Any]) -> tuple[Any, ...]:
    """A state value as PySpark stores it: a tuple of plain Python values."""
    return tuple(plain(item) for item in value)


def _frames(result: Iterator[pd.DataFrame] | None) -> pd.DataFrame | None:
    """Everything a PySpark handler yields, as one frame (consumed now, while its key is current)."""
    import pandas as pd

    frames = [frame for frame in result or () if frame is not None and len(frame)]
    if not frames:
        return None
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def _as_rows(frame: pd.DataFrame) -> Iterator[Any]:
    """A frame's rows as the row-based API hands them: ``Row`` objects of plain values, nulls as ``None``."""
    from pyspark.sql import Row

    make = Row(*(str(column) for column in frame.columns))
    plain_values = frame.astype(object).where(frame.notna(), None)
    return (make(*values) for values in plain_values.itertuples(index=False, name=None))


def _rows_frame(result: Iterator[Any] | None) -> pd.DataFrame | None:
    """Everything a row-based handler yields (``Row`` objects with field names), as one frame."""
    import pandas as pd
    from pyspark.sql import Row

    records = []
    for item in result or ():
        if not isinstance(item, Row) or not hasattr(item, "__fields__"):
            msg = (
                f"a row-based handler yielded {item!r:.60}: yield Row(column=value, ...) objects whose "
                "names are the output schema's columns, as for Spark's transformWithState"
            )
            raise TypeError(msg)
        records.append(item.asDict())
    return pd.DataFrame.from_records(records) if records else None


class PySparkProcessor(StatefulProcessor):
    """A dstl processor that drives a PySpark ``StatefulProcessor`` through its own API.

    With ``row_based``, as Spark's row-based ``transformWithState`` does: rows in as
    an iterator of ``Row``, out as ``Row`` objects, initial state one ``Row`` at a time.
    """

    def __init__(
        self,
        make: Callable[[], Any],
        *,
        row_based: bool = False,
        schemas: Mapping[str, Mapping[str, str]] | None = None,
        chunks: InputChunks | None = None,
        value_versions: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        self._user = make()
        self._value_versions = dict(value_versions or {})
        self._row_based = row_based
        self._chunks = chunks or InputChunks()
        self._schemas = dict(schemas or {})
        self._context: StateContext | None = None
        self._handle: Any = None

    def init(self, context: StateContext) -> None:
        """Give the PySpark processor its handle (it registers its states in ``init``)."""
        self._context = context
        self._handle = _handle_class()(context, self._schemas, self._value_versions)
        self._user.init(self._handle)

    def _timer_values(self) -> Any:
        context = self._context
        assert context is not None
        watermark = context.watermark_ms()
        return _pyspark_api().TimerValues(
            context.processing_time_ms(), -1 if watermark is None else watermark
        )

    def _output(self, result: Iterator[Any] | None) -> pd.DataFrame | None:
        return _rows_frame(result) if self._row_based else _frames(result)

    def handle_input_rows(self, key: Any, rows: pd.DataFrame) -> pd.DataFrame | None:
        """``handleInputRows(key, frames, timerValues)``, cut as Spark cuts them (row-based: ``Row``s)."""
        given = _as_rows(rows) if self._row_based else self._chunks.split(rows)
        return self._output(self._user.handleInputRows(_key(key), given, self._timer_values()))

    def handle_expired_timer(self, key: Any, expiry_ms: int, context: StateContext) -> pd.DataFrame | None:
        """``handleExpiredTimer(key, timerValues, ExpiredTimerInfo(expiry_ms))``."""
        info = _pyspark_api().ExpiredTimerInfo(expiry_ms)
        handle = self._handle
        assert handle is not None
        handle.firing = expiry_ms
        try:
            return self._output(self._user.handleExpiredTimer(_key(key), self._timer_values(), info))
        finally:
            handle.firing = None

    def handle_initial_state(self, key: Any, rows: pd.DataFrame, context: StateContext) -> None:
        """``handleInitialState(key, rows, timerValues)`` (row-based: once per ``Row``, as Spark does)."""
        timer_values = self._timer_values()
        if not self._row_based:  # a fresh 0-based index, as Spark hands the key's initial rows
            self._user.handleInitialState(_key(key), rows.reset_index(drop=True), timer_values)
            return
        for row in _as_rows(rows):
            self._user.handleInitialState(_key(key), row, timer_values)

    def close(self) -> None:
        """``close()``."""
        self._user.close()


def _ttl(ttl_duration_ms: int | None) -> float | None:
    return None if ttl_duration_ms is None else ttl_duration_ms / 1000


@functools.cache
def _handle_class() -> type:  # noqa: C901 - PySpark's handle, one short method per call
    """PySpark's ``StatefulProcessorHandle`` over a :class:`StateContext` (built on first use)."""
    api = _pyspark_api()

    base: Any = api.StatefulProcessorHandle  # PySpark's class, found at run time

    class Handle(base):
        def __init__(
            self,
            context: StateContext,
            schemas: Mapping[str, Mapping[str, str]],
            value_versions: Mapping[str, tuple[str, ...]],
        ) -> None:
            super().__init__(None)  # no API client: every call below is served by dstl
            self._context = context
            self._schemas = schemas
            self._value_versions = value_versions
            self._made: dict[str, list[Any]] = {}
            #: the timer whose handler runs: Spark removes it after the handler, so it lists it
            self.firing: int | None = None

        def _serializer(self, name: str) -> str:
            legacy = self._context.restored_serializer(name) == _LEGACY_SERIALIZER
            return _LEGACY_SERIALIZER if legacy else _SERIALIZER

        def _made_as(self, name: str, adapter: Any) -> Any:
            self._made.setdefault(name, []).append(adapter)
            return adapter

        def _typed(self, state: str, part: str = "value") -> TypedValues | None:
            declared = self._schemas.get(state, {}).get(part)
            if declared is None:
                return None
            versions = self._value_versions.get(state, ()) if part == "value" else ()
            return TypedValues(state, declared, part, versions)

        def getValueState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> Any:
            ttl = _ttl(ttlDurationMs)
            state = self._context.get_value_state(stateName, ttl=ttl, serializer=self._serializer(stateName))
            return self._made_as(stateName, _states()[0](state, self._typed(stateName)))

        def getListState(self, stateName: str, schema: Any, ttlDurationMs: int | None = None) -> Any:
            ttl = _ttl(ttlDurationMs)
            state = self._context.get_list_state(stateName, ttl=ttl, serializer=self._serializer(stateName))
            return self._made_as(stateName, _states()[1](state, self._typed(stateName)))

        def getMapState(
            self,
            stateName: str,
            userKeySchema: Any,
            valueSchema: Any,
            ttlDurationMs: int | None = None,
        ) -> Any:
            ttl = _ttl(ttlDurationMs)
            state = self._context.get_map_state(stateName, ttl=ttl, serializer=self._serializer(stateName))
            made = _states()[2](state, self._typed(stateName), self._typed(stateName, "key"))
            return self._made_as(stateName, made)

        def registerTimer(self, expiryTimestampMs: int) -> None:
            self._context.register_timer(int(expiryTimestampMs))

        def deleteTimer(self, expiryTimestampMs: int) -> None:
            if self.firing == int(expiryTimestampMs):
                self.firing = None
            self._context.delete_timer(int(expiryTimestampMs))

        def listTimers(self) -> Iterator[int]:
            listed = set(self._context.list_timers())
            if self.firing is not None:
                listed.add(self.firing)
            return iter(sorted(listed))

        def deleteIfExists(self, stateName: str) -> None:
            """Spark's: the state's data goes, and its variables fail from now on (get it again to use it)."""
            self._context.delete_state(stateName)
            for adapter in self._made.pop(stateName, ()):
                adapter.mark_deleted(stateName)

    return Handle


@functools.cache
def _states() -> tuple[type, type, type]:  # noqa: C901 - three adapter classes of one-line methods
    """PySpark's ``ValueState``, ``ListState`` and ``MapState`` over dstl's (built on first use)."""
    api = _pyspark_api()
    # PySpark's classes, found at run time
    value_base: Any = api.ValueState
    list_base: Any = api.ListState
    map_base: Any = api.MapState

    class Deletable:
        _state: Any

        def mark_deleted(self, name: str) -> None:
            """``deleteIfExists`` dropped this state: every later call fails, as on Spark."""
            self._state = _DeletedState(name)

    class Value(Deletable, value_base):
        def __init__(self, state: ValueState, typed: TypedValues | None) -> None:  # no super(): an API client
            self._state = state
            self._in, self._out = _converters(typed)

        def exists(self) -> bool:
            return self._state.exists()

        def get(self) -> tuple | None:
            value = self._state.value()
            return None if value is None else self._out(value)

        def update(self, newValue: tuple) -> None:
            self._state.update(self._in(newValue))

        def clear(self) -> None:
            self._state.clear()

    class List(Deletable, list_base):
        def __init__(self, state: ListState, typed: TypedValues | None) -> None:
            self._state = state
            self._in, self._out = _converters(typed)

        def exists(self) -> bool:
            return bool(self._state.get())

        def get(self) -> Iterator[tuple]:
            return map(self._out, self._state.get())

        def put(self, newState: list[tuple]) -> None:
            self._state.update([self._in(value) for value in newState])

        def appendValue(self, newState: tuple) -> None:
            self._state.add(self._in(newState))

        def appendList(self, newState: list[tuple]) -> None:
            self._state.add_all([self._in(value) for value in newState])

        def clear(self) -> None:
            self._state.clear()

    class Map(Deletable, map_base):
        def __init__(self, state: MapState, typed: TypedValues | None, typed_key: TypedValues | None) -> None:
            self._state = state
            self._in, self._out = _converters(typed)
            self._key_in, self._key_out = _converters(typed_key)

        def exists(self) -> bool:
            return not self._state.is_empty()

        def getValue(self, key: tuple) -> tuple | None:
            value = self._state.get(_row(key))
            return None if value is None else self._out(value)

        def containsKey(self, key: tuple) -> bool:
            return self._state.contains(_row(key))

        def updateValue(self, key: tuple, value: tuple) -> None:
            self._state.put(self._key_in(key), self._in(value))

        def iterator(self) -> Iterator[tuple[tuple, tuple]]:
            return ((self._key_out(key), self._out(value)) for key, value in self._state.items())

        def keys(self) -> Iterator[tuple]:
            return map(self._key_out, self._state.keys())

        def values(self) -> Iterator[tuple]:
            return map(self._out, self._state.values())

        def removeKey(self, key: tuple) -> None:
            self._state.remove(_row(key))

        def clear(self) -> None:
            self._state.clear()

    return Value, List, Map


#: what Spark's client says when a call on a deleted state fails, by the dstl call it makes
_DELETED_CALLS = {
    "exists": "Error checking value state exists",
    "value": "Error getting value state",
    "update": "Error updating value state",
    "clear": "Error clearing state",
    "get": "Error getting state",
    "add": "Error appending value",
    "add_all": "Error appending list",
    "is_empty": "Error checking map state exists",
    "contains": "Error checking if map state contains key",
    "put": "Error updating map state value",
    "items": "Error getting map state iterator",
    "keys": "Error getting map state keys",
    "values": "Error getting map state values",
    "remove": "Error removing key from map state",
}


class _DeletedState:
    """A state variable after ``deleteIfExists``: every call fails as on Spark (a ``PySparkRuntimeError``)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, call: str) -> Callable[..., Any]:
        from pyspark.errors import PySparkRuntimeError

        if call.startswith("__"):  # copy, pickle and friends probe for these: not state calls
            raise AttributeError(call)

        prefix = _DELETED_CALLS.get(call, "Error using state")

        def fail(*_: Any) -> Any:
            msg = (
                f"{prefix}: state {self._name!r} was deleted by deleteIfExists; get it again "
                "(getValueState/getListState/getMapState) to use it"
            )
            raise PySparkRuntimeError(msg)

        return fail


def _converters(
    typed: TypedValues | None,
) -> tuple[Callable[[Any], tuple[Any, ...] | list[Any]], Callable[[Any], Any]]:
    """How values go in (checked by the schema) and come out (``Row`` objects of it); plain without one."""
    if typed is None:  # no declared schema: tuples in, tuples out (the store keeps lists)
        return _row, _as_tuple
    check = typed.write
    return (lambda value: check(_row(value))), typed.read


def _as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value
