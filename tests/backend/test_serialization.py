"""Value serializers: Spark SQL values round-trip without pickle, and hostile bytes build nothing else."""

import datetime
import decimal

import msgpack
import pytest

from dstl.backend.serialization import (
    SizeOnlySerializer,
    SparkValueSerializer,
    serializer_for,
    untrusted_serializer_for,
)

SPARK_VALUES = [
    None,
    True,
    -(2**63),
    1.5,
    "text",
    b"\x00bytes",
    datetime.datetime(2024, 2, 29, 23, 59, 59, 999_999),
    datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=-5))),
    datetime.date(1970, 1, 1),
    decimal.Decimal("-12345678901234567890.123456789012345678"),
    datetime.timedelta(days=-3, microseconds=7),
    [1, [2, {"k": [3]}]],
    {"nested": {"e1": 5}},
]


def test_spark_values_round_trip_with_their_types():
    serializer = SparkValueSerializer()
    assert serializer.loads(serializer.dumps(SPARK_VALUES)) == SPARK_VALUES
    assert serializer.loads(serializer.dumps((1, "a"))) == [1, "a"]  # tuples and rows come back as lists


def test_a_value_of_no_spark_type_is_refused_on_write():
    with pytest.raises(TypeError, match="set is not a value of a Spark SQL type|not a Spark SQL value"):
        SparkValueSerializer().dumps({1, 2})


@pytest.mark.parametrize(
    ("code", "data", "complaint"),
    [
        (1, b"not a time", "extension 1 does not parse"),
        (2, b"2024-13-01", "extension 2 does not parse"),
        (3, b"NaNx", "extension 3 does not parse"),
        (4, b"1.5", "extension 4 does not parse"),
        (3, b"9" * 10_000, "extension 3 does not parse"),  # bounded: a huge number is not parsed
        (9, b"", "extension 9, which no Spark SQL type uses"),
    ],
)
def test_hostile_extensions_are_a_named_error(code, data, complaint):
    forged = msgpack.packb([0, msgpack.ExtType(code, data)], use_bin_type=True)
    with pytest.raises(ValueError, match=complaint):
        SparkValueSerializer().loads(forged)


def test_read_only_tools_decode_spark_values_but_never_pickle():
    assert isinstance(untrusted_serializer_for("spark"), SparkValueSerializer)
    assert isinstance(untrusted_serializer_for("pickle"), SizeOnlySerializer)


@pytest.mark.parametrize("name", ["msgpack", "spark", "pickle"])
def test_a_batch_encodes_and_decodes_as_each_value_does(name):
    serializer = serializer_for(name)
    values = [
        v
        for v in SPARK_VALUES
        if name == "spark" or not isinstance(v, datetime.date | decimal.Decimal | datetime.timedelta)
    ]
    assert serializer.dumps_many(values) == [serializer.dumps(v) for v in values]
    assert serializer.dumps_many([]) == []
    stored = serializer.dumps_many(values)
    assert serializer.loads_many(stored) == [serializer.loads(data) for data in stored]
    with_gaps = [None, *stored[:3], None, *stored[3:]]  # None: nothing stored for that key
    assert serializer.loads_many(with_gaps) == [None if d is None else serializer.loads(d) for d in with_gaps]
    assert serializer.loads_many([]) == []


@pytest.mark.parametrize("name", ["msgpack", "spark"])
def test_a_batch_with_a_value_it_cannot_store_names_that_value_type(name):
    with pytest.raises(TypeError, match="state value of type object"):
        serializer_for(name).dumps_many([1, "two", object(), 4])


def test_a_batch_with_a_spark_value_that_does_not_parse_names_it():
    bad = msgpack.packb(msgpack.ExtType(1, b"not a datetime"))
    with pytest.raises(ValueError, match="does not parse"):
        serializer_for("spark").loads_many([serializer_for("spark").dumps(1), bad])
