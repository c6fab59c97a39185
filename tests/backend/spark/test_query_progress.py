"""Spark's own progress of each batch reaches users joined with the batch's state figures."""

import json
import time
from types import SimpleNamespace

from dstl.backend.spark import QueryProgress
from dstl.backend.spark.demo.pipeline import start_pipeline, write_input_file
from dstl.backend.spark.query_progress import ProgressBridge

from .test_query import ROWS, local_config


def test_sparks_progress_of_every_batch_carries_its_state_figures(spark, tmp_path):
    workdir = tmp_path / "job"
    for index in range(3):
        write_input_file(workdir / "input", index, ROWS)
    joined: list[QueryProgress] = []
    query = start_pipeline(spark, workdir, local_config(tmp_path), trigger={"availableNow": True})
    query.add_progress_listener(joined.append)
    query.await_termination(timeout=300)
    assert query.exception() is None, query.exception()
    batches = [p.batch_id for p in query.progress]
    deadline = time.monotonic() + 60  # Spark's listener bus delivers after the batch, asynchronously
    while [p.batch_id for p in query.recent_progress] != batches and time.monotonic() < deadline:
        time.sleep(0.1)
    recent = query.recent_progress
    assert [p.batch_id for p in recent] == batches and batches, (recent, batches)
    for joined_batch, state in zip(recent, query.progress, strict=True):
        assert joined_batch.state == state
        # Spark's own figures of the same batch: its id, the query's id and the rows it read
        assert joined_batch.spark["batchId"] == state.batch_id
        assert joined_batch.spark["id"] == str(query.query.id)
        assert joined_batch.spark["numInputRows"] == state.rows
        document = json.loads(joined_batch.to_json())
        assert document["dstl"]["persisted_bytes"] == state.persisted_bytes > 0
        assert document["numInputRows"] == state.rows
    assert query.last_progress == recent[-1]
    # the listener registered after start still saw every batch that completed after it
    assert {p.batch_id for p in joined} <= set(batches)
    assert joined and joined[-1].batch_id == batches[-1]
    query.stop()


def _event(query_id, batch_id):
    progress = SimpleNamespace(
        id=query_id, batchId=batch_id, json=json.dumps({"id": query_id, "batchId": batch_id})
    )
    return SimpleNamespace(progress=progress)


def test_the_bridge_joins_only_its_own_query_even_before_it_knows_the_id():
    states = {4: "state-4", 5: "state-5"}
    bridge = ProgressBridge(states.get)
    seen = []
    bridge.listeners.append(lambda p: seen.append((p.batch_id, p.state)))
    bridge.onQueryProgress(_event("ours", 4))  # before start() returned: kept
    bridge.onQueryProgress(_event("other", 5))
    assert not seen
    bridge.bind("ours")
    bridge.onQueryProgress(_event("other", 5))
    bridge.onQueryProgress(_event("ours", 5))
    bridge.onQueryProgress(_event("ours", 6))  # no state figures for it: not joined
    assert seen == [(4, "state-4"), (5, "state-5")]
    assert [p.batch_id for p in bridge.recent] == [4, 5]


def test_a_failing_progress_listener_does_not_keep_others_from_their_batches():
    bridge = ProgressBridge(lambda batch_id: f"state-{batch_id}")
    bridge.bind("q")
    seen = []

    def broken(_progress):
        raise RuntimeError("listener bug")

    bridge.listeners.extend([broken, seen.append])
    bridge.onQueryProgress(_event("q", 1))
    assert [p.batch_id for p in seen] == [1]
