"""Reading a query's state and change feed as DataFrames (real PySpark), read only."""

import json

import pytest

from dstl.backend.spark import read_changes, read_state, wait_for_snapshots
from dstl.backend.spark.demo.pipeline import EVENT_COLUMNS, expected_state, start_pipeline, write_input_file
from dstl.spi import InvalidHandleError

ROWS = 400


@pytest.fixture(scope="module")
def finished_query(spark, tmp_path_factory):
    """The demo pipeline over 5 files (a batch each) on local storage, stopped."""
    workdir = tmp_path_factory.mktemp("reader") / "job"
    for index in range(5):
        write_input_file(workdir / "input", index, ROWS)
    config = {
        "dstl.storage": "local",
        "dstl.spark.working-dir": str(workdir / "working"),
        "state.changelog.materialization.interval": "0s",
        # every snapshot that reads a copy is encoded by a child forked from Spark's Python worker
        "state.changelog.materialization.encode-apart-from": "1",
    }
    query = start_pipeline(spark, workdir, config, trigger={"availableNow": True})
    query.await_termination(timeout=300)
    assert query.exception() is None, query.exception()
    assert wait_for_snapshots(workdir / "working", timeout=60), "a snapshot still ran after 60 s"
    return workdir, query.progress


def test_read_state_gives_every_users_state_as_the_query_holds_it(spark, finished_query):
    workdir, progress = finished_query
    before = sorted(p.name for p in (workdir / "checkpoint" / "dstl-state").rglob("*") if p.is_file())
    frame = read_state(spark, str(workdir / "checkpoint"))
    rows = frame.collect()
    expected = expected_state(spark, workdir / "input", None)
    totals = {json.loads(r["key"]): json.loads(r["value"]) for r in rows if r["state"] == "total"}
    assert totals == {user: figures["total"] for user, figures in expected.items()}
    counts = {json.loads(r["key"]): json.loads(r["value"]) for r in rows if r["state"] == "events"}
    assert counts == {user: figures["events"] for user, figures in expected.items()}
    pages = next(
        json.loads(r["value"]) for r in rows if r["state"] == "pages" and json.loads(r["key"]) == "u0"
    )
    assert json.dumps(dict(sorted(pages.items()))) == expected["u0"]["pages"]
    assert {r["batch_id"] for r in rows} == {progress[-1].batch_id}
    assert not any(r["state"].startswith("__dstl.") for r in rows)  # timers only when asked
    assert any(
        r["state"].startswith("__dstl.")
        for r in read_state(spark, str(workdir / "checkpoint"), internal=True).collect()
    )
    after = sorted(p.name for p in (workdir / "checkpoint" / "dstl-state").rglob("*") if p.is_file())
    assert after == before  # read only


def test_read_changes_gives_the_change_feed_of_the_batches_still_logged(spark, finished_query):
    workdir, progress = finished_query
    last = progress[-1].batch_id
    changes = read_changes(spark, str(workdir / "checkpoint"), from_batch=last, to_batch=last).collect()
    assert {r["batch_id"] for r in changes} == {last}
    updated = {json.loads(r["key"]) for r in changes if r["state"] == "total" and r["op"] == "value_put"}
    users = spark.range(last * ROWS, (last + 1) * ROWS).selectExpr(f"{EVENT_COLUMNS['user']} as user")
    assert updated == {row["user"] for row in users.distinct().collect()}
    with pytest.raises(InvalidHandleError, match="not retained"):
        read_state(spark, str(workdir / "checkpoint"), batch_id=0)


def test_read_changes_refuses_a_batch_whose_log_a_materialization_truncated(spark, tmp_path, monkeypatch):
    from .test_standby import _batch, _runner

    # Batch by batch, each batch's snapshot ending before the next (a query's snapshots land in
    # the background, a batch or more later under load): the log is truncated a batch behind.
    runner = _runner(tmp_path, monkeypatch, "0s")
    for batch_id in range(4):
        _batch(runner, batch_id, str(tmp_path / "executor"), ["a", "b", "a"], None)
    location, config = str(tmp_path / "chk"), dict(runner.cfg.raw())
    with pytest.raises(InvalidHandleError, match="batch 0 has no retained log"):
        read_changes(spark, location, from_batch=0, config=config, job_id="job")
    changes = read_changes(spark, location, from_batch=3, to_batch=3, config=config, job_id="job").collect()
    assert {r["batch_id"] for r in changes} == {3}
    assert {json.loads(r["key"]) for r in changes if r["op"] == "value_put"} == {"a", "b"}


class _RunsWhenUnpickled:
    """A pickle payload that leaves a file behind when loaded: code a checkpoint's author chose."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import pathlib

        return pathlib.Path.touch, (pathlib.Path(self.marker),)


def test_read_state_never_unpickles_a_checkpoints_values_unless_allowed(spark, tmp_path):
    from dstl.backend.changelog import ChangelogKeyedStateBackend
    from dstl.backend.checkpoints import CheckpointCoordinator
    from dstl.spi import KeyGroupRange, load_storage

    marker = tmp_path / "ran"
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "log")}
    directory = (tmp_path / "state").as_uri()  # a plain state directory, not a Spark location
    with load_storage(config, job_id="job") as storage:
        coordinator = CheckpointCoordinator(directory, "job", config=config)
        backend = ChangelogKeyedStateBackend(storage, "op", KeyGroupRange(0, 128), snapshot_dir=directory)
        backend.set_current_key("alice")
        backend.value_state("plain").update(7)
        backend.value_state("payload", serializer="pickle").update(_RunsWhenUnpickled(str(marker)))
        coordinator.complete(1, {"kg0-128": backend.checkpoint(1).result(timeout=30)})
        backend.close()
    assert not marker.exists()

    rows = {r["state"]: r for r in read_state(spark, str(tmp_path / "state"), config=config).collect()}
    assert json.loads(rows["plain"]["value"]) == 7 and json.loads(rows["plain"]["key"]) == "alice"
    shown = json.loads(rows["payload"]["value"])
    assert set(shown) == {"bytes"} and shown["bytes"] > 0
    assert not marker.exists()  # the checkpoint's code did not run on the executors

    read_state(spark, str(tmp_path / "state"), config=config, allow_pickle=True).collect()
    assert marker.exists()  # opting in decodes (and so trusts the checkpoint's author)
