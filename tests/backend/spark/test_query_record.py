"""A location's query is checked against what it was first started with: keys, time mode, idle batches."""

import json

import pytest

from dstl.backend.spark import StatefulProcessor, transform_with_state
from dstl.backend.spark._private.query_record import (
    QUERY_RECORD_FILE,
    QueryShape,
    key_types,
    schema_change_problem,
    settled_shape,
)
from dstl.spi import ConfigError

from .test_query import local_config

USER_KEY = (("user", "string"),)


def shape(keys=USER_KEY, mode="processing", idle=True):
    return QueryShape(keys, mode, idle)


def test_the_first_start_is_recorded_and_kept(tmp_path):
    location = str(tmp_path / "a")
    assert settled_shape(location, shape()) == shape()
    # idle batches stay as recorded (Spark's checkpoint records the sources)
    assert settled_shape(location, shape(idle=False)) == shape()
    assert json.loads((tmp_path / "a" / QUERY_RECORD_FILE).read_text())["key_columns"] == [["user", "string"]]


def test_a_location_spark_ran_in_without_a_record_has_no_idle_batches(tmp_path):
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text("v1\n{}\n")
    assert settled_shape(str(tmp_path), shape()) == shape(idle=False)
    assert settled_shape(str(tmp_path), shape()) == shape(idle=False)  # recorded now


def test_other_key_columns_or_time_mode_are_refused_naming_both(tmp_path):
    location = str(tmp_path)
    settled_shape(location, shape())
    with pytest.raises(
        ConfigError, match=r"key columns \[user string, region string\] differ from \[user string\]"
    ):
        settled_shape(location, shape(keys=(*USER_KEY, ("region", "string"))))
    with pytest.raises(ConfigError, match=r"key columns \[user bigint\] differ .* silently start empty"):
        settled_shape(location, shape(keys=(("user", "bigint"),)))
    with pytest.raises(
        ConfigError, match="time_mode 'event' differs from 'processing'.*never fire.*savepoint"
    ):
        settled_shape(location, shape(mode="event"))


@pytest.mark.parametrize(
    "content",
    [
        b"{",
        b"[]",
        b'{"key_columns": "user", "time_mode": "none", "idle_batches": false}',
        b'{"key_columns": [["user"]], "time_mode": "none", "idle_batches": false}',
        b'{"key_columns": [], "time_mode": 3, "idle_batches": false}',
        b'{"key_columns": [], "time_mode": "none", "idle_batches": "no"}',
        b"\xff" * 10,
        *(
            json.dumps(
                {
                    "key_columns": [],
                    "time_mode": "none",
                    "idle_batches": False,
                    "state_schemas": {"s": {"value": v}},
                }
            ).encode()
            for v in ("{", "[]", json.dumps({"fields": [{"name": 1}]}), 7)
        ),
        *(
            json.dumps({"key_columns": [], "time_mode": "none", "idle_batches": False, field: value}).encode()
            for field, value in (
                ("value_versions", {"s": []}),  # a state with no schema version
                ("value_versions", {"s": ["{"]}),
                ("value_versions", ["x"]),
                ("state_kinds", {"s": "set"}),  # no such kind
                ("state_kinds", {"s": 3}),
            )
        ),
    ],
)
def test_a_damaged_record_is_refused_with_the_fix(tmp_path, content):
    (tmp_path / QUERY_RECORD_FILE).write_bytes(content)
    with pytest.raises(ConfigError, match="is damaged .* Restore it, or remove it"):
        settled_shape(str(tmp_path), shape())


class _Nothing(StatefulProcessor):
    def init(self, context):
        pass

    def handle_input_rows(self, key, rows):
        return None


def test_a_restart_with_other_keys_is_refused_at_the_call_before_anything_runs(spark, tmp_path):
    directory = tmp_path / "in"
    directory.mkdir()
    (directory / "part-0.json").write_text(json.dumps({"user": "a", "region": "eu", "n": 1}) + "\n")
    frame = spark.readStream.schema("user string, region string, n int").json(str(directory))

    def start(key_columns, **extra):
        return transform_with_state(
            frame,
            key_columns=key_columns,
            processor=_Nothing,
            output_schema="user string",
            sink=lambda batch, batch_id: None,
            checkpoint_location=str(tmp_path / "chk"),
            config=local_config(tmp_path),
            trigger={"availableNow": True},
            **extra,
        )

    query = start(["user"])
    query.await_termination(timeout=300)
    assert query.exception() is None
    offsets = sorted(path.name for path in (tmp_path / "chk" / "offsets").iterdir())
    with pytest.raises(ConfigError, match=r"key columns \[region string\] differ from \[user string\]"):
        start(["region"])
    with pytest.raises(ConfigError, match="time_mode 'processing' differs from 'none'"):
        start(["user"], time_mode="ProcessingTime")
    assert sorted(path.name for path in (tmp_path / "chk" / "offsets").iterdir()) == offsets  # nothing ran


def test_integer_keys_of_any_width_hash_alike_and_stay_compatible(spark):
    narrow = spark.createDataFrame([], "n int, x float, s string")
    wide = spark.createDataFrame([], "n long, x double, s string")
    assert (
        key_types(narrow, ["n", "x", "s"])
        == key_types(wide, ["n", "x", "s"])
        == (
            ("n", "bigint"),
            ("x", "double"),
            ("s", "string"),
        )
    )


def _schema(ddl_fields):
    return json.dumps(
        {
            "type": "struct",
            "fields": [
                {"name": n, "type": t, "nullable": nullable, "metadata": {}} for n, t, nullable in ddl_fields
            ],
        }
    )


COUNT = _schema([("count", "integer", True)])


@pytest.mark.parametrize(
    ("after", "problem"),
    [
        (_schema([("count", "long", True)]), None),  # widened
        (_schema([("count", "integer", True), ("extra", "string", True)]), None),  # a nullable field added
        (_schema([("count", "string", True)]), "field 'count' changed from integer to string"),
        (_schema([("total", "integer", True)]), "field 'count' became 'total'"),
        (_schema([]), "fields ['count'] were removed"),
        (_schema([("count", "integer", False)]), "field 'count' is no longer nullable"),
        (_schema([("count", "integer", True), ("x", "long", False)]), "fields ['x'] were added without"),
    ],
)
def test_schema_changes_follow_sparks_evolution_rules(after, problem):
    found = schema_change_problem(COUNT, after)
    assert found == problem if problem is None else problem in found


@pytest.mark.parametrize(
    ("after", "problem"),
    [
        (_schema([("count", "long", True)]), None),  # widened
        (_schema([("extra", "string", True), ("count", "integer", True)]), None),  # added before, reordered
        (_schema([("total", "integer", True)]), None),  # count removed, total added: both allowed
        (_schema([]), None),  # every field removed
        (_schema([("count", "string", True)]), "field 'count' changed from integer to string"),
        (_schema([("count", "short", True)]), "a stored value cannot narrow"),
        (_schema([("count", "integer", False)]), "field 'count' is no longer nullable"),
        (_schema([("x", "long", False)]), "fields ['x'] were added without"),
    ],
)
def test_value_schemas_evolve_by_field_name_as_sparks_avro_encoding(after, problem):
    found = schema_change_problem(COUNT, after, by_name=True)
    assert found == problem if problem is None else problem in found


def test_a_value_schema_is_checked_against_every_schema_its_values_were_written_with(tmp_path):
    """int, then long (widened), then int again: the values written as long cannot narrow."""
    location = str(tmp_path)
    wide = {"count": {"value": _schema([("count", "long", True)])}}
    settled_shape(location, QueryShape(USER_KEY, "none", False, {"count": {"value": COUNT}}))
    recorded = settled_shape(location, QueryShape(USER_KEY, "none", False, wide))
    assert recorded.versions_of("count") == (COUNT, wide["count"]["value"])
    with pytest.raises(ConfigError, match="changed from long to integer: a stored value cannot narrow"):
        settled_shape(location, QueryShape(USER_KEY, "none", False, {"count": {"value": COUNT}}))
    # a schema declared again keeps its version: values name it by index
    removed = {"count": {"value": _schema([("other", "string", True)])}}
    again = settled_shape(location, QueryShape(USER_KEY, "none", False, removed))
    assert (
        again.versions_of("count")[-1] == removed["count"]["value"] and len(again.versions_of("count")) == 3
    )


def test_a_state_schema_is_evolved_or_refused_at_restart(tmp_path):
    location = str(tmp_path)
    settled_shape(location, QueryShape(USER_KEY, "none", False, {"count": {"value": COUNT}}))
    widened = {"count": {"value": _schema([("count", "long", True)])}}
    assert settled_shape(location, QueryShape(USER_KEY, "none", False, widened)).state_schemas == widened
    with pytest.raises(
        ConfigError, match="state 'count' now declares the value schema .* changed from integer to string"
    ):
        settled_shape(
            location,
            QueryShape(USER_KEY, "none", False, {"count": {"value": _schema([("count", "string", True)])}}),
        )
    # the evolved schema was recorded: going back from long to int is refused too
    with pytest.raises(ConfigError, match="changed from long to integer"):
        settled_shape(location, QueryShape(USER_KEY, "none", False, {"count": {"value": COUNT}}))


def _declaring(**kinds):
    """A shape whose processor declares states of these kinds (each an int value)."""
    return QueryShape(USER_KEY, "none", False, {name: {"value": COUNT} for name in kinds}, state_kinds=kinds)


def test_a_renamed_state_is_refused_unless_its_drop_is_declared(tmp_path):
    """dstl keeps a state's data by name: a state gone while one of its kind arrives looks like a rename."""
    location = str(tmp_path)
    settled_shape(location, _declaring(total="value", seen="list"))
    with pytest.raises(ConfigError, match=r"state 'total' \(value\) is no longer declared and \['sum'\]"):
        settled_shape(location, _declaring(sum="value", seen="list"))
    settled_shape(location, _declaring(seen="list", extra="map"))  # another kind arrived: no rename
    # the record follows the declaration: 'total' went, so a new value state later is no rename
    assert settled_shape(location, _declaring(seen="list", extra="map", sum="value")).state_kinds == {
        "seen": "list",
        "extra": "map",
        "sum": "value",
    }


def test_a_declared_drop_lets_the_restart_go_on(tmp_path):
    location = str(tmp_path)
    settled_shape(location, _declaring(total="value"))
    settled = settled_shape(location, _declaring(sum="value"), {"dstl.spark.dropped-states": "other, total"})
    assert settled.state_kinds == {"sum": "value"}
