"""The scenarios of Spark's own ``transformWithStateInPandas`` suites, on Spark's flavour and on dstl's.

Each test is one scenario of apache/spark's ``test_pandas_transform_with_state.py`` or
``test_pandas_transform_with_state_state_variable.py`` (same input, same processor
behaviour, same expected output per batch), written here and run twice: with Spark's
operator and RocksDB store, and with dstl's stateful stream. The query code is the
same for both (see :mod:`.spark_suite`).
"""

from __future__ import annotations

import datetime
import json

import pytest
from pyspark.sql import Row
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DoubleType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tests.backend.spark import spark_suite_processors as processors
from tests.backend.spark.spark_suite import (
    FLAVOURS,
    SUITE_CONF,
    collect_into,
    read_state_variable,
    rows_of,
    run_collecting,
    run_to_end,
    session_conf,
    state_metadata,
    stateful,
    text_stream,
    write_lines,
    write_pairs,
    write_resource,
)


@pytest.fixture(params=FLAVOURS, ids=str)
def flavour(request):
    """Spark's flavour or dstl's, running a processor written for the pandas or the row-based API."""
    return request.param


COUNT_SCHEMA = StructType(
    [StructField("id", StringType(), True), StructField("countAsString", StringType(), True)]
)


@pytest.fixture
def suite(spark):
    """The classic session with the suites' settings (5 shuffle partitions, UTC, no idle batches)."""
    with session_conf(spark, SUITE_CONF):
        yield spark


def _basic(
    suite,
    flavour,
    tmp_path,
    processor,
    schema=COUNT_SCHEMA,
    *,
    single_batch=False,
    time_mode="None",
    initial_state=None,
    check=None,
):
    """Spark's ``_test_transform_with_state_basic``: resource 1, then resource 2, update mode."""
    source = tmp_path / "input"
    write_resource(source, 1)
    if not single_batch:
        write_resource(source, 2)
    out: dict = {}
    frame = stateful(
        flavour,
        text_stream(suite, source),
        ["id"],
        processor,
        schema,
        time_mode=time_mode,
        initial_state=initial_state,
        tmp_path=tmp_path,
    )
    query = run_collecting(frame, tmp_path / "checkpoint", out, query_name="this_query", check=check)
    assert query.name == "this_query"
    return rows_of(out)


def _counts(*pairs: tuple[str, str]) -> set:
    return {Row(id=key, countAsString=count) for key, count in pairs}


# -- test_pandas_transform_with_state.py ------------------------------------------------------


def test_basic(suite, flavour, tmp_path):
    """``test_transform_with_state_basic`` (both suites): a deleted state's ``exists()`` is an error."""
    assert _basic(suite, flavour, tmp_path, processors.ViolationsCounter(flavour.row_based)) == {
        0: _counts(("0", "2"), ("1", "2")),
        1: _counts(("0", "3"), ("1", "2")),
    }


def test_query_restarts(suite, flavour, tmp_path):
    """``test_transform_with_state_query_restarts``: a parquet sink across a restart; state metrics."""
    source, output = tmp_path / "input", tmp_path / "output"
    write_resource(source, 1)

    def start():
        frame = stateful(
            flavour,
            text_stream(suite, source),
            ["id"],
            processors.ViolationsCounter(flavour.row_based),
            COUNT_SCHEMA,
            tmp_path=tmp_path,
        )
        return run_to_end(
            frame.writeStream.queryName("this_query")
            .format("parquet")
            .outputMode("append")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .option("path", str(output))
        )

    query = start()
    metrics = query.lastProgress.stateOperators[0].customMetrics
    assert metrics["numValueStateVars"] > 0 and metrics["numDeletedStateVars"] > 0, metrics
    write_resource(source, 2)
    start()
    assert sorted(suite.read.parquet(str(output)).collect()) == sorted(
        [
            Row(id="0", countAsString="2"),
            Row(id="0", countAsString="3"),
            Row(id="1", countAsString="2"),
            Row(id="1", countAsString="2"),
        ]
    )


PROC_TIMER_SCHEMA = StructType([*COUNT_SCHEMA.fields, StructField("timeValues", StringType(), True)])


def _proc_timer(suite, flavour, tmp_path):
    source = tmp_path / "input"
    write_resource(source, 3, order=1)
    write_resource(source, 1, order=2)
    write_resource(source, 2, order=3)
    out: dict = {}
    frame = stateful(
        flavour,
        text_stream(suite, source),
        ["id"],
        processors.CountWithProcessingTimer(flavour.row_based),
        PROC_TIMER_SCHEMA,
        time_mode="processingtime",
        tmp_path=tmp_path,
    )
    run_collecting(frame, tmp_path / "checkpoint", out, query_name="processing_time_test_query")
    batches = {batch: {(row.id, row.countAsString) for row in rows} for batch, rows in out.items()}
    assert batches == {
        0: {("0", "1"), ("1", "1")},
        1: {("0", "3"), ("0", "-1"), ("1", "3")},
        2: {("0", "3"), ("0", "-1"), ("1", "5")},
    }
    for rows in (out[1], out[2]):  # the timer fired before this batch's processing time
        fired = {row.id: int(row.timeValues) for row in rows if row.countAsString == "-1"}
        counted = {row.id: int(row.timeValues) for row in rows if row.countAsString != "-1"}
        assert all(fired[key] < counted[key] for key in fired)


def test_proc_timer(suite, flavour, tmp_path):
    """``test_transform_with_state_proc_timer``: ``listTimers()`` inside the handler lists the fired timer."""
    _proc_timer(suite, flavour, tmp_path)


EVENT_SCHEMA = StructType(
    [StructField("id", StringType(), True), StructField("timestamp", StringType(), True)]
)


def _event_time(suite, flavour, tmp_path, processor, time_mode="eventtime"):
    source = tmp_path / "input"
    write_lines(source, "text-test3.txt", ["a, 20"], 1)
    write_lines(source, "text-test1.txt", ["a, 4"], 2)
    write_lines(source, "text-test2.txt", ["a, 2", "a, 11", "a, 13", "a, 15"], 3)
    timed = (
        text_stream(suite, source)
        .select("id", F.from_unixtime(F.col("temperature")).alias("eventTime").cast("timestamp"))
        .withWatermark("eventTime", "10 seconds")
    )
    out: dict = {}
    frame = stateful(flavour, timed, ["id"], processor, EVENT_SCHEMA, time_mode=time_mode, tmp_path=tmp_path)
    run_collecting(frame, tmp_path / f"checkpoint-{time_mode}", out, query_name="event_time_test_query")
    return rows_of(out)


def _stamps(*pairs: tuple[str, str]) -> set:
    return {Row(id=key, timestamp=stamp) for key, stamp in pairs}


def test_event_time(suite, flavour, tmp_path):
    """``test_transform_with_state_event_time``: Spark's two watermarks (late rows, eviction)."""
    assert _event_time(suite, flavour, tmp_path, processors.MaxEventTime(flavour.row_based)) == {
        0: _stamps(("a", "20"), ("a-expired", "0")),
        1: _stamps(("a", "4"), ("a-expired", "10000")),
        2: _stamps(("a", "15"), ("a-expired", "10000")),
    }


@pytest.mark.parametrize("time_mode", ["None", "ProcessingTime"])
def test_watermark_without_event_time_mode(suite, flavour, tmp_path, time_mode):
    """``test_transform_with_state_with_wmark_and_non_event_time``: late rows judged, no event timers."""
    assert _event_time(suite, flavour, tmp_path, processors.MinEventTime(flavour.row_based), time_mode) == {
        0: _stamps(("a", "20")),
        1: _stamps(("a", "4")),
        2: _stamps(("a", "2")),
    }


CHAINED_SCHEMA = StructType(
    [StructField("id", StringType(), True), StructField("outputTimestamp", TimestampType(), True)]
)


@pytest.mark.parametrize("grouping", [["outputTimestamp"], ["outputTimestamp", "id"]], ids="-".join)
def test_chaining_ops(suite, flavour, tmp_path, grouping):
    """``test_transform_with_state_chaining_ops``: ``groupBy().count()`` after the step, in append mode.

    The step's output carries event time (``eventTimeColumnName``); the aggregation emits a
    group once the query's watermark passes it: in batch 1 the groups at or below 10 s
    (15 - 5), in batch 2 those at or below 20 s; the row at 5 s is late in batch 2.
    """
    source = tmp_path / "input"
    write_pairs(source, "text-test3.txt", ["a", "b"], [10, 15], 1)
    write_pairs(source, "text-test4.txt", ["a", "c"], [11, 25], 2)
    write_pairs(source, "text-test1.txt", ["a"], [5], 3)
    timed = (
        text_stream(suite, source)
        .select("id", F.from_unixtime(F.col("temperature")).alias("eventTime").cast("timestamp"))
        .withWatermark("eventTime", "5 seconds")
    )
    step = stateful(
        flavour,
        timed,
        ["id"],
        processors.FirstEventTime(flavour.row_based),
        CHAINED_SCHEMA,
        time_mode="eventTime",
        output_event_time_column="outputTimestamp",
        output_mode="Append",
        tmp_path=tmp_path,
    )
    out: dict = {}
    writer = (
        step.groupBy(grouping)
        .count()
        .writeStream.queryName("chaining_ops_query")
        .foreachBatch(collect_into(out))
        .outputMode("append")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
    )
    query = run_to_end(writer)
    assert query.name == "chaining_ops_query"
    counted = {batch: {(row.outputTimestamp, row["count"]) for row in rows} for batch, rows in out.items()}
    second = datetime.datetime(1970, 1, 1)
    assert counted == {
        0: set(),
        1: {(second + datetime.timedelta(seconds=10), 1)},
        2: {(second + datetime.timedelta(seconds=11), 1), (second + datetime.timedelta(seconds=15), 1)},
    }


def _grouping_cols(suite, flavour, tmp_path, initial_state=None):
    source = tmp_path / "input"
    lines = [f"{a},{b},{c}" for a, b, c in zip([0, 0, 1, 1], [123, 46, 146, 346], [1, 1, 2, 2], strict=True)]
    write_lines(source, "text-test1.txt", lines, 1)
    frame = text_stream(suite, source, (("id1", "string"), ("temperature", "int"), ("id2", "string")))
    schema = "id1 string, id2 string, value string"
    out: dict = {}
    stepped = stateful(
        flavour,
        frame,
        ["id1", "id2"],
        processors.InitialSum(flavour.row_based),
        schema,
        initial_state=initial_state,
        tmp_path=tmp_path,
    )
    run_collecting(stepped, tmp_path / "checkpoint", out, query_name="this_query")
    return rows_of(out)


def test_non_contiguous_grouping_cols(suite, flavour, tmp_path):
    """``test_transform_with_state_non_contiguous_grouping_cols``."""
    assert _grouping_cols(suite, flavour, tmp_path) == {
        0: {Row(id1="0", id2="1", value=str(123 + 46)), Row(id1="1", id2="2", value=str(146 + 346))}
    }


def test_non_contiguous_grouping_cols_with_init_state(suite, flavour, tmp_path):
    """``..._non_contiguous_grouping_cols_with_init_state``: the initial state's key columns are not first."""
    initial = suite.createDataFrame([(789, "0", "1"), (987, "3", "2")], "initVal int, id1 string, id2 string")
    assert _grouping_cols(suite, flavour, tmp_path, initial) == {
        0: {Row(id1="0", id2="1", value=str(789 + 123 + 46)), Row(id1="1", id2="2", value=str(146 + 346))}
    }


COMPOSITE_STATE_SCHEMA = StructType(
    [
        StructField(name, StringType(), True)
        for name in ("id", "value_arr", "list_state_arr", "map_state_arr", "nested_map_state_arr")
    ]
)


def test_composite_type(suite, flavour, tmp_path):
    """``test_transform_with_state_in_pandas_composite_type``: structs in state read back as ``Row``."""

    def expected(key, ids, listed, extra):
        attributes = {"key1": [1], "key2": [10], **({key: [extra]} if extra else {})}
        confs = {"e1": {"e2": 5, "e3": 10, **({key: extra} if extra else {})}}
        return Row(
            id=key,
            value_arr=ids,
            list_state_arr=listed,
            map_state_arr=json.dumps(attributes, sort_keys=True),
            nested_map_state_arr=json.dumps(confs, sort_keys=True),
        )

    got = _basic(
        suite, flavour, tmp_path, processors.CompositeStates(flavour.row_based), COMPOSITE_STATE_SCHEMA
    )
    assert got == {
        0: {expected("0", "0", "0", None), expected("1", "0", "0", None)},
        1: {expected("0", "669", "0,669", 669), expected("1", "252", "0,252", 252)},
    }


INNER = StructType(
    [
        StructField("intValue", IntegerType(), True),
        StructField("doubleValue", DoubleType(), True),
        StructField("arrayValue", ArrayType(StringType()), True),
        StructField("mapValue", MapType(StringType(), StringType()), True),
    ]
)
COMPOSITE_OUTPUT_SCHEMA = StructType(
    [
        StructField("primitiveValue", StringType(), True),
        StructField("listOfPrimitive", ArrayType(StringType()), True),
        StructField("mapOfPrimitive", MapType(StringType(), StringType()), True),
        StructField("listOfComposite", ArrayType(INNER), True),
        StructField("mapOfComposite", MapType(StringType(), INNER), True),
    ]
)


def _composite_row(key: str, count: int) -> Row:
    def inner(i, scale_int, scale_float):
        return Row(
            intValue=i * scale_int,
            doubleValue=float(i * scale_float),
            arrayValue=[f"elem_{i}_{j}" for j in range(i + 1)],
            mapValue={f"map_{i}_{j}": f"val_{i}_{j}" for j in range(i + 1)},
        )

    return Row(
        primitiveValue=f"key_{key}_count_{count}",
        listOfPrimitive=[f"item_{i}" for i in range(count)],
        mapOfPrimitive={f"key{i}": f"value{i}" for i in range(count)},
        listOfComposite=[inner(i, 1, 1.5) for i in range(count)],
        mapOfComposite={f"nested_key{i}": inner(i, 10, 2.5) for i in range(count)},
    )


def test_composite_output_schema(suite, flavour, tmp_path):
    """``test_composite_output_schema``: arrays, maps and structs in the output rows."""
    out: dict = {}
    source = tmp_path / "input"
    write_resource(source, 1)
    write_resource(source, 2)
    frame = stateful(
        flavour,
        text_stream(suite, source),
        ["id"],
        processors.CompositeOutput(flavour.row_based),
        COMPOSITE_OUTPUT_SCHEMA,
        tmp_path=tmp_path,
    )
    run_collecting(frame, tmp_path / "checkpoint", out)
    ordered = {batch: sorted(rows, key=lambda row: row.primitiveValue) for batch, rows in out.items()}
    assert ordered == {
        0: [_composite_row("0", 2), _composite_row("1", 2)],
        1: [_composite_row("0", 5), _composite_row("1", 4)],
    }


def test_timers_single_partition(suite, flavour, tmp_path):
    """``test_transform_with_state_with_timers_single_partition``: the timer scenarios on one partition."""
    with session_conf(suite, {"spark.sql.shuffle.partitions": "1"}):
        assert _event_time(
            suite, flavour, tmp_path / "event", processors.MaxEventTime(flavour.row_based)
        ) == {
            0: _stamps(("a", "20"), ("a-expired", "0")),
            1: _stamps(("a", "4"), ("a-expired", "10000")),
            2: _stamps(("a", "15"), ("a-expired", "10000")),
        }
        _proc_timer(suite, flavour, tmp_path / "processing")


def _chunk_schema():
    return StructType([StructField("id", StringType(), True), StructField("chunkCount", IntegerType(), True)])


def _chunks(*pairs):
    return {Row(id=key, chunkCount=count) for key, count in pairs}


@pytest.mark.parametrize(
    ("setting", "small"),
    [
        ({"spark.sql.execution.arrow.maxRecordsPerBatch": "1"}, True),
        ({"spark.sql.execution.arrow.maxRecordsPerBatch": "-1"}, False),
        ({"spark.sql.execution.arrow.maxBytesPerBatch": "2"}, True),
        ({"spark.sql.execution.arrow.maxBytesPerBatch": "100000"}, False),
    ],
    ids=["records-1", "records-unlimited", "bytes-2", "bytes-100000"],
)
def test_arrow_batch_limits(suite, flavour, tmp_path, setting, small):
    """``..._with_records_limit`` / ``..._with_bytes_limit``: a key's rows come in chunks."""
    if flavour.row_based:
        pytest.skip("Spark's suite runs it for the pandas API only: the row-based one hands rows one by one")
    expected = (
        {0: _chunks(("0", 2), ("1", 2)), 1: _chunks(("0", 3), ("1", 2))}
        if small
        else {0: _chunks(("0", 1), ("1", 1)), 1: _chunks(("0", 1), ("1", 1))}
    )
    initial = suite.createDataFrame([("0", 789), ("3", 987)], "id string, initVal int")
    with session_conf(suite, setting):
        assert (
            _basic(
                suite, flavour, tmp_path / "plain", processors.ChunkCount(flavour.row_based), _chunk_schema()
            )
            == expected
        )
        got = _basic(
            suite,
            flavour,
            tmp_path / "initial",
            processors.ChunkCount(flavour.row_based),
            _chunk_schema(),
            initial_state=initial,
        )
        assert got == expected


def test_large_values(suite, flavour, tmp_path):
    """``test_transform_with_state_large_values``: 512 KiB values in value, list and map states."""
    large = "a" * 512 * 1024
    schema = StructType(
        [
            StructField(name, StringType(), True)
            for name in ("id", "valueStateResult", "listStateResult", "mapStateResult")
        ]
    )
    expected = {
        Row(
            id=key,
            valueStateResult=large,
            listStateResult=f"{large},{large}b,{large}c",
            mapStateResult=f"large_string_key:{large}",
        )
        for key in ("0", "1")
    }
    assert _basic(
        suite, flavour, tmp_path, processors.LargeValues(flavour.row_based), schema, single_batch=True
    ) == {0: expected}


def _evolve(suite, flavour, tmp_path, source, processor, name=None):
    """Spark's ``_run_evolution_test``: one run over what is new in ``source``; the value of key "0"."""
    schema = StructType(
        [StructField("id", StringType(), True), StructField("value", processor.state_schema, True)]
    )
    out: dict = {}
    frame = stateful(flavour, text_stream(suite, source), ["id"], processor, schema, tmp_path=tmp_path)
    run_collecting(frame, tmp_path / "checkpoint", out, query_name="evolution_test")
    return next(row.value for rows in out.values() for row in rows if row.id == "0")


AVRO = {"spark.sql.streaming.stateStore.encodingFormat": "avro"}


def test_schema_evolution_scenarios(suite, flavour, tmp_path):
    """``test_schema_evolution_scenarios``: add, remove, reorder fields and widen a type across restarts."""
    source = tmp_path / "input"
    with session_conf(suite, AVRO):
        write_resource(source, 1)
        value = _evolve(suite, flavour, tmp_path, source, processors.BasicRecord(flavour.row_based))
        assert (value["id"], value["name"]) == (0, "name-0")
        write_resource(source, 2)
        value = _evolve(suite, flavour, tmp_path, source, processors.RecordWithAddedFields(flavour.row_based))
        assert (
            value["id"] == 0 and value["count"] is None and value["active"] is None and value["score"] is None
        )
        write_resource(source, 3)
        value = _evolve(
            suite, flavour, tmp_path, source, processors.RecordWithRemovedFields(flavour.row_based)
        )
        assert (value["id"], value["name"]) == (0, "name-00")
        write_resource(source, 4)
        value = _evolve(suite, flavour, tmp_path, source, processors.RecordReordered(flavour.row_based))
        assert (value["id"], value["name"]) == (0, "name-00")
        write_resource(source, 5)
        value = _evolve(suite, flavour, tmp_path, source, processors.RecordUpcast(flavour.row_based))
        assert (value["id"], value["name"]) == (1, "name-0")


def test_schema_evolution_fails(suite, flavour, tmp_path):
    """``test_schema_evolution_fails``: narrowing a field's type back (long to int) is refused."""
    source = tmp_path / "input"
    with session_conf(suite, AVRO):
        write_resource(source, 1)
        value = _evolve(suite, flavour, tmp_path, source, processors.RecordWithAddedFields(flavour.row_based))
        assert value["count"] == 100 and value["active"]
        write_resource(source, 2)
        assert (
            _evolve(suite, flavour, tmp_path, source, processors.RecordUpcast(flavour.row_based))["name"]
            == "name-0"
        )
        write_resource(source, 3)
        with pytest.raises(Exception, match="(?s)STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION|cannot narrow"):
            _evolve(suite, flavour, tmp_path, source, processors.BasicRecord(flavour.row_based))


def test_not_nullable_fails(suite, flavour, tmp_path):
    """``test_not_nullable_fails``: a state schema with non-nullable fields is refused."""
    source = tmp_path / "input"
    write_resource(source, 1)
    with session_conf(suite, AVRO), pytest.raises(Exception, match="(?i)must be nullable"):
        _evolve(suite, flavour, tmp_path, source, processors.BasicRecordNotNullable(flavour.row_based))


# -- test_pandas_transform_with_state_state_variable.py ---------------------------------------


def test_non_exist_value_state(suite, flavour, tmp_path):
    """``test_transform_with_state_non_exist_value_state``."""
    got = _basic(suite, flavour, tmp_path, processors.AbsentValueReader(flavour.row_based), single_batch=True)
    assert got == {0: _counts(("0", "0"), ("1", "0"))}


@pytest.mark.parametrize(
    "processor", [processors.ListStates, processors.ListStatesWithTTL], ids=["plain", "ttl"]
)
def test_list_state(suite, flavour, tmp_path, processor):
    """``test_transform_with_state_list_state`` and ``..._list_state_large_ttl``."""
    got = _basic(
        suite, flavour, tmp_path, processor(flavour.row_based), single_batch=True, time_mode="processingTime"
    )
    assert got == {0: _counts(("0", "2"), ("1", "2"))}


def test_list_state_large_list(suite, flavour, tmp_path):
    """``test_transform_with_state_list_state_large_list``: put and appendList of 100 and 90 elements."""
    schema = "id string, prevElements string, updatedElements string"
    got = _basic(suite, flavour, tmp_path, processors.GrowingList(flavour.row_based), schema)
    first, second = ",".join(map(str, range(100))), ",".join(map(str, range(190)))
    assert got == {
        0: {Row(id=key, prevElements="", updatedElements=first) for key in ("0", "1")},
        1: {Row(id=key, prevElements=first, updatedElements=second) for key in ("0", "1")},
    }


@pytest.mark.parametrize(
    "processor", [processors.MapStates, processors.MapStatesWithTTL], ids=["plain", "ttl"]
)
def test_map_state(suite, flavour, tmp_path, processor):
    """``test_transform_with_state_map_state`` and ``..._map_state_large_ttl``."""
    mode = "processingTime" if processor is processors.MapStatesWithTTL else "None"
    got = _basic(suite, flavour, tmp_path, processor(flavour.row_based), single_batch=True, time_mode=mode)
    assert got == {0: _counts(("0", "2"), ("1", "2"))}


def test_value_state_ttl_basic(suite, flavour, tmp_path):
    """``test_value_state_ttl_basic``: a TTL state that does not expire behaves as a plain one."""
    got = _basic(
        suite,
        flavour,
        tmp_path,
        processors.ViolationsCounterWithTTL(flavour.row_based),
        time_mode="processingTime",
    )
    assert got == {0: _counts(("0", "2"), ("1", "2")), 1: _counts(("0", "3"), ("1", "2"))}


def _init_state(suite, flavour, tmp_path, processor, *, time_mode="None", initial_state=None, after=None):
    """Spark's ``_test_transform_with_state_init_state``: resource 1, then keys 0 and 3."""
    source = tmp_path / "input"
    write_resource(source, 1)
    write_pairs(source, "text-test2.txt", [0, 3], [67, 12], 2)
    if initial_state is None:
        initial_state = suite.createDataFrame([("0", 789), ("3", 987)], "id string, initVal int")
    out: dict = {}
    frame = stateful(
        flavour,
        text_stream(suite, source),
        ["id"],
        processor,
        "id string, value string",
        time_mode=time_mode,
        initial_state=initial_state,
        tmp_path=tmp_path,
    )
    if after is not None:
        frame = after(frame)
    run_collecting(frame, tmp_path / "checkpoint", out, query_name="this_query")
    return rows_of(out)


def _values(*pairs):
    return {Row(id=key, value=str(value)) for key, value in pairs}


def test_init_state(suite, flavour, tmp_path):
    """``test_transform_with_state_init_state``: the initial state is handled once, in the first batch."""
    assert _init_state(suite, flavour, tmp_path, processors.InitialSum(flavour.row_based)) == {
        0: _values(("0", 789 + 123 + 46), ("1", 146 + 346)),
        1: _values(("0", 789 + 123 + 46 + 67), ("3", 987 + 12)),
    }


def test_init_state_with_extra_transformation(suite, flavour, tmp_path):
    """``test_transform_with_state_init_state_with_extra_transformation``: a select after the step."""

    def after(frame):
        return frame.select(
            F.col("id").cast("string").alias("key"), F.to_json(F.struct(F.col("value"))).alias("value")
        )

    got = _init_state(suite, flavour, tmp_path, processors.InitialSum(flavour.row_based), after=after)
    assert got == {
        0: {
            Row(key="0", value=f'{{"value":"{789 + 123 + 46}"}}'),
            Row(key="1", value=f'{{"value":"{146 + 346}"}}'),
        },
        1: {
            Row(key="0", value=f'{{"value":"{789 + 123 + 46 + 67}"}}'),
            Row(key="3", value=f'{{"value":"{987 + 12}"}}'),
        },
    }


def _init_state_with_timers(suite, flavour, tmp_path):
    got = _init_state(
        suite,
        flavour,
        tmp_path,
        processors.InitialSumWithTimers(flavour.row_based),
        time_mode="processingTime",
    )
    fired = {row.id for row in got[0] if "expired" in row.id}
    assert fired == {"0-expired", "3-expired"}
    assert got[0] - {row for row in got[0] if "expired" in row.id} == _values(
        ("0", 789 + 123 + 46), ("1", 146 + 346)
    )
    assert got[1] == _values(("0", 789 + 123 + 46 + 67), ("3", 987 + 12))


def test_init_state_with_timers(suite, flavour, tmp_path):
    """``test_transform_with_state_init_state_with_timers``: timers armed by the initial state's handler."""
    _init_state_with_timers(suite, flavour, tmp_path)


def test_init_state_timers_single_partition(suite, flavour, tmp_path):
    """``test_transform_with_state_with_timers_single_partition`` (state-variable suite), its timer half."""
    with session_conf(suite, {"spark.sql.shuffle.partitions": "1"}):
        _init_state_with_timers(suite, flavour, tmp_path)


@pytest.mark.parametrize("with_initial_state", [False, True], ids=["plain", "initial-state"])
def test_map_state_metadata(suite, flavour, tmp_path, with_initial_state):
    """``test_transform_with_map_state_metadata`` (and ``..._with_init_state``): a map with TTL and an
    unused list, in one batch (Spark's checks of its readers sit in a branch of later batches, which
    one batch never reaches; ``test_list_state_metadata`` reads them)."""
    initial = None
    if with_initial_state:  # a no-op initial state: the processor has no handleInitialState
        initial = suite.createDataFrame([("0", 789), ("3", 987)], "id string, temperature int")
    got = _basic(
        suite,
        flavour,
        tmp_path,
        processors.MapStatesWithTTL(flavour.row_based),
        single_batch=True,
        time_mode="processingTime",
        initial_state=initial,
    )
    assert got == {0: _counts(("0", "2"), ("1", "2"))}


def test_list_state_metadata(suite, flavour, tmp_path):
    """``test_transform_with_list_state_metadata``: during batch 1, the operator's state variables and
    the list states of batch 0's checkpoint, flattened and not."""
    checkpoint = tmp_path / "checkpoint"
    read: dict = {}

    def check(frame, batch_id):
        if batch_id == 0:
            return
        session = frame.sparkSession
        first = read_state_variable(session, flavour, checkpoint, "listState1", flatten=True)
        read["first"] = sorted(
            tuple(row) for row in first.selectExpr("key.id", "list_element.temperature").collect()
        )
        second = read_state_variable(session, flavour, checkpoint, "listState2", flatten=False)
        read["second"] = sorted(
            (row.id, sorted(row.values))
            for row in second.selectExpr("key.id AS id", "list_value.temperature AS values").collect()
        )
        metadata = state_metadata(session, flavour, checkpoint)
        properties = json.loads(metadata.select("operatorProperties").collect()[0][0])
        read["variables"] = sorted(
            (v["stateName"], v["stateVariableType"]) for v in properties["stateVariables"]
        )

    got = _basic(
        suite,
        flavour,
        tmp_path,
        processors.ListStates(flavour.row_based),
        time_mode="processingTime",
        check=check,
    )
    assert got == {0: _counts(("0", "2"), ("1", "2")), 1: _counts(("0", "3"), ("1", "2"))}
    assert read["first"] == [(key, value) for key in ("0", "1") for value in (20, 20, 111, 120, 120)]
    assert read["second"] == [(key, [20, 20, 120, 120, 222]) for key in ("0", "1")]
    assert read["variables"] == [
        ("$procTimers_keyToTimestamp", "TimerState"),
        ("listState1", "ListState"),
        ("listState2", "ListState"),
        ("listStateTimestamp", "ListState"),
    ]


def _restart_with_list_initial_state(suite, flavour, tmp_path):
    first_checkpoint = tmp_path / "first" / "checkpoint"
    got = _basic(
        suite, flavour, tmp_path / "first", processors.ListStates(flavour.row_based), single_batch=True
    )
    assert got == {0: _counts(("0", "2"), ("1", "2"))}
    listed = read_state_variable(suite, flavour, first_checkpoint, "listState1").selectExpr(
        "key.id AS id", "list_element.temperature AS initVal"
    )
    second = tmp_path / "second"
    read: dict = {}
    got = _init_state(
        suite, flavour, second, processors.InitialListAppender(flavour.row_based), initial_state=listed
    )
    assert got == {
        0: _values(("0", 123 + 46), ("1", 146 + 346)),
        1: _values(("0", 123 + 46 + 67), ("3", 12)),
    }
    appended = read_state_variable(suite, flavour, second / "checkpoint", "list_state").selectExpr(
        "key.id AS id", "list_element.value AS value"
    )
    for row in appended.collect():
        read.setdefault(row.id, []).append(row.value)
    assert {key: sorted(values) for key, values in read.items()} == {
        "0": [20, 20, 111, 120, 120],
        "1": [20, 20, 111, 120, 120],
    }


def test_restart_with_multiple_rows_init_state(suite, flavour, tmp_path):
    """``test_transform_with_state_restart_with_multiple_rows_init_state``: a query's list state, read
    from its checkpoint, is the initial state of a new query (several rows per key)."""
    _restart_with_list_initial_state(suite, flavour, tmp_path)


def test_restart_with_multiple_rows_init_state_single_partition(suite, flavour, tmp_path):
    """``test_transform_with_state_with_timers_single_partition`` (state-variable suite), its second half."""
    with session_conf(suite, {"spark.sql.shuffle.partitions": "1"}):
        _restart_with_list_initial_state(suite, flavour, tmp_path)


def test_value_state_metadata(suite, flavour, tmp_path):
    """``test_transform_with_value_state_metadata``: during batch 1, the state variables, a value
    state's change feed from batch 0, and each partition's state, which equals its changes."""
    checkpoint = tmp_path / "checkpoint"
    read: dict = {}

    def check(frame, batch_id):
        if batch_id == 0:
            return
        session = frame.sparkSession
        metadata = state_metadata(session, flavour, checkpoint)
        properties = json.loads(metadata.select("operatorProperties").collect()[0][0])
        read["variables"] = sorted(
            (v["stateName"], v["stateVariableType"]) for v in properties["stateVariables"]
        )
        changes = read_state_variable(
            session, flavour, checkpoint, "numViolations", change_start=0
        ).selectExpr("change_type", "key.id AS groupingKey", "value.value AS value", "partition_id")
        logged = changes.collect()
        read["changes"] = sorted(tuple(row)[:3] for row in logged)
        for partition in {row.partition_id for row in logged}:
            state = read_state_variable(session, flavour, checkpoint, "numViolations", partition=partition)
            snapshot = sorted(tuple(row) for row in state.selectExpr("key.id", "value.value").collect())
            changed = sorted((row.groupingKey, row.value) for row in logged if row.partition_id == partition)
            read.setdefault("partitions", []).append(snapshot == changed)

    rocksdb_changelog = {"spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true"}
    with session_conf(suite, rocksdb_changelog):
        got = _basic(
            suite,
            flavour,
            tmp_path,
            processors.ViolationsCounter(flavour.row_based),
            time_mode="processingTime",
            check=check,
        )
    assert got == {0: _counts(("0", "2"), ("1", "2")), 1: _counts(("0", "3"), ("1", "2"))}
    assert read["variables"] == [
        ("$procTimers_keyToTimestamp", "TimerState"),
        ("numViolations", "ValueState"),
        ("tempState", "ValueState"),
    ]
    assert read["changes"] == [("update", "0", 1), ("update", "1", 2)]
    assert read["partitions"] and all(read["partitions"])
