"""The driver asks one instance a batch to snapshot, and every instance gets its turn."""

from dstl.backend.changelog import MaterializationPolicy
from dstl.backend.spark._private.materialization_turns import (
    MaterializationTurns,
    finishes_in_task,
    next_to_materialize,
)
from dstl.backend.spark._private.protocol import InstanceStats, Restore
from dstl.spi import Config

NAMES = ["kg0-64", "kg64-128"]
RATIO = MaterializationPolicy(max_log_ratio=2.0)
BIG_LOG = (100 << 20, 1 << 20)  # far more log than snapshots: outgrown
SMALL_LOG = (1 << 10, 1 << 20)


def turns(sizes, batches, *, interval=10.0, step=1.0):
    """Whom each of ``batches`` batches (``step`` seconds apart) asks, noting each one asked."""
    asked_at = dict.fromkeys(NAMES, 0.0)
    asked = []
    for batch in range(1, batches + 1):
        now = batch * step
        chosen = next_to_materialize(NAMES, sizes, asked_at, now, interval, RATIO)
        if chosen is not None:
            asked_at[chosen] = now
        asked.append(chosen)
    return asked


def test_instances_whose_logs_outgrew_their_snapshots_take_turns():
    # Both logs keep outgrowing (snapshots of millions of keys take minutes): the first
    # instance used to be asked every batch, and the second never.
    assert turns(dict.fromkeys(NAMES, BIG_LOG), 4) == ["kg0-64", "kg64-128", "kg0-64", "kg64-128"]


def test_an_outgrown_log_goes_before_the_interval():
    sizes = {"kg0-64": SMALL_LOG, "kg64-128": BIG_LOG}
    assert turns(sizes, 3) == ["kg64-128", "kg64-128", "kg64-128"]  # the only one outgrown


def test_past_the_interval_the_instance_asked_longest_ago_goes_next():
    sizes = dict.fromkeys(NAMES, SMALL_LOG)
    asked = turns(sizes, 25, interval=10.0)  # batches at 1, 2, ... 25 s
    assert {second: name for second, name in enumerate(asked, start=1) if name} == {
        10: "kg0-64",
        11: "kg64-128",  # one a batch: the other waits for the next
        20: "kg0-64",
        21: "kg64-128",
    }


def test_nothing_is_asked_before_the_interval_or_of_no_instance():
    assert next_to_materialize(NAMES, {}, {}, 5.0, 10.0, RATIO) is None  # asked "just now"
    assert next_to_materialize([], {}, {}, 5.0, 10.0, RATIO) is None


def test_a_task_finishes_its_background_work_when_its_instance_was_idle_as_long_as_the_gap():
    assert finishes_in_task(45.0, 40.0) and finishes_in_task(40.0, 40.0)
    assert not finishes_in_task(39.0, 40.0)
    assert not finishes_in_task(None, 40.0)  # not run yet in this run: nothing to go by
    assert finishes_in_task(None, 0.0) and finishes_in_task(0.0, 0.0)  # 0: always


def _planned(turns):
    """The next batch's instance asked to snapshot, and whether each instance's task finishes its work."""
    return turns.due({}), [turns.finish_in_task()] * len(NAMES)


def test_the_driver_plans_the_wait_from_when_the_last_batchs_tasks_ended(monkeypatch):
    from dstl.backend.spark._private import materialization_turns

    clock = [1000.0]
    monkeypatch.setattr(materialization_turns.time, "monotonic", lambda: clock[0])
    turns = MaterializationTurns(NAMES, Config({"state.changelog.materialization.interval": "10s"}))
    assert turns.gap == 40.0  # dstl.spark.finish-in-task-gap's default

    def ran(*names, materialized=()):
        turns.noticed(
            [InstanceStats(name, 1, 1, Restore.WARM, materialized=name in materialized) for name in names]
        )

    clock[0] += 10
    assert _planned(turns) == (0, [False, False])  # no batch ran in this run: in the background
    ran("kg0-64", "kg64-128", materialized=["kg0-64"])
    clock[0] += 5
    assert _planned(turns) == (1, [False, False])  # tasks ended 5 s ago: batches come often enough
    ran("kg64-128", materialized=["kg64-128"])  # a batch with one instance's rows counts too
    clock[0] += 60  # then a minute without a batch: Spark stops idle Python workers
    assert _planned(turns) == (0, [True, True])
    ran("kg0-64", materialized=["kg0-64"])
    assert _planned(turns) == (1, [False, False])  # tasks ended just now
    ran()  # a batch in which no instance ran: no task ended
    clock[0] += 45
    assert turns.finish_in_task()  # 45 s since tasks last ended
    ran("kg0-64", "kg64-128", materialized=NAMES)
    clock[0] += 1
    assert _planned(turns) == (None, [False, False])  # both asked within the interval


def test_a_batch_after_one_tasks_wait_for_its_snapshot_does_not_wait_again(monkeypatch):
    # After a 60 s pause, batch 1's tasks finished their background work: kg0-64's waited 41 s
    # for its snapshot while kg64-128's ended at once. Batch 2 follows 5 s after batch 1 (an
    # executor was lost meanwhile and kg64-128 moved). Counting kg64-128 idle from its own task
    # (46 s) made its recovery task wait 40 s for the snapshot it was asked for at 16M keys;
    # the gap before batch 2 is 5 s, and nothing in batch 2 makes a task wait.
    from dstl.backend.spark._private import materialization_turns

    clock = [1.0]
    monkeypatch.setattr(materialization_turns.time, "monotonic", lambda: clock[0])
    turns = MaterializationTurns(NAMES, Config({"state.changelog.materialization.interval": "0s"}))
    turns.noticed([InstanceStats(name, 1, 1, Restore.WARM) for name in NAMES])  # batch 0 ends at t=1
    clock[0] = 61.0
    assert _planned(turns) == (0, [True, True])  # batch 1: both finish their work in the task
    clock[0] = 102.0
    waited = {"snapshot": 41_000.0}
    turns.noticed(
        [
            InstanceStats("kg0-64", 1, 1, Restore.WARM, materialized=True, phases_ms=waited),
            InstanceStats("kg64-128", 1, 1, Restore.WARM),
        ]
    )
    assert turns.tasks_ended_at == 102.0
    clock[0] = 107.0
    assert _planned(turns) == (1, [False, False])  # kg64-128's snapshot goes on in the background


def test_a_processing_time_trigger_interval_is_the_least_gap_expected(monkeypatch):
    # Its batches start aligned to the interval: the first ones come sooner (measured: 20 s after
    # the first batch, then 100 s apart), and an observed gap alone left that snapshot behind.
    from dstl.backend.spark._private import materialization_turns

    clock = [0.0]
    monkeypatch.setattr(materialization_turns.time, "monotonic", lambda: clock[0])
    cfg = Config({"state.changelog.materialization.interval": "0s"})
    every_100s = MaterializationTurns(NAMES, cfg, trigger_interval_s=100.0)
    assert _planned(every_100s) == (0, [True, True])  # nothing ran yet
    clock[0] = 1.0  # the first batch ends
    every_100s.noticed(
        [InstanceStats(name, 1, 1, Restore.WARM, materialized=name == NAMES[0]) for name in NAMES]
    )
    clock[0] = 20.0
    assert _planned(every_100s) == (1, [True, True])  # 20 s observed, 100 s to expect
    every_10s = MaterializationTurns(NAMES, cfg, trigger_interval_s=10.0)
    assert _planned(every_10s) == (0, [False, False])
    clock[0] = 21.0
    every_10s.noticed(
        [InstanceStats(name, 1, 1, Restore.WARM, materialized=name == NAMES[0]) for name in NAMES]
    )
    clock[0] = 100.0  # the stream paused: a longer gap observed still counts
    assert _planned(every_10s) == (1, [True, True])
