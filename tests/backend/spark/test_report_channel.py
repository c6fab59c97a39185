"""Instance reports reach the driver inside the sink's job; partitions the sink left unread run after it."""

from __future__ import annotations

import json
import os

import pytest

from dstl.backend.spark import StatefulProcessor, transform_with_state
from dstl.backend.spark._private.affinity import _task_executors
from dstl.backend.spark._private.report_channel import ReportChannel, TaskReports
from tests.backend.spark.test_query import local_config


def test_every_partition_sends_its_reports_from_its_task(spark):
    observed: list[list] = []
    channel = ReportChannel(spark.sparkContext, observed.append)
    sender = channel.sender(7)

    def send(rows):
        rows = list(rows)
        copies = {5: True, 6: False} if rows == [1] else {}  # partition 1 keeps two standby copies
        sender.send(TaskReports([f"r{row}" for row in rows], copies))

    spark.sparkContext.parallelize(range(3), 3).foreachPartition(send)
    assert channel.received(7, 3) == ["r0", "r1", "r2"]
    [tasks] = observed  # every partition's task: its attempt, stage and standby copies
    assert [(partition, copies) for partition, _, _, copies in sorted(tasks)] == [
        (0, ()),
        (1, ((5, True), (6, False))),
        (2, ()),
    ]
    # where each ran, from Spark's status store by its attempt id (local mode: the driver)
    ran_on = _task_executors(spark.sparkContext, {stage for _, _, stage, _ in tasks})
    assert {ran_on[task] for _, task, _, _ in tasks} == {"driver"}
    assert channel.received(7, 4) is None  # partition 3 never ran
    assert channel.received(6, 3) is None  # another batch's
    # partitions past the instances' (standby-only tasks) send none: the instances' are all there
    assert channel.received(7, 2) == ["r0", "r1", "r2"]


def test_a_partition_counts_by_its_latest_attempt_and_a_new_batch_drops_the_last_ones(spark):
    channel = ReportChannel(spark.sparkContext)
    sender = channel.sender(3)
    sender.accumulator.add(
        [(3, 0, 12, ("retried",), 1, ()), (3, 0, 10, ("first",), 1, ()), (3, 1, 11, (), 1, ())]
    )
    assert channel.received(3, 2) == ["retried"]
    channel.sender(4)
    assert channel.received(3, 2) is None


class Counting(StatefulProcessor):
    """Rows per user so far (batch API)."""

    def init(self, context):
        self.count = context.get_value_state("count")

    def handle_batch(self, batch, context):
        totals = [
            (c or 0) + n
            for c, n in zip(self.count.get_many(batch.key_set), batch.counts().tolist(), strict=True)
        ]
        self.count.update_many(batch.key_set, totals)
        return {"user": batch.keys, "count": totals}


def run_counting(spark, tmp_path, sink, placement="sticky", *, batches=(30, 40, 50), processor=Counting):
    """Run ``processor`` over one file a batch, of ``batches[i]`` users each (``u0``...); its progress."""
    directory = tmp_path / "in"
    directory.mkdir()
    for batch, count in enumerate(batches):
        path = directory / f"part-{batch}.json"
        path.write_text("".join(json.dumps({"user": f"u{i}"}) + "\n" for i in range(count)))
        os.utime(path, (1_000_000 + batch, 1_000_000 + batch))  # the source reads files by age
    query = transform_with_state(
        spark.readStream.schema("user string").option("maxFilesPerTrigger", 1).json(str(directory)),
        key_columns=["user"],
        processor=processor,
        output_schema="user string, count long",
        sink=sink,
        checkpoint_location=str(tmp_path / "chk"),
        config=local_config(tmp_path, **{"dstl.spark.placement": placement}),
        trigger={"availableNow": True},
    )
    query.await_termination(timeout=300)
    assert query.exception() is None, query.exception()
    return query.progress


def users(batch_id):
    return 30 + 10 * batch_id


def expected_counts(batch_id):
    """Batch ``batch_id``'s output: its users, each with the rows of it seen up to that batch."""
    return {f"u{i}": sum(1 for b in range(batch_id + 1) if i < users(b)) for i in range(users(batch_id))}


def test_a_sink_that_reads_the_output_brings_the_reports_in_its_own_job(spark, tmp_path):
    written: dict[int, dict[str, int]] = {}

    def sink(frame, batch_id):
        written[batch_id] = {row.user: row["count"] for row in frame.collect()}

    progress = run_counting(spark, tmp_path, sink)
    assert written == {b: expected_counts(b) for b in range(3)}
    # no job of the driver's own collected the reports: they came with the sink's
    assert [sorted(p.phases_ms) for p in progress] == [["complete", "plan", "sink"]] * 3


@pytest.mark.parametrize("reading", ["none", "one row"])
def test_partitions_a_sink_leaves_unread_still_run_and_keep_the_state_exact(spark, tmp_path, reading):
    """A sink that skips a batch's output (or reads a row of it): the state still counts every row."""
    written: dict[int, dict[str, int]] = {}

    def sink(frame, batch_id):
        if batch_id == 2:  # the last batch is read whole: the counts of all three batches
            written[batch_id] = {row.user: row["count"] for row in frame.collect()}
        elif reading == "one row":
            frame.take(1)

    progress = run_counting(spark, tmp_path, sink)
    assert written == {2: expected_counts(2)}
    assert [p.rows for p in progress] == [30, 40, 50]
    if reading == "none":  # the instances ran after the sink, in a job collecting their reports
        assert all("tasks" in p.phases_ms for p in progress[:2])
