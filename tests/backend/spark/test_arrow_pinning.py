"""Rows reach the instances as Arrow and their results leave as Arrow, on both placements."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pytest

from dstl.backend.spark import StatefulProcessor, transform_with_state
from dstl.backend.spark._private.arrow_pinning import arrow_groups
from dstl.backend.spark._private.columns import INSTANCE_COLUMN, REPORT_COLUMN
from tests.backend.spark.test_query import assert_exact, local_config, run
from tests.backend.spark.test_report_channel import Counting, run_counting


def test_the_routed_rows_reach_their_instances_partition_as_arrow_streams(spark):
    from pyspark.sql.pandas.types import to_arrow_schema

    rows = [(f"u{i}", i, dt.datetime(2026, 1, 1, 12, i % 60), i % 3) for i in range(500)]
    frame = spark.createDataFrame(
        rows, f"user string, n long, at timestamp, {INSTANCE_COLUMN} int"
    ).repartition(4)
    timezone = spark.conf.get("spark.sql.session.timeZone")
    partitions = arrow_groups(frame, 3, timezone).collect()  # glom(): one element per instance's partition
    assert len(partitions) == 3
    seen = []
    for instance, streams in enumerate(partitions):
        assert streams and all(isinstance(stream, bytes) for stream in streams)
        for stream in streams:
            table = pa.ipc.open_stream(pa.py_buffer(stream)).read_all()
            assert table.schema == to_arrow_schema(frame.schema, timezone=timezone)
            assert set(table.column(INSTANCE_COLUMN).to_pylist()) == {instance}
            seen.extend(zip(*(table.column(name).to_pylist() for name in ("user", "n")), strict=True))
    assert sorted(seen) == sorted((user, n) for user, n, _, _ in rows)


@pytest.mark.parametrize(
    ("placement", "operator"), [("sticky", "MapInArrow"), ("spark", "FlatMapGroupsInPandas")]
)
def test_the_instances_run_in_an_arrow_operator_on_both_placements(
    spark, tmp_path, monkeypatch, placement, operator
):
    """The plan of each batch's instance step: Spark's Arrow-fed Python operators, no pickled rows."""
    frame_class = type(spark.range(1))
    checkpoint, drop = frame_class.localCheckpoint, frame_class.drop
    plans: list[str] = []

    def plan_of(frame):
        return frame._jdf.queryExecution().executedPlan().toString()

    checkpointed: list[bool] = []

    def checkpointing(self, *args, **kwargs):  # where the reports are collected before the sink
        plans.append(plan_of(self))
        checkpointed.append(True)
        return checkpoint(self, *args, **kwargs)

    def dropping(self, *columns):  # the output the sink reads (after a checkpoint: its scan)
        if columns == (REPORT_COLUMN,) and not (checkpointed and checkpointed.pop()):
            plans.append(plan_of(self))
        return drop(self, *columns)

    monkeypatch.setattr(frame_class, "localCheckpoint", checkpointing)
    monkeypatch.setattr(frame_class, "drop", dropping)
    workdir = tmp_path / "job"
    progress = run(spark, workdir, local_config(tmp_path, **{"dstl.spark.placement": placement}), 2)
    assert len(progress) == 2
    assert len(plans) == 2 and all(operator in plan for plan in plans), plans
    if placement == "sticky":
        assert all(p.warm_instances == p.instances for p in progress[1:])
    assert_exact(spark, workdir)


class CountingFromRows(Counting):
    """As :class:`Counting`, with each key's count read from the rows as pandas."""

    def handle_batch(self, batch, context):
        counts = batch.rows.groupby("user", sort=False).size().tolist()
        assert counts == batch.counts().tolist()
        return super().handle_batch(batch, context)


@pytest.mark.parametrize(
    ("placement", "processor", "to_pandas"),
    [("sticky", Counting, False), ("sticky", CountingFromRows, True), ("spark", Counting, False)],
    ids=["arrow, keys and counts", "arrow, rows read", "spark's pandas"],
)
def test_a_batch_processor_gets_the_rows_as_arrow_and_pays_for_pandas_only_when_it_reads_them(
    spark, tmp_path, placement, processor, to_pandas
):
    """On the Arrow placements the batch holds Arrow rows: a processor that reads only keys and
    counts never converts a row to pandas (no ``to_pandas`` phase). On Spark's placement Spark
    hands pandas over, and dstl converts nothing."""
    written: list[tuple] = []
    progress = run_counting(
        spark,
        tmp_path,
        lambda frame, _: written.extend(map(tuple, frame.collect())),
        placement,
        processor=processor,
    )
    assert [p.rows for p in progress] == [30, 40, 50]
    assert all("group" in p.task_phases_ms for p in progress)
    assert all(("to_pandas" in p.task_phases_ms) == to_pandas for p in progress), [
        p.task_phases_ms for p in progress
    ]
    assert sorted(written)[-1] == ("u9", 3) and len(written) == 120


class LatestSeen(StatefulProcessor):
    """Per user: the latest timestamp seen, a double that is NaN, and the row count (a value state)."""

    def init(self, context):
        self.count = context.get_value_state("count")

    def handle_input_rows(self, key, rows):
        count = (self.count.value() or 0) + len(rows)
        self.count.update(count)
        return [{"user": key, "latest": rows["at"].max(), "ratio": float("nan"), "count": count}]


@pytest.mark.parametrize("placement", ["sticky", "spark"])
def test_timestamps_and_nans_cross_both_ways_as_on_sparks_placement(spark, tmp_path, placement):
    """Input timestamps reach pandas as naive session-local times and return unchanged; NaN is null."""
    directory = tmp_path / "in"
    directory.mkdir()
    events = [("a", "2026-03-29 01:30:00"), ("a", "2026-03-29 03:15:00"), ("b", "2026-10-25 02:45:00")]
    (directory / "part-0.json").write_text(
        "".join(json.dumps({"user": u, "at": t}) + "\n" for u, t in events)
    )
    written: list[tuple] = []
    query = transform_with_state(
        spark.readStream.schema("user string, at timestamp").json(str(directory)),
        key_columns=["user"],
        processor=LatestSeen,
        output_schema="user string, latest timestamp, ratio double, count long",
        sink=lambda frame, batch_id: written.extend(tuple(row) for row in frame.collect()),
        checkpoint_location=str(tmp_path / "chk"),
        config=local_config(tmp_path, **{"dstl.spark.placement": placement}),
        trigger={"availableNow": True},
    )
    query.await_termination(timeout=300)
    assert query.exception() is None, query.exception()
    assert sorted(written) == [
        ("a", dt.datetime(2026, 3, 29, 3, 15), None, 2),
        ("b", dt.datetime(2026, 10, 25, 2, 45), None, 1),
    ]


@pytest.mark.parametrize("placement", ["sticky", "spark"])
def test_each_instance_runs_once_a_batch_however_often_the_sink_reads_the_output(spark, tmp_path, placement):
    """The reports and the sink read one checkpointed result: no action reruns an instance."""
    runs = tmp_path / "runs.txt"

    class Logging(Counting):
        def handle_batch(self, batch, context):
            with runs.open("a") as out:  # a worker process appends one line per instance run
                out.write(f"{context.batch_id} {context.key_groups.start}\n")
            return super().handle_batch(batch, context)

    seen: list[tuple[int, int]] = []

    def sink(frame, batch_id):
        seen.append((batch_id, frame.count()))  # the output read three times
        assert frame.count() == len(frame.collect())

    progress = run_counting(spark, tmp_path, sink, placement, batches=(40, 40), processor=Logging)
    assert seen == [(0, 40), (1, 40)]
    lines = runs.read_text().splitlines()
    assert sorted(lines) == sorted(set(lines)), "an instance ran twice in a batch"
    assert {line.split()[0] for line in lines} == {"0", "1"}
    assert len(lines) == sum(p.instances for p in progress), (lines, progress)
