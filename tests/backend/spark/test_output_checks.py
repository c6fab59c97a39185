"""Output is checked as Spark checks it: a value that does not fit its column is an error naming it."""

from __future__ import annotations

import pytest

from dstl.backend.spark import StatefulProcessor
from dstl.backend.spark._private.output import check_output_types, output_columns
from dstl.backend.spark.demo.pipeline import OUTPUT_SCHEMA, start_pipeline, write_input_file
from tests.backend.spark.test_query import ROWS, local_config

COLUMNS = tuple(column.split()[0] for column in OUTPUT_SCHEMA.split(","))


def _schema_json(ddl_pairs):
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    types = {"string": StringType(), "long": LongType()}
    return StructType([StructField(name, types[kind]) for name, kind in ddl_pairs]).json()


def test_a_value_that_does_not_fit_names_its_column_and_nulls_are_fine():
    schema = _schema_json([("k", "string"), ("n", "long")])
    check_output_types({"k": ["a", None], "n": [1, float("nan")]}, schema)  # NaN: pandas' missing value
    with pytest.raises(TypeError, match=r"output column 'n' is bigint.*'many'"):
        check_output_types({"k": ["a"], "n": ["many"]}, schema)
    with pytest.raises(TypeError, match=r"output column 'k' is string"):
        check_output_types({"k": [("a", 1)], "n": [1]}, schema)


def test_columns_the_schema_lacks_are_refused_in_every_form():
    import pandas as pd

    frame = pd.DataFrame({"k": ["a"], "extra": [1]})
    for result in ({"k": ["a"], "extra": [1]}, [{"k": "a", "extra": 1}], frame):
        with pytest.raises(ValueError, match=r"columns \['extra'\] that output_schema lacks"):
            output_columns(result, ("k",))
    assert output_columns([{"k": "a"}, {"k": "b", "n": 2}], ("k", "n")) == {"k": ["a", "b"], "n": [None, 2]}


class _WrongType(StatefulProcessor):
    """Emits a string where output_schema says long (Spark's applyInPandas fails on it)."""

    def init(self, context):
        pass

    def handle_input_rows(self, key, rows):
        yield {**dict.fromkeys(COLUMNS), "kind": "user", "user": key, "total": "many"}


@pytest.mark.parametrize("placement", ["sticky", "spark"])
def test_both_placements_fail_alike_on_a_value_of_the_wrong_type(spark, tmp_path, placement):
    """Before, sticky placement stored NULL for 'many' (createDataFrame without verification)."""
    workdir = tmp_path / "job"
    write_input_file(workdir / "input", 0, ROWS)
    config = local_config(tmp_path, **{"dstl.spark.placement": placement})
    query = start_pipeline(spark, workdir, config, trigger={"availableNow": True}, processor=_WrongType)
    with pytest.raises(Exception, match=r"output column 'total' is bigint"):
        query.await_termination(timeout=300)
    assert query.latest_checkpoint() is None  # nothing of the failed batch was committed
