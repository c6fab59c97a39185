"""Stateful queries on real PySpark (local[2]): exact state under task failures, rescale, storage switch.

Each run processes every input file written so far (``availableNow``) and stops;
the next run continues from the checkpoints. The sink's final per-user figures
must equal a batch recomputation over all input.
"""

import itertools
import uuid
from pathlib import Path

import pytest

from dstl.backend.spark import StatefulProcessor
from dstl.backend.spark.demo.pipeline import (
    DemoProcessor,
    compare_with_recomputation,
    start_pipeline,
    write_input_file,
)

ROWS = 400


def run(spark, workdir, config, files, processor=None, **pipeline):
    """Write input files up to ``files`` and process everything; returns the run's progress."""
    existing = len(list((workdir / "input").glob("events-*.json"))) if (workdir / "input").exists() else 0
    for index in range(existing, files):
        write_input_file(workdir / "input", index, ROWS)
    query = start_pipeline(
        spark, workdir, config, trigger={"availableNow": True}, processor=processor, **pipeline
    )
    query.await_termination(timeout=300)
    assert query.exception() is None, query.exception()
    return query.progress


def assert_exact(spark, workdir):
    result = compare_with_recomputation(spark, workdir)
    assert not result["wrong_count"], f"{result['wrong_count']} users differ, e.g. {result['wrong'][0]}"
    assert not result["unexpected"]
    assert result["users"] > 0
    return result


@pytest.fixture
def workdir(tmp_path):
    return tmp_path / "job"


def local_config(tmp_path, **extra):
    return {
        "dstl.storage": "local",
        "dstl.spark.working-dir": str(tmp_path / "working"),
        "state.changelog.materialization.interval": "0s",
        **extra,
    }


class FlakyProcessor(DemoProcessor):
    """Fails the first attempt of every task in odd batches (after changing state), and says so."""

    def __init__(self, marker_dir: str):
        self.marker_dir = Path(marker_dir)

    def init(self, context):
        super().init(context)
        self.context = context

    def handle_batch(self, batch, context):
        output = super().handle_batch(batch, context)
        if self.context.batch_id % 2 == 1 and self.context.attempt == 0:
            (self.marker_dir / f"failed-{self.context.batch_id}-{uuid.uuid4().hex}").touch()
            raise RuntimeError("injected task failure")
        return output


def test_exact_state_when_tasks_fail_on_their_first_attempt(spark, workdir, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    marker_dir = str(markers)
    progress = run(spark, workdir, local_config(tmp_path), 6, processor=lambda: FlakyProcessor(marker_dir))
    assert len(progress) == 6
    assert len(list(markers.iterdir())) >= 3, "the failures were not injected"
    assert_exact(spark, workdir)


def test_warm_path_and_materialization_then_restart(spark, workdir, tmp_path):
    config = local_config(tmp_path)
    first = run(spark, workdir, config, 4)
    assert [p.warm_instances for p in first[1:]] == [p.instances for p in first[1:]], (
        "working copies not reused"
    )
    assert any(p.materialized for p in first), "no instance materialized its state"
    assert any(p.rebased for p in first[1:]), "no checkpoint moved onto a snapshot written in the background"
    assert all(p.persisted_bytes > 0 and p.full_checkpoint_bytes > 0 for p in first)
    # the executors' storage figures reach the driver: every batch persisted
    assert all(p.storage.get("persists", 0) >= p.instances for p in first), [p.storage for p in first]
    # A new working dir: the restarted run has no working copy and restores from the checkpoint.
    second = run(spark, workdir, {**config, "dstl.spark.working-dir": str(tmp_path / "other")}, 7)
    assert second[0].warm_instances == 0 and second[0].restore_ms > 0
    result = assert_exact(spark, workdir)
    # event-time timers closed windows and sessions, across the restart
    assert result["windows"] > 0 and result["sessions"] > 0, result
    assert sum(p.timers_fired for p in first + second) >= result["windows"]


@pytest.mark.parametrize("parallelisms", [(2, 3, 1)])
def test_rescale_keeps_the_state(spark, workdir, tmp_path, parallelisms):
    for step, parallelism in enumerate(parallelisms, start=1):
        progress = run(
            spark, workdir, local_config(tmp_path, **{"dstl.spark.parallelism": parallelism}), 3 * step
        )
        assert max(p.instances for p in progress) == parallelism
    assert_exact(spark, workdir)


def test_job_checkpointed_on_local_continues_on_kafka(spark, workdir, tmp_path, kafka_config):
    run(spark, workdir, local_config(tmp_path), 3)
    on_kafka = {**local_config(tmp_path), **kafka_config}
    run(spark, workdir, on_kafka, 6)
    # Restore driven by handles of both storages, with no working copy to lean on.
    run(spark, workdir, {**on_kafka, "dstl.spark.working-dir": str(tmp_path / "fresh")}, 8)
    assert_exact(spark, workdir)


def test_a_damaged_latest_checkpoint_stops_the_job_unless_rollback_is_chosen(
    spark, workdir, tmp_path, caplog
):
    from dstl.spi import CorruptedError

    config = local_config(tmp_path)
    run(spark, workdir, config, 3)
    documents = sorted((workdir / "checkpoint" / "dstl-state" / "demo" / "checkpoints").glob("chk-*.json"))
    latest = documents[-1]
    latest.write_bytes(latest.read_bytes()[:20])
    with pytest.raises(CorruptedError) as info:
        run(spark, workdir, config, 4)
    assert str(latest) in str(info.value) and "state.checkpoints.on-damaged=previous" in str(info.value)
    progress = run(spark, workdir, {**config, "state.checkpoints.on-damaged": "previous"}, 4)
    assert progress, "the job did not continue"
    assert "ROLLBACK" in caplog.text and latest.name in caplog.text


def test_state_that_disagrees_with_sparks_checkpoint_is_refused(spark, workdir, tmp_path):
    config = local_config(tmp_path)
    run(spark, workdir, config, 2)
    state_dir = workdir / "checkpoint" / "dstl-state"
    for document in (state_dir / "demo" / "checkpoints").glob("chk-*.json"):
        document.unlink()  # the state is gone, Spark's offsets are not
    write_input_file(workdir / "input", 2, ROWS)
    query = start_pipeline(spark, workdir, config, trigger={"availableNow": True})
    with pytest.raises(Exception, match="must continue from checkpoint 1, but state.checkpoints.dir"):
        query.await_termination(timeout=300)


class PerKeyDemo(DemoProcessor):
    """The demo on the per-key API (handle_input_rows), not its batch API."""

    handle_batch = StatefulProcessor.handle_batch


def test_the_per_key_api_gives_the_same_exact_state(spark, workdir, tmp_path):
    progress = run(spark, workdir, local_config(tmp_path), 3, processor=PerKeyDemo)
    assert sum(p.rows for p in progress) == 3 * ROWS
    assert_exact(spark, workdir)


def test_snapshots_finished_in_their_tasks_are_moved_onto_by_the_next_batch(spark, workdir, tmp_path):
    """``dstl.spark.finish-in-task-gap=0s``: the plan crosses to the executors and each task waits."""
    progress = run(spark, workdir, local_config(tmp_path, **{"dstl.spark.finish-in-task-gap": "0s"}), 4)
    materializing = [p for p in progress if p.materialized]
    assert materializing and all("snapshot" in p.task_phases_ms for p in materializing), [
        (p.materialized, p.task_phases_ms) for p in progress
    ]
    for before, after in itertools.pairwise(progress):
        # complete before its task ended: the instance's next task always moves onto it
        assert set(before.materialized) <= set(after.rebased), (before.materialized, after.rebased)
    assert_exact(spark, workdir)
