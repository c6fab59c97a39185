"""PySpark processors that behave as the ones of Spark's own ``transformWithStateInPandas`` suites.

Written here from what Spark's tests expect of them (``python/pyspark/sql/tests/pandas``
in apache/spark): each asserts, inside the handler, what Spark's state API returns, so
a difference of dstl's adapter fails the query, as it fails Spark's test.
"""

from __future__ import annotations

import datetime
import json
import sys

import pandas as pd
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

ONE_INT = StructType([StructField("value", IntegerType(), True)])
ONE_STRING = StructType([StructField("value", StringType(), True)])


class Dual(StatefulProcessor):
    """A processor for either of Spark's APIs: pandas frames, or ``Row`` objects with ``row_based``."""

    def __init__(self, row_based: bool = False) -> None:
        self.row_based = row_based

    def emit(self, **columns):
        """One output row: a one-row frame, or a ``Row``."""
        if self.row_based:
            return Row(**columns)
        return pd.DataFrame({name: [value] for name, value in columns.items()})

    def units(self, rows) -> list:
        """The handler's input as it came: frames, or rows."""
        return list(rows)

    def column(self, units, name: str) -> list:
        """A column's non-null values across the input."""
        if self.row_based:
            return [getattr(row, name) for row in units if getattr(row, name) is not None]
        return [value for frame in units for value in frame[name].dropna()]

    def row_count(self, units) -> int:
        return len(units) if self.row_based else sum(len(frame) for frame in units)

    def seconds(self, units, name: str) -> list[int]:
        """A timestamp column as epoch seconds (pandas: datetime64[ns]; rows: datetime)."""
        if self.row_based:
            return [int(getattr(row, name).timestamp()) for row in units]
        return [int(value) // 10**9 for frame in units for value in frame[name].astype("int64")]

    def initial_values(self, initial, name: str) -> list:
        """The initial state's values of a column: all the key's rows (pandas), or this row's."""
        if self.row_based:
            return [getattr(initial, name)]
        return initial[name].tolist()

    def first_initial(self, initial, name: str):
        """Spark's idiom: ``initialState.at[0, name]`` (a fresh 0-based index), or the row's field."""
        return getattr(initial, name) if self.row_based else initial.at[0, name]


def _temperatures(processor: Dual, rows) -> list[int]:
    return [int(value) for value in processor.column(processor.units(rows), "temperature")]


class ViolationsCounter(Dual):
    """Counts rows and rows above 100 per key; a deleted state's ``exists()`` is an error."""

    #: violations expected after the first and the second batch, per key
    EXPECTED = ({"0": 1, "1": 2}, {"0": 4, "1": 3})
    ttl_ms: int | None = None

    def init(self, handle) -> None:
        self.violations = handle.getValueState("numViolations", "value int", self.ttl_ms)
        self.scratch = handle.getValueState("tempState", ONE_INT)
        handle.deleteIfExists("tempState")
        self.batches_seen = 0

    def handleInputRows(self, key, rows, timerValues):
        try:
            self.scratch.exists()
        except PySparkRuntimeError as error:
            assert "Error checking value state exists" in str(error), error
        else:
            raise AssertionError("exists() on a deleted state must fail as on Spark")
        before = self.violations.get()[0] if self.violations.exists() else 0
        if self.violations.exists():
            assert before == self.EXPECTED[0][key[0]]
            self.batches_seen = 1
        temperatures = _temperatures(self, rows)
        after = before + sum(1 for value in temperatures if value > 100)
        assert after == self.EXPECTED[self.batches_seen][key[0]]
        self.violations.update((after,))
        yield self.emit(id=key[0], countAsString=str(len(temperatures)))


class ViolationsCounterWithTTL(ViolationsCounter):
    ttl_ms = 30_000


class AbsentValueReader(Dual):
    """Reads a state never written: ``exists()`` is false and ``get()`` is ``None``."""

    def init(self, handle) -> None:
        self.state = handle.getValueState("numViolations", ONE_INT)

    def handleInputRows(self, key, rows, timerValues):
        assert not self.state.exists()
        assert self.state.get() is None
        self.state.clear()
        yield self.emit(id=key[0], countAsString="0")


class InitialSum(Dual):
    """Sums temperatures on top of an initial value handed by ``handleInitialState``."""

    INITIAL = {("0",): 789, ("3",): 987}

    def init(self, handle) -> None:
        self.handle = handle
        self.total = handle.getValueState("value_state", ONE_INT)

    def handleInputRows(self, key, rows, timerValues):
        total = (self.total.get()[0] if self.total.exists() else 0) + sum(_temperatures(self, rows))
        self.total.update((total,))
        if len(key) > 1:
            yield self.emit(id1=key[0], id2=key[1], value=str(total))
        else:
            yield self.emit(id=key[0], value=str(total))

    def handleInitialState(self, key, initialState, timerValues) -> None:
        first = self.first_initial(
            initialState, "initVal"
        )  # pandas: a fresh 0-based index, as Spark hands it
        self.total.update((first,))
        if len(key) == 1:
            assert self.INITIAL[key] == first


class InitialSumWithTimers(InitialSum):
    """Also arms a timer already due for every key of the initial state."""

    def handleInitialState(self, key, initialState, timerValues) -> None:
        super().handleInitialState(key, initialState, timerValues)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() - 1)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        self.handle.deleteTimer(expiredTimerInfo.getExpiryTimeInMs())
        yield self.emit(id=f"{key[0]}-expired", value=str(expiredTimerInfo.getExpiryTimeInMs()))


class InitialListAppender(InitialSum):
    """Appends every initial-state row of a key to a list state."""

    def init(self, handle) -> None:
        super().init(handle)
        self.appended = handle.getListState("list_state", ONE_INT)

    def handleInitialState(self, key, initialState, timerValues) -> None:
        for value in self.initial_values(initialState, "initVal"):
            self.appended.appendValue((value,))


class MaxEventTime(Dual):
    """Emits the largest event time seen; a timer at the watermark clears it."""

    def init(self, handle) -> None:
        self.handle = handle
        self.largest = handle.getValueState("max_state", ONE_STRING)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        self.largest.clear()
        self.handle.deleteTimer(expiredTimerInfo.getExpiryTimeInMs())
        yield self.emit(id=f"{key[0]}-expired", timestamp=str(expiredTimerInfo.getExpiryTimeInMs()))

    def handleInputRows(self, key, rows, timerValues):
        seconds = self.seconds(self.units(rows), "eventTime")
        known = int(self.largest.get()[0]) if self.largest.exists() else 0
        largest = str(max(known, *seconds))
        self.largest.update((largest,))
        self.handle.registerTimer(timerValues.getCurrentWatermarkInMs())
        yield self.emit(id=key[0], timestamp=largest)


class MinEventTime(Dual):
    """Emits the smallest event time seen (no timers)."""

    def init(self, handle) -> None:
        self.smallest = handle.getValueState("min_state", ONE_STRING)

    def handleInputRows(self, key, rows, timerValues):
        seconds = self.seconds(self.units(rows), "eventTime")
        known = int(self.smallest.get()[0]) if self.smallest.exists() else sys.maxsize
        smallest = str(min(known, *seconds))
        self.smallest.update((smallest,))
        yield self.emit(id=key[0], timestamp=smallest)


class CountWithProcessingTimer(Dual):
    """Counts rows; key "0" arms a timer 1 ms ahead, whose firing resets the count.

    While it fires, ``listTimers()`` lists the timer being fired too (two timers then).
    """

    def init(self, handle) -> None:
        self.handle = handle
        self.count = handle.getValueState("count_state", ONE_STRING)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        listed = list(self.handle.listTimers())
        assert list(self.handle.listTimers()) == listed  # a second listing gives the same timers
        assert not listed or len(listed) == 2, listed
        self.count.clear()
        self.handle.deleteTimer(expiredTimerInfo.getExpiryTimeInMs())
        yield self.emit(id=key[0], countAsString="-1", timeValues=str(expiredTimerInfo.getExpiryTimeInMs()))

    def handleInputRows(self, key, rows, timerValues):
        count = int(self.count.get()[0]) if self.count.exists() else 0
        if key == ("0",):
            self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1)
        count += self.row_count(self.units(rows))
        self.count.update((str(count),))
        yield self.emit(
            id=key[0], countAsString=str(count), timeValues=str(timerValues.getCurrentProcessingTimeInMs())
        )


class FirstEventTime(Dual):
    """Emits the first event time of the key's last input frame (output feeds an aggregation)."""

    def init(self, handle) -> None:
        pass

    def handleInputRows(self, key, rows, timerValues):
        units = self.units(rows)
        first = units[0].eventTime if self.row_based else units[-1]["eventTime"].tolist()[0]
        yield self.emit(id=key[0], outputTimestamp=first)


class ListStates(Dual):
    """Two list states written by put/append, read by interleaved iterators; a timestamp list."""

    TEMPERATURE = StructType([StructField("temperature", IntegerType(), True)])
    ttl_ms: int | None = None

    def init(self, handle) -> None:
        self.first = handle.getListState("listState1", self.TEMPERATURE, self.ttl_ms)
        self.second = handle.getListState("listState2", self.TEMPERATURE, self.ttl_ms)
        moment = StructType([StructField("time", TimestampType(), True)])
        self.moments = handle.getListState("listStateTimestamp", moment)

    def handleInputRows(self, key, rows, timerValues):
        moments = []
        units = self.units(rows)
        for _ in units:  # per frame (pandas) or per row, as Spark's processors do
            for state, extra in ((self.first, 111), (self.second, 222)):
                state.put([(120,), (20,)])
                state.appendValue((extra,))
                state.appendList([(120,), (20,)])
            now = datetime.datetime.fromtimestamp(timerValues.getCurrentProcessingTimeInMs() / 1000)
            moments.append((now + datetime.timedelta(minutes=1),))
        one, two, three = self.first.get(), self.second.get(), self.first.get()
        # interleaved iterators each resume where they were
        for expected in (120, 20):
            assert next(one)[0] == expected and next(two)[0] == expected
        assert [next(three)[0], next(three)[0]] == [120, 20]
        assert (next(one)[0], next(two)[0], next(three)[0]) == (111, 222, 111)
        for expected in (120, 20):
            assert next(one)[0] == next(two)[0] == next(three)[0] == expected
        if moments:
            self.moments.put(moments)
        yield self.emit(id=key[0], countAsString=str(len(self.column(units, "temperature"))))


class ListStatesWithTTL(ListStates):
    ttl_ms = 30_000


class GrowingList(Dual):
    """A list of 100 pairs (one null), then 90 more by ``put`` (key "0") or ``appendList``."""

    def init(self, handle) -> None:
        pair = StructType(
            [StructField("value", IntegerType(), True), StructField("valueNull", IntegerType(), True)]
        )
        self.items = handle.getListState("listState", pair)
        self.size = handle.getValueState(
            "listSizeState", StructType([StructField("size", IntegerType(), True)])
        )

    def handleInputRows(self, key, rows, timerValues):
        before = list(self.items.get())
        if not before:
            assert self.size.get() is None
            fresh = [(i, None) for i in range(100)]
            (self.items.put if key == ("0",) else self.items.appendList)(fresh)
            self.size.update((100,))
        else:
            size = self.size.get()[0]
            assert before == [(i, None) for i in range(size)], before[:3]
            if key == ("0",):
                self.items.put([(i, None) for i in range(size + 90)])
            else:
                self.items.appendList([(i, None) for i in range(size, size + 90)])
            self.size.update((size + 90,))
        yield self.emit(
            id=key[0],
            prevElements=",".join(str(item[0]) for item in before),
            updatedElements=",".join(str(item[0]) for item in self.items.get()),
        )


class MapStates(Dual):
    """A map state through every operation, emptied again by the end of each call."""

    def init(self, handle) -> None:
        self.entries = handle.getMapState("mapState", "name string", "count int")

    def handleInputRows(self, key, rows, timerValues):
        count = len(_temperatures(self, rows))
        first, second = ("key1",), ("key2",)
        values = [count, count]
        if self.entries.exists():
            for index, name in enumerate((first, second)):
                if self.entries.containsKey(name):
                    values[index] += self.entries.getValue(name)[0]
        self.entries.updateValue(first, (values[0],))
        self.entries.updateValue(second, (values[1],))
        names, stored = self.entries.keys(), self.entries.values()  # PySpark's iterators
        assert [next(names)[0], next(names)[0]] == ["key1", "key2"]
        assert [next(stored)[0], next(stored)[0]] == values
        pairs = self.entries.iterator()
        assert next(pairs)[0] == first and next(pairs)[1] == (values[1],)
        self.entries.removeKey(first)
        assert not self.entries.containsKey(first) and self.entries.exists()
        self.entries.clear()
        assert not self.entries.exists()
        yield self.emit(id=key[0], countAsString=str(count))


class MapStatesWithTTL(MapStates):
    def init(self, handle) -> None:
        name = StructType([StructField("name", StringType(), True)])
        count = StructType([StructField("count", IntegerType(), True)])
        self.entries = handle.getMapState("mapState", name, count, 365 * 24 * 3600 * 1000)
        self.unused = handle.getListState("listState", name)


class LargeValues(Dual):
    """512 KiB strings through value, list and map states."""

    def init(self, handle) -> None:
        self.value = handle.getValueState("valueState", ONE_STRING)
        self.items = handle.getListState("listState", ONE_STRING)
        self.entries = handle.getMapState("mapState", "key string", "value string")

    def handleInputRows(self, key, rows, timerValues):
        large = "a" * 512 * 1024
        self.value.update((large,))
        self.items.put([(large,), (large + "b",), (large + "c",)])
        self.entries.updateValue(("large_string_key",), (large,))
        yield self.emit(
            id=key[0],
            valueStateResult=self.value.get()[0],
            listStateResult=",".join(item[0] for item in self.items.get()),
            mapStateResult=f"large_string_key:{self.entries.getValue(('large_string_key',))[0]}",
        )


class ChunkCount(Dual):
    """Emits how many frames the key's input arrived in (Spark's Arrow batch limits)."""

    def init(self, handle) -> None:
        self.value = handle.getValueState("value_state", ONE_INT)

    def handleInputRows(self, key, rows, timerValues):
        yield self.emit(id=key[0], chunkCount=len(self.units(rows)))

    def handleInitialState(self, key, initialState, timerValues) -> None:
        self.value.update((self.first_initial(initialState, "initVal"),))


class CompositeStates(Dual):
    """Arrays, maps and structs inside value, list and map states; structs read back as ``Row``."""

    TAGS = [["dummy1", "dummy2"], ["dummy3"]]
    METADATA = [{"key": "env", "value": "prod"}, {"key": "region", "value": "us-west"}]
    ADDRESS = [(1, "Seattle"), (3, "SF")]
    ATTRIBUTES = {"key1": [1], "key2": [10]}
    CONFS = {"e1": {"e2": 5, "e3": 10}}

    def init(self, handle) -> None:
        pairs = StructType([StructField("key", StringType()), StructField("value", StringType())])
        address = StructType([StructField("road_id", IntegerType()), StructField("city", StringType())])
        record = StructType(
            [
                StructField("id", ArrayType(IntegerType())),
                StructField("tags", ArrayType(ArrayType(StringType()))),
                StructField("metadata", ArrayType(pairs)),
                StructField("address", ArrayType(address)),
            ]
        )
        entry = StructType(
            [
                StructField("id", IntegerType(), True),
                StructField("attributes", MapType(StringType(), ArrayType(IntegerType())), True),
                StructField("confs", MapType(StringType(), MapType(StringType(), IntegerType()), True), True),
            ]
        )
        self.record = handle.getValueState("obj_state", record)
        self.records = handle.getListState("list_state", record)
        self.entries = handle.getMapState("map_state", "name string", entry)

    def handleInputRows(self, key, rows, timerValues):
        name, total = key[0], sum(_temperatures(self, rows))
        if self.record.exists():
            ids, tags, metadata, address = self.record.get()
            assert tags == self.TAGS, tags
            assert metadata == [Row(**item) for item in self.METADATA], metadata
            assert address == [Row(road_id=road, city=city) for road, city in self.ADDRESS], address
            ids = [int(item + total) for item in ids]
        else:
            ids = [0]
        self.record.update((ids, self.TAGS, self.METADATA, self.ADDRESS))
        kept = []
        for old_ids, tags, metadata, address in self.records.get():
            kept.append(([*old_ids, total], tags, [item.asDict() for item in metadata], address))
        self.records.put(kept or [(ids, self.TAGS, self.METADATA, self.ADDRESS)])
        if self.entries.containsKey(name):
            number, attributes, confs = self.entries.getValue(name)
            attributes[name] = [total]
            confs.setdefault("e1", {})[name] = total
            self.entries.updateValue(name, (number, attributes, confs))
        else:
            self.entries.updateValue(name, (0, self.ATTRIBUTES, self.CONFS))
        _, attributes, confs = self.entries.getValue(name)
        yield self.emit(
            id=name,
            value_arr=",".join(map(str, ids)),
            list_state_arr=",".join(str(item) for ids_, *_ in (kept or [(ids,)]) for item in ids_),
            map_state_arr=json.dumps(attributes, default=int, sort_keys=True),
            nested_map_state_arr=json.dumps(confs, default=int, sort_keys=True),
        )


class CompositeOutput(Dual):
    """Output rows of arrays, maps and structs whose size grows with the key's count."""

    def init(self, handle) -> None:
        self.count = handle.getValueState("count_state", ONE_INT)

    def handleInputRows(self, key, rows, timerValues):
        count = (self.count.get()[0] if self.count.exists() else 0) + self.row_count(self.units(rows))
        self.count.update((count,))

        def inner(i: int, scale_int: int, scale_float: float):
            made = {
                "intValue": i * scale_int,
                "doubleValue": float(i * scale_float),
                "arrayValue": [f"elem_{i}_{j}" for j in range(i + 1)],
                "mapValue": {f"map_{i}_{j}": f"val_{i}_{j}" for j in range(i + 1)},
            }
            return Row(**made) if self.row_based else made  # structs as each API writes them

        yield self.emit(
            primitiveValue=f"key_{key[0]}_count_{count}",
            listOfPrimitive=[f"item_{i}" for i in range(count)],
            mapOfPrimitive={f"key{i}": f"value{i}" for i in range(count)},
            listOfComposite=[inner(i, 1, 1.5) for i in range(count)],
            mapOfComposite={f"nested_key{i}": inner(i, 10, 2.5) for i in range(count)},
        )


class _Evolving(Dual):
    """A value state of ``state_schema`` per key; output: the key and the value (a struct)."""

    state_schema: StructType

    def init(self, handle) -> None:
        self.state = handle.getValueState("state", self.state_schema)

    def handleInputRows(self, key, rows, timerValues):
        for _ in rows:
            pass
        value = self.next_value(int(key[0]))
        self.state.update(tuple(value.values()))
        yield self.emit(id=key[0], value=value)

    def next_value(self, number: int) -> dict:
        raise NotImplementedError


def _fields(*named: tuple[str, object], nullable: bool = True) -> StructType:
    return StructType([StructField(name, kind, nullable) for name, kind in named])


class BasicRecord(_Evolving):
    state_schema = _fields(("id", IntegerType()), ("name", StringType()))

    def next_value(self, number: int) -> dict:
        return {"id": number, "name": f"name-{number}"}


class BasicRecordNotNullable(BasicRecord):
    state_schema = _fields(("id", IntegerType()), ("name", StringType()), nullable=False)


class RecordWithAddedFields(_Evolving):
    state_schema = _fields(
        ("id", IntegerType()), ("name", StringType()), ("count", IntegerType()), ("active", BooleanType()),
        ("score", FloatType()),
    )  # fmt: skip

    def next_value(self, number: int) -> dict:
        if self.state.exists():
            found = dict(zip(("id", "name", "count", "active", "score"), self.state.get(), strict=True))
        else:
            found = {"id": number, "name": f"name-{number}", "count": 100, "active": True, "score": 99.9}
        self.stored = (found["id"], found["name"] + "0", found["count"], found["active"], found["score"])
        return found

    def handleInputRows(self, key, rows, timerValues):
        for _ in rows:
            pass
        value = self.next_value(int(key[0]))
        self.state.update(self.stored)
        yield self.emit(id=key[0], value=value)


class RecordWithRemovedFields(_Evolving):
    state_schema = _fields(("id", IntegerType()), ("name", StringType()))

    def next_value(self, number: int) -> dict:
        name = self.state.get()[1] if self.state.exists() else f"name-{number}"
        return {"id": number, "name": name}


class RecordReordered(_Evolving):
    state_schema = _fields(
        ("name", StringType()), ("id", IntegerType()), ("score", FloatType()), ("count", IntegerType()),
        ("active", BooleanType()),
    )  # fmt: skip

    def next_value(self, number: int) -> dict:
        if self.state.exists():
            return dict(zip(("name", "id", "score", "count", "active"), self.state.get(), strict=True))
        return {"name": f"name-{number}", "id": number, "score": 99.9, "count": 100, "active": True}


class RecordUpcast(_Evolving):
    state_schema = _fields(("id", LongType()), ("name", StringType()))

    def next_value(self, number: int) -> dict:
        found = number + self.state.get()[0] + 1 if self.state.exists() else number
        return {"id": found, "name": f"name-{number}"}
