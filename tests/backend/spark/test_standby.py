"""Standby copies: kept a batch behind on another executor's disk, they turn a lost home into a catch-up."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from concurrent.futures import wait
from dataclasses import replace

import pytest

from dstl.backend.changelog.materializer import Materializer
from dstl.backend.spark._private import standby, task
from dstl.backend.spark._private.call_checks import job_config
from dstl.backend.spark._private.protocol import Restore
from dstl.backend.spark._private.runner import BatchRunner, Phases, QuerySpec

from .test_protocol import Count, _rows
from .test_query import local_config

pytest.importorskip("pyspark")


def _runner(tmp_path, monkeypatch, interval: str, **extra: str) -> BatchRunner:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    config = local_config(
        tmp_path,
        **{"dstl.spark.parallelism": "1", "state.changelog.materialization.interval": interval, **extra},
    )
    schema = StructType([StructField("k", StringType()), StructField("n", LongType())])
    spec = QuerySpec("job", "op", ("k",), schema, Count, lambda frame, batch_id: None)
    monkeypatch.setattr(task, "_attempt", lambda: (7, 0))  # no Spark task here
    return BatchRunner(job_config({}, config, str(tmp_path / "chk")), spec)


def _batch(runner: BatchRunner, batch_id: int, working_dir: str, keys: list[str], standby_dir: str | None):
    """One batch: the standby refreshes to its base (as after the home's task), the home runs it."""
    base = runner.coordinator.latest()
    bases = runner._bases(base)
    clock, wake = runner._clock(base)
    plan = runner._plan(batch_id, base, bases, clock, wake)
    refreshed = None
    if standby_dir is not None:
        refreshed = standby.refresh_standby(replace(plan, working_dir=standby_dir), 0)
    output, report = task.process_instance(
        replace(plan, working_dir=working_dir), Count, _rows(runner, 0, keys), 0
    )
    runner.complete_batch(batch_id, base, bases, clock, [report.to_json()], Phases(0.0))
    _materialized(task.working_copy_of(replace(plan, working_dir=working_dir), 0))
    return refreshed, report.stats.restore, dict(zip(output["k"], output["n"], strict=True))


def _materialized(copy) -> None:
    """Wait (bounded) until no snapshot the batch began runs: one lands before the next batch, always."""
    deadline = time.monotonic() + 30
    while (claim := copy.claim_materialization()) is None:
        assert time.monotonic() < deadline, "a materialization did not end within 30 s"
        time.sleep(0.01)
    claim.close()


@pytest.mark.parametrize(
    ("interval", "landing"),
    [("1h", "after"), ("0s", "after"), ("0s", "alternately")],
    ids=["log only", "materializing every batch", "snapshots landing within their batch or after"],
)
def test_a_standby_follows_a_batch_behind_and_the_instance_moved_there_catches_up(
    tmp_path, monkeypatch, interval, landing
):
    if landing == "alternately":  # a race a small state wins at times: the snapshot lands before
        # its batch's checkpoint is taken (which stays on the chain as it was, all the same)
        start, starts = Materializer.start, itertools.count(1)

        def start_and_land(self, *args, **kwargs):
            running = start(self, *args, **kwargs)
            if next(starts) % 2 == 0:
                wait([running], timeout=30)
            return running

        monkeypatch.setattr(Materializer, "start", start_and_land)
    # many keys, few changed a batch: the snapshots after the first full one are incremental
    runner = _runner(
        tmp_path, monkeypatch, interval, **{"state.changelog.materialization.full-every": "1000"}
    )
    home, spare = str(tmp_path / "executor-1"), str(tmp_path / "executor-2")
    seen: Counter[str] = Counter()
    refreshes, restores = [], []
    for batch_id in range(6):
        keys = [f"k{i}" for i in range(200)] if batch_id == 0 else ["a", "b", "a"]
        refreshed, restore, counts = _batch(runner, batch_id, home, keys, spare)
        seen.update(keys)
        refreshes.append(refreshed)
        restores.append(restore)
        assert counts == {key: seen[key] for key in keys}
    assert refreshes[0] is None  # no state yet
    assert refreshes[1] is Restore.FULL  # the first refresh restores the copy
    if interval == "1h":  # the base grows by log only: every later refresh reads only the new batch
        assert refreshes[2:] == [Restore.CAUGHT_UP] * 4
        assert restores[1:] == [Restore.WARM] * 5
    else:  # each batch's snapshot lands before the next batch (or within its own: its checkpoint
        # still stands on the chain before it), which rebases onto it: the standby holds the batch
        # each new snapshot was taken at, so it catches up on the log after it (loading the snapshot
        # would take back what it applied since)
        assert refreshes[2:] == [Restore.CAUGHT_UP] * 4
        assert restores[1:] == [Restore.REBASED] * 5
    # The home executor is lost: the instance runs on the standby's executor.
    _, restore, counts = _batch(runner, 6, spare, ["a", "c", "k7"], None)
    assert restore is Restore.CAUGHT_UP, "the instance restored in full despite its standby copy"
    assert counts == {"a": 11, "c": 1, "k7": 2}  # exact: nothing lost or counted twice
    _, restore, counts = _batch(runner, 7, spare, ["b"], None)
    assert restore.warm and counts == {"b": 6}


def test_a_refresh_leaves_a_copy_at_a_later_batch_and_a_held_copy_alone(tmp_path, monkeypatch):
    runner = _runner(tmp_path, monkeypatch, "1h")
    home = str(tmp_path / "executor-1")
    for batch_id in range(2):
        _batch(runner, batch_id, home, ["a"], None)
    base = runner.coordinator.latest()
    plan = runner._plan(2, base, runner._bases(base), *runner._clock(base))
    # executors sharing one directory: the instance's own copy is at the base already, then past it
    assert standby.refresh_standby(replace(plan, working_dir=home), 0) is Restore.WARM
    _, restore, _ = _batch(runner, 2, home, ["a"], home)
    assert restore.warm
    assert standby.refresh_standby(replace(plan, working_dir=home), 0) is None  # at batch 2: untouched
    _, restore, counts = _batch(runner, 3, home, ["a"], None)
    assert restore.warm and counts == {"a": 4}
    spare = replace(plan, working_dir=str(tmp_path / "executor-2"))
    held: list[Restore | None] = []
    with task.working_copy_of(spare, 0).exclusive():  # a task holds the copy: the refresh skips it
        refreshing = threading.Thread(target=lambda: held.append(standby.refresh_standby(spare, 0)))
        refreshing.start()
        refreshing.join(timeout=30)
    assert held == [None], "the refresh waited for, or changed, a copy a task holds"
    assert standby.refresh_standby(spare, 0) is Restore.FULL


def test_refreshes_leave_no_namespace_of_their_private_log_behind(tmp_path, monkeypatch):
    from dstl.spi.memory._private import storage as memory

    runner = _runner(tmp_path, monkeypatch, "1h")
    for batch_id in range(2):
        _batch(runner, batch_id, str(tmp_path / "executor-1"), ["a"], None)
    before = set(memory._NAMESPACES)
    base = runner.coordinator.latest()
    plan = runner._plan(2, base, runner._bases(base), *runner._clock(base))
    for executor in range(3):  # each a full restore through a private log of its own
        spare = replace(plan, working_dir=str(tmp_path / f"spare-{executor}"))
        assert standby.refresh_standby(spare, 0) is Restore.FULL
    assert set(memory._NAMESPACES) == before, "a refresh left its private namespace in the process"


@pytest.mark.parametrize("gap", ["0s", "1h"], ids=["finished in the task", "in the background"])
def test_a_task_finishing_in_task_waits_for_the_standby_refreshes_it_queued(tmp_path, monkeypatch, gap):
    """Spark stops a worker idle for a minute: a refresh running past its task would end with it."""
    from dstl.backend.spark._private.working_copy import held_checkpoint

    runner = _runner(tmp_path, monkeypatch, "1h", **{"dstl.spark.finish-in-task-gap": gap})
    home, spare = str(tmp_path / "executor-1"), str(tmp_path / "executor-2")
    _batch(runner, 0, home, [f"k{i}" for i in range(50)], None)
    base = runner.coordinator.latest()
    clock, wake = runner._clock(base)
    plan = replace(
        runner._plan(1, base, runner._bases(base), clock, wake), working_dir=spare, standbys={0: (0,)}
    )
    refresh = standby.refresh_standby

    def slow_refresh(plan, instance):
        time.sleep(3.0)  # a refresh that outlasts its task
        return refresh(plan, instance)

    monkeypatch.setattr(standby, "refresh_standby", slow_refresh)
    standby.keep_copies(plan, [0], {})
    standby.finish_refreshes(plan, 0)
    own = plan.instance(0)
    refreshed = held_checkpoint(task.working_copy_of(plan, 0).stamp(), own.base, own.lineage)[0]
    assert refreshed is (gap == "0s"), "the task's wait and the copy's refresh disagree"
    if gap == "1h":  # the refresh ends in the background, as before
        deadline = time.monotonic() + 30
        while not held_checkpoint(task.working_copy_of(plan, 0).stamp(), own.base, own.lineage)[0]:
            assert time.monotonic() < deadline, "the background refresh did not end"
            time.sleep(0.05)


def test_a_standby_copys_full_restore_gives_way_to_the_workers_task_and_its_catch_up_does_not(
    tmp_path, monkeypatch
):
    from contextlib import contextmanager

    paced: list[bool] = []
    real = standby.in_background

    @contextmanager
    def noting():
        paced.append(True)
        with real():
            yield

    monkeypatch.setattr(standby, "in_background", noting)
    runner = _runner(tmp_path, monkeypatch, "1h")
    home, spare = str(tmp_path / "executor-1"), str(tmp_path / "executor-2")
    modes = []
    for batch_id in range(4):
        before = len(paced)
        refreshed, _, _ = _batch(runner, batch_id, home, [f"k{i}" for i in range(50)], spare)
        modes.append((refreshed, len(paced) > before))
    # a full restore (the state's size) is paced; a catch-up (one batch's changes) keeps pace
    assert modes == [
        (None, False),
        (Restore.FULL, True),
        (Restore.CAUGHT_UP, False),
        (Restore.CAUGHT_UP, False),
    ]
