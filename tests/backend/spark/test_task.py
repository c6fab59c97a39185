"""A task brings its working copy up: it moves onto a background snapshot of its run, or removes it."""

import pytest

from dstl.backend.changelog import ChangelogKeyedStateBackend
from dstl.backend.spark._private.bring_up import bring_up
from dstl.backend.spark._private.working_copy import WorkingCopy
from dstl.spi import KeyGroupRange, load_storage


def test_a_task_moves_onto_an_offer_of_its_run_and_removes_any_other(tmp_path, memory_config):
    snapshots = tmp_path / "chk"
    copy = WorkingCopy(tmp_path / "wc", "kg0-128", map_size=1 << 24)
    stamp = {"registrations": {"v": ("value", "msgpack")}}
    with load_storage(memory_config, job_id="job") as storage:

        def batch(epoch, previous, run_id):
            """One task: bring up, change a key, checkpoint while materializing, offer the result."""
            backend = ChangelogKeyedStateBackend(
                storage,
                "op",
                KeyGroupRange(0, 128),
                epoch=epoch,
                delegate=copy.delegate,
                snapshot_dir=snapshots.as_uri(),
            )
            how, _ = bring_up(
                backend,
                copy,
                stamp,
                previous,
                warm=previous is not None,
                committed=True,
                cfg=None,
                run_id=run_id,
            )
            backend.set_current_key(epoch)
            backend.value_state("v").update(epoch)
            checkpoint, rebased = backend.checkpoint_materializing(epoch)
            backend.close(wait_for_materialization=False)
            copy.offer(checkpoint, rebased.result(timeout=30), run_id)
            return how, checkpoint

        def written_by_the_offer():
            run_id, checkpoint, rebased, _ = copy.take_offer()
            copy.offer(checkpoint, rebased, run_id)  # put back
            return [snapshots / ref.path for ref in rebased.references if ref not in checkpoint.references]

        how, first = batch(1, None, run_id=1)
        assert how == "fresh"
        first_snapshot = written_by_the_offer()
        assert first_snapshot and all(path.exists() for path in first_snapshot)

        how, second = batch(2, first, run_id=1)
        assert how == "rebased", "the next task did not move onto the completed snapshot"
        assert {snapshots / ref.path for ref in second.references} >= set(first_snapshot)

        stale = written_by_the_offer()
        how, _ = batch(3, first, run_id=1)  # batch 2 was not committed: its offer continues nothing
        assert how == "warm" and not any(path.exists() for path in stale), "an unusable snapshot stayed"
        assert all(path.exists() for path in first_snapshot), "a snapshot a checkpoint references was removed"

        other_run = written_by_the_offer()
        how, _ = batch(4, first, run_id=2)  # a restarted job never moves onto an earlier run's snapshot
        assert how == "warm" and not any(path.exists() for path in other_run)


def test_a_tasks_storage_figures_are_its_deltas_and_the_batch_sums_them():
    from dstl.backend.spark import BatchProgress
    from dstl.backend.spark._private.protocol import InstanceStats
    from dstl.backend.spark._private.task import storage_figures
    from dstl.spi import StorageMetrics

    metrics = StorageMetrics()
    metrics.inc("persists", 5)
    before = metrics.counters()
    metrics.inc("persists", 2)
    metrics.inc("uploaded_bytes", 4096)
    metrics.observe("upload_latency_s", 0.25)
    metrics.set_gauge("queued_bytes", 100)
    figures = storage_figures(before, metrics)
    assert figures == {
        "persists": 2,
        "uploaded_bytes": 4096,
        "upload_latency_p99_s": 0.25,
        "gauge.queued_bytes": 100,
    }
    other = {"persists": 1, "upload_latency_p99_s": 0.5, "gauge.queued_bytes": 50}
    stats = [
        {
            "instance": name,
            "rows": 1,
            "keys": 1,
            "restore": "warm",
            "materialized": False,
            "restore_ms": 0,
            "checkpoint_ms": 0,
            "materialization_ms": 0,
            "persisted_bytes": 0,
            "storage": storage,
        }
        for name, storage in (("kg0-64", figures), ("kg64-128", other))
    ]
    progress = BatchProgress.from_instances(3, [InstanceStats.from_dict(s) for s in stats], 0, 1.0)
    assert progress.storage == {
        "persists": 3,
        "uploaded_bytes": 4096,
        "upload_latency_p99_s": 0.5,
        "gauge.queued_bytes": 100,
    }


def test_fired_timers_are_counted_whatever_rows_their_handlers_return(memory_config):
    """A handler may emit nothing (or several rows): the batch's timers_fired counts timers."""
    from dstl.backend.spark import StatefulProcessor
    from dstl.backend.spark._private.task import _fire_timers
    from dstl.backend.spark.processor import BatchClock, StateContext, TimeMode

    class Silent(StatefulProcessor):
        def init(self, context):
            pass

        def handle_expired_timer(self, key, expiry_ms, context):
            return [{"k": key}, {"k": key}] if key == "a" else None

    with load_storage(memory_config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", KeyGroupRange(0, 128))
        for key in ("a", "b", "c"):
            backend.set_current_key(key)
            backend.timers().register(10)
        context = StateContext(backend, 1, 0, ("k",), BatchClock(20, None, TimeMode.PROCESSING))
        rows, fired, next_timer = _fire_timers(Silent(), context, backend, ("k",))
        assert (rows["k"], fired, next_timer) == (["a", "a"], 3, None)
        backend.close()


@pytest.mark.parametrize("kind", ["arrow", "pandas"])
def test_the_rows_key_groups_from_the_routing_stay_aligned_with_the_rows_the_processor_gets(kind):
    import pandas as pd
    import pyarrow as pa

    from dstl.backend.spark import BatchClock, TimeMode
    from dstl.backend.spark._private.columns import (
        EVENT_TIME_COLUMN,
        INSTANCE_COLUMN,
        KEY_GROUP_COLUMN,
        WAKE_KEY_GROUP,
    )
    from dstl.backend.spark._private.instance_rows import ArrowRows, PandasRows
    from dstl.backend.spark._private.task import _on_time

    columns = {
        "k": ["a", "wake", "b", "late", "c", "unknown"],
        KEY_GROUP_COLUMN: [5, WAKE_KEY_GROUP, 6, 7, 8, 9],
        INSTANCE_COLUMN: [0] * 6,
        EVENT_TIME_COLUMN: [2_000, 0, 3_000, 500, 4_000, None],  # no event time: never late
    }
    rows = ArrowRows(pa.table(columns), "UTC") if kind == "arrow" else PandasRows(pd.DataFrame(columns))
    clock = BatchClock(10_000, watermark_ms=1_000, mode=TimeMode.EVENT)
    user_rows, routed, stats = _on_time(rows, clock, woken=True)
    assert type(user_rows) is type(rows), "the rows stay as they came"
    assert user_rows.frame()["k"].tolist() == ["a", "b", "c", "unknown"] and user_rows.columns == ["k"]
    assert routed.tolist() == [5, 6, 8, 9]
    assert stats == {"rows": 5, "max_event_ms": 4_000, "late_rows": 1}


@pytest.mark.parametrize("kind", ["arrow", "pandas"])
def test_a_grouped_batchs_keys_are_bound_as_distinct_without_a_check(kind, memory_config):
    import pandas as pd
    import pyarrow as pa

    from dstl.backend.spark._private.grouping import keyed_batch
    from dstl.backend.spark._private.instance_rows import ArrowRows
    from dstl.backend.spark.processor import BatchClock, StateContext, TimeMode

    columns = {"k": ["a", "b", "a", "c", "b"], "v": [1, 2, 3, 4, 5]}
    rows = ArrowRows(pa.table(columns), "UTC") if kind == "arrow" else pd.DataFrame(columns)
    with load_storage(memory_config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", KeyGroupRange(0, 128))
        context = StateContext(backend, 1, 0, ("k",), BatchClock(20, None, TimeMode.PROCESSING))
        batch = keyed_batch(rows, context)
        assert batch.keys == ["a", "b", "c"] and batch.key_set.keys == ("a", "b", "c")
        assert batch.key_set.known_distinct and batch.key_set.distinct
        assert context.key_set(["a", "a"]).distinct is False  # anyone else's keys are checked
        backend.close()


@pytest.mark.parametrize("gap", ["0s", "1h"], ids=["finished in the task", "in the background"])
def test_a_snapshot_planned_in_its_task_is_complete_and_offered_when_the_task_returns(
    tmp_path, monkeypatch, gap
):
    """Spark stops a worker idle for a minute: with batches that far apart the task waits for its snapshot."""
    import time
    from dataclasses import replace

    from dstl.backend import pacing
    from dstl.backend.changelog.materializer import Materializer
    from dstl.backend.spark._private import task
    from dstl.backend.spark._private.protocol import Restore
    from dstl.backend.spark._private.runner import Phases

    from .test_protocol import Count, _rows
    from .test_standby import _materialized, _runner

    upload = Materializer._upload
    paused = []

    def slow_upload(self, *args, **kwargs):
        time.sleep(3.0)  # a snapshot that outlasts the rest of its task
        deadline = time.monotonic() + 10  # the task reaches its wait (a loaded machine: later)
        while pacing._FOREGROUND.pausing() and time.monotonic() < deadline:
            time.sleep(0.05)
        paused.append(pacing._FOREGROUND.pausing())  # a paced snapshot would crawl
        return upload(self, *args, **kwargs)

    monkeypatch.setattr(Materializer, "_upload", slow_upload)
    runner = _runner(tmp_path, monkeypatch, "0s", **{"dstl.spark.finish-in-task-gap": gap})
    restores = []
    for batch_id in range(2):
        base = runner.coordinator.latest()
        bases = runner._bases(base)
        clock, wake = runner._clock(base)
        plan = replace(runner._plan(batch_id, base, bases, clock, wake), working_dir=str(tmp_path / "wd"))
        _, report = task.process_instance(plan, Count, _rows(runner, 0, [f"k{i}" for i in range(50)]), 0)
        copy = task.working_copy_of(plan, 0)
        claim = copy.claim_materialization()  # None while the instance's snapshot runs
        if gap == "0s":
            assert claim is not None, "the task returned while its snapshot was still running"
            claim.close()
            assert report.stats.materialized and report.stats.phases_ms["snapshot"] >= 1000
        else:
            assert claim is None and "snapshot" not in report.stats.phases_ms
        runner.complete_batch(batch_id, base, bases, clock, [report.to_json()], Phases(0.0))
        _materialized(copy)
        restores.append(report.stats.restore)
    assert restores == [Restore.FRESH, Restore.REBASED]  # the next task moved onto the offered snapshot
    assert paused == [False, False], "a task waiting for its snapshot kept background work paused"
