"""The driver-executor messages: typed, decoded once, and a snapshot serialized at most twice per hop."""

from __future__ import annotations

import pytest

from dstl.backend.changelog import snapshot as snapshot_module
from dstl.backend.spark import StatefulProcessor
from dstl.backend.spark._private import task
from dstl.backend.spark._private.call_checks import job_config
from dstl.backend.spark._private.columns import EVENT_TIME_COLUMN, INSTANCE_COLUMN, KEY_GROUP_COLUMN
from dstl.backend.spark._private.instance_rows import ArrowRows
from dstl.backend.spark._private.protocol import InstancePlan, InstanceReport, InstanceStats, Restore
from dstl.backend.spark._private.runner import BatchRunner, Phases, QuerySpec
from dstl.spi import InvalidHandleError

from .test_query import local_config

pytest.importorskip("pyspark")


class Count(StatefulProcessor):
    def init(self, context):
        self.count = context.get_value_state("count")

    def handle_input_rows(self, key, rows):
        total = (self.count.value() or 0) + len(rows)
        self.count.update(total)
        yield {"k": key, "n": total}


def _rows(runner: BatchRunner, instance: int, keys: list[str]) -> ArrowRows:
    """The instance's rows as the driver routes them (key group and instance columns), as Arrow."""
    import pyarrow as pa

    from dstl.backend.keygroups import key_group_for

    groups = [key_group_for(key, runner.max_parallelism) for key in keys]
    table = pa.table({"k": keys, KEY_GROUP_COLUMN: groups, INSTANCE_COLUMN: [instance] * len(keys)})
    return ArrowRows(table, "UTC")


def test_a_snapshot_is_serialized_at_most_twice_between_the_instances_checkpoint_and_chk_json(
    tmp_path, monkeypatch
):
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    cfg = job_config({}, local_config(tmp_path, **{"dstl.spark.parallelism": "1"}), str(tmp_path / "chk"))
    schema = StructType([StructField("k", StringType()), StructField("n", LongType())])
    spec = QuerySpec("job", "op", ("k",), schema, Count, lambda frame, batch_id: None)
    runner = BatchRunner(cfg, spec)
    monkeypatch.setattr(task, "_attempt", lambda: (7, 0))  # no Spark task here: attempt 7, number 0
    encoded: list[object] = []
    encode = snapshot_module.encode_snapshot

    def counting(snapshot):
        encoded.append(snapshot)
        return encode(snapshot)

    monkeypatch.setattr(snapshot_module, "encode_snapshot", counting)
    for batch_id in range(3):  # fresh, then warm (every batch materializes: interval 0s)
        base = runner.coordinator.latest()
        bases = runner._bases(base)
        clock, wake = runner._clock(base)
        plan = runner._plan(batch_id, base, bases, clock, wake)
        encoded.clear()
        # executor: the instance's task, its report encoded for the trip
        output, report = task.process_instance(plan, Count, _rows(runner, 0, ["a", "b", "a"]), 0)
        shipped = report.to_json()
        # driver: decoded once, completed as chk-N.json
        progress = runner.complete_batch(batch_id, base, bases, clock, [shipped], Phases(0.0))
        counts = dict(zip(output["k"], output["n"], strict=True))
        assert counts == {"a": 2 * (batch_id + 1), "b": batch_id + 1}
        # the checkpoint the instance took (a background materialization's rebased copy is another)
        assert sum(1 for item in encoded if item == report.snapshot) <= 2, encoded
        assert runner.coordinator.latest().snapshots["kg0-128"] == report.snapshot
        assert progress.rows == 3 and progress.instances == 1
        assert (progress.warm_instances == 1) == (batch_id > 0)
    latest = runner.coordinator.latest()
    assert latest is not None and latest.checkpoint_id == 2


def test_reports_and_plans_round_trip_and_refuse_what_no_task_sends():
    from dstl.backend.changelog import BackendSnapshot

    stats = InstanceStats("kg0-64", rows=3, keys=2, restore=Restore.CAUGHT_UP, phases_ms={"process": 1.5})
    report = InstanceReport(BackendSnapshot(4, ()), stats)
    assert InstanceReport.from_json(report.to_json()) == report
    plan = InstancePlan(BackendSnapshot(3, ()), ("d1", "d2"), materialize=True, wake=False)
    assert InstancePlan.from_json(plan.to_json()) == plan
    waits = InstancePlan(None, (), materialize=True, finish_in_task=True)
    assert InstancePlan.from_json(waits.to_json()) == waits != InstancePlan(None, (), materialize=True)
    doc = stats.to_dict()
    with pytest.raises(InvalidHandleError, match="unknown fields"):
        InstanceStats.from_dict({**doc, "attempt": 1})
    with pytest.raises(InvalidHandleError, match="restore"):
        InstanceStats.from_dict({**doc, "restore": "sideways"})
    with pytest.raises(InvalidHandleError, match="instance report"):
        InstanceReport.from_json("[]")
    assert Restore.REBASED.warm and not Restore.CAUGHT_UP.warm
    assert EVENT_TIME_COLUMN not in doc
