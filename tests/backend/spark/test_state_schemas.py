"""A PySpark processor's declared state schemas: learned at the call, enforced on write, typed on read."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from dstl.backend.spark import transform_with_state
from dstl.backend.spark._private.state_schemas import TypedValues, declared_schemas
from dstl.spi import ConfigError

from .test_query import local_config

pyspark_api = pytest.importorskip("pyspark.sql.streaming.stateful_processor")
Row = pytest.importorskip("pyspark.sql").Row

PROFILE = "count long, profile struct<name string, age int>"


class Profiles(pyspark_api.StatefulProcessor):
    """Keeps a count and a profile struct per user; emits what it read back before its update."""

    schema = PROFILE

    def init(self, handle):
        self.handle = handle
        self.state = handle.getValueState("state", self.schema)
        self.visits = handle.getMapState("visits", "day string", "n long")

    def handleInputRows(self, key, rows, timerValues):
        before = self.state.get()
        seen = "none" if before is None else f"{type(before).__name__}:{before}"
        total = (before["count"] if before else 0) + sum(len(frame) for frame in rows)
        self.state.update((total, Row(name=key[0], age=total)))
        self.visits.updateValue(("mon",), (total,))
        yield pd.DataFrame({"user": [key[0]], "seen": [seen]})

    def close(self):
        pass


class WrongType(Profiles):
    def handleInputRows(self, key, rows, timerValues):
        self.state.update(("many", None))  # a string in a long field
        yield from ()


def test_declared_schemas_are_learned_by_running_init_on_the_driver(spark):
    schemas = declared_schemas(Profiles)
    assert set(schemas) == {"state", "visits"}
    assert json.loads(schemas["state"]["value"])["fields"][1]["name"] == "profile"
    assert json.loads(schemas["visits"]["key"])["fields"][0]["name"] == "day"


def test_an_unparsable_schema_or_a_failing_init_is_refused_at_the_call(spark):
    class Unparsable(Profiles):
        schema = "count lonnng"

    with pytest.raises(ConfigError, match="state 'state' declares the schema 'count lonnng'"):
        declared_schemas(Unparsable)

    class Failing(Profiles):
        def init(self, handle):
            raise RuntimeError("no")

    with pytest.raises(ConfigError, match="Failing.init failed on the driver"):
        declared_schemas(Failing)


def test_values_are_checked_on_write_and_typed_on_read(spark):
    typed = TypedValues("state", declared_schemas(Profiles)["state"]["value"])
    stored = typed.write((3, Row(name="a", age=3)))
    value = typed.read(stored)
    assert value["count"] == 3 and value.profile.name == "a" and isinstance(value.profile, Row)
    assert typed.read((3, {"name": "b", "age": 1})).profile.age == 1  # a struct stored as a dict
    with pytest.raises(TypeError, match=r"state 'state': field 'count' .* cannot hold 'many'"):
        typed.write(("many", None))
    with pytest.raises(TypeError, match="a value of 1 fields for its schema's 2"):
        typed.write((3,))
    # unversioned (a tuple): a value without a field added since reads it as null; one with more is refused
    assert typed.read((5,)).profile is None
    with pytest.raises(TypeError, match="removing fields is not a compatible change"):
        typed.read((1, None, "extra"))


def _write(directory, index, users):
    path = directory / f"part-{index:03d}.json"
    path.write_text("".join(json.dumps({"user": user}) + "\n" for user in users))
    os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))


def _run(spark, tmp_path, processor, out):
    def sink(frame, batch_id):
        out[batch_id] = sorted(tuple(row) for row in frame.collect())

    query = transform_with_state(
        spark.readStream.schema("user string").option("maxFilesPerTrigger", 1).json(str(tmp_path / "in")),
        key_columns=["user"],
        processor=processor,
        output_schema="user string, seen string",
        sink=sink,
        checkpoint_location=str(tmp_path / "chk"),
        config=local_config(tmp_path),
        trigger={"availableNow": True},
    )
    try:
        query.await_termination(timeout=300)
    except Exception as failure:  # PySpark raises the query's failure here
        return failure
    return query.exception()


def test_a_query_reads_its_values_as_rows_of_the_declared_schema(spark, tmp_path):
    (tmp_path / "in").mkdir()
    _write(tmp_path / "in", 0, ["a"])
    _write(tmp_path / "in", 1, ["a", "a"])
    out: dict[int, list[tuple]] = {}
    failure = _run(spark, tmp_path, Profiles, out)
    assert failure is None, failure
    assert out[0] == [("a", "none")]
    assert out[1] == [("a", "Row:Row(count=1, profile=Row(name='a', age=1))")]

    class Retyped(Profiles):
        schema = "count string, profile struct<name string, age int>"

    with pytest.raises(ConfigError, match="state 'state' now declares the value schema .* long to string"):
        _run(spark, tmp_path, Retyped, out)  # refused at the call: nothing ran

    class Grown(Profiles):
        schema = PROFILE + ", since long"

        def handleInputRows(self, key, rows, timerValues):
            before = self.state.get()
            yield pd.DataFrame({"user": [key[0]], "seen": [f"since={before.since}"]})

    _write(tmp_path / "in", 2, ["a"])
    assert _run(spark, tmp_path, Grown, out) is None
    assert out[2] == [("a", "since=None")]  # the field added since the value was written reads as null


def test_a_value_that_does_not_fit_fails_the_batch_naming_state_and_field(spark, tmp_path):
    (tmp_path / "in").mkdir()
    _write(tmp_path / "in", 0, ["a"])
    failure = str(_run(spark, tmp_path, WrongType, {}))
    assert "state 'state': field 'count'" in failure and "cannot hold 'many'" in failure, failure[:2000]


def _json(*fields):
    from pyspark.sql.types import StructType

    return StructType.fromDDL(", ".join(fields)).json()


def test_versioned_values_read_by_field_name_under_a_newer_schema(spark):
    """Spark's Avro evolution: a value names its schema; fields are added, removed and reordered by name."""
    first = _json("id int", "name string", "tags array<struct<k: string, v: string>>")
    later = _json("name string", "score double", "id bigint", "tags array<struct<k: string, v: string>>")
    versions = (first, later)
    old = TypedValues("state", first, versions=versions)
    stored = old.write((1, "a", [{"k": "env", "v": "prod"}]))
    assert stored == [0, 1, "a", [{"k": "env", "v": "prod"}]]  # a list: the version, then the fields
    value = TypedValues("state", later, versions=versions).read(stored)
    assert (value.name, value.score, value.id) == ("a", None, 1)
    assert value.tags == [Row(k="env", v="prod")]  # structs inside arrays read as Row too
    assert TypedValues("state", later, versions=versions).write(("b", 0.5, 2, None))[0] == 1
    # a tuple: a value stored before versions, read by position
    assert TypedValues("state", first, versions=versions).read((7,)).id == 7
    with pytest.raises(TypeError, match="stored with pickle by an earlier release"):
        TypedValues("state", later, versions=versions).read({"bytes": 40})  # what readers show of pickle
    with pytest.raises(
        TypeError, match="schema version 5, which the checkpoint location's record does not list"
    ):
        TypedValues("state", later, versions=versions).read([5, "x"])


def test_a_state_schema_with_fields_not_nullable_is_refused_at_the_call(spark):
    class Strict(Profiles):
        schema = "count long not null, profile struct<name string, age int>"

    with pytest.raises(ConfigError, match=r"state 'state' declares fields \['count'\] not nullable"):
        declared_schemas(Strict)


def test_a_pyspark_processors_state_is_stored_without_pickle(spark, tmp_path):
    """Its values are Spark SQL values: read-only tools decode them, no code of the checkpoint runs."""
    from dstl.backend.spark import read_state

    (tmp_path / "in").mkdir()
    _write(tmp_path / "in", 0, ["a", "a"])
    assert _run(spark, tmp_path, Profiles, {}) is None
    rows = read_state(spark, str(tmp_path / "chk"), config=local_config(tmp_path)).collect()
    stored = {row["state"]: json.loads(row["value"]) for row in rows if json.loads(row["key"]) == "a"}
    assert stored["state"] == [0, 2, ["a", 2]]  # [schema version, count, profile], not {"bytes": n}


def test_a_state_checkpointed_with_pickle_keeps_it_until_migrated():
    from dstl.backend.spark.pyspark_compat import _handle_class

    class Restored:
        def __init__(self, serializer):
            self.serializer = serializer

        def restored_serializer(self, name):
            return self.serializer if name == "old" else None

    handle = _handle_class()(Restored("pickle"), {}, {})
    assert handle._serializer("old") == "pickle"  # what the checkpoint holds reads as it was written
    assert handle._serializer("new") == "spark"
    assert _handle_class()(Restored("spark"), {}, {})._serializer("old") == "spark"


def test_a_declared_state_reads_typed_as_sparks_statestore_reader_gives_it(spark, tmp_path):
    from dstl.backend.spark import read_state_variable

    (tmp_path / "in").mkdir()
    _write(tmp_path / "in", 0, ["a", "a", "b"])
    assert _run(spark, tmp_path, Profiles, {}) is None
    location, config = str(tmp_path / "chk"), local_config(tmp_path)
    values = read_state_variable(spark, location, "state", config=config)
    assert values.columns == ["key", "value", "partition_id"]
    got = sorted((row.key.user, row.value["count"], row.value.profile.age) for row in values.collect())
    assert got == [("a", 2, 2), ("b", 1, 1)]
    visits = read_state_variable(spark, location, "visits", config=config)
    assert visits.columns == ["key", "user_map_key", "user_map_value", "partition_id"]
    assert sorted(
        tuple(r) for r in visits.selectExpr("key.user", "user_map_key.day", "user_map_value.n").collect()
    ) == [
        ("a", "mon", 2),
        ("b", "mon", 1),
    ]
    nested = read_state_variable(spark, location, "visits", flatten_collection_types=False, config=config)
    assert {row.key.user: row.map_value for row in nested.collect()}["a"] == {Row(day="mon"): Row(n=2)}
    with pytest.raises(ConfigError, match="the change feed of map state 'visits' is not typed"):
        read_state_variable(spark, location, "visits", read_change_feed=True, config=config)
    with pytest.raises(
        ConfigError, match=r"records no declared state 'total' \(declared: \['state', 'visits'\]\)"
    ):
        read_state_variable(spark, location, "total", config=config)


def test_a_deleted_states_calls_fail_as_on_spark_and_copying_it_does_not():
    import copy

    from pyspark.errors import PySparkRuntimeError

    from dstl.backend.spark.pyspark_compat import _DeletedState

    gone = _DeletedState("tempState")
    with pytest.raises(
        PySparkRuntimeError, match="Error checking value state exists: state 'tempState' was deleted"
    ):
        gone.exists()
    with pytest.raises(PySparkRuntimeError, match="Error updating value state"):
        gone.update([0, 1])
    assert isinstance(copy.deepcopy(gone), _DeletedState)  # dunder probes are no state calls
