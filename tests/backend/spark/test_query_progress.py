"""Spark's own progress of each batch reaches users joined with the batch's state figures."""

import json
import time
from types import SimpleNamespace

from dstl.backend.spark import QueryProgress, StatefulProcessor, transform_with_state
from dstl.backend.spark.demo.pipeline import start_pipeline, write_input_file
from dstl.backend.spark.query_progress import OPERATOR_NAME, ProgressBridge

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
    recent = query.recent_progress  # read from the query: no wait
    deadline = time.monotonic() + 60  # Spark's listener bus delivers after the batch, asynchronously
    while not (joined and joined[-1].batch_id == batches[-1]) and time.monotonic() < deadline:
        time.sleep(0.1)
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


class CountOrForget(StatefulProcessor):
    """A count per user; a row with ``v < 0`` removes the user's count."""

    def init(self, context):
        self.count = context.get_value_state("count")

    def handle_input_rows(self, key, rows):
        if (rows["v"] < 0).any():
            self.count.clear()
            return None
        self.count.update((self.count.value() or 0) + len(rows))
        return [{"user": key, "count": self.count.value()}]


def test_last_progress_reads_like_sparks_and_is_current_when_process_all_available_returns(spark, tmp_path):
    directory = tmp_path / "in"
    directory.mkdir()

    def write(index, rows):
        path = directory / f"part-{index:03d}.json"
        path.write_text("".join(json.dumps({"user": user, "v": v}) + "\n" for user, v in rows))

    write(0, [(f"u{i}", 1) for i in range(10)])
    query = transform_with_state(
        spark.readStream.schema("user string, v long").option("maxFilesPerTrigger", 1).json(str(directory)),
        key_columns=["user"],
        processor=CountOrForget,
        output_schema="user string, count long",
        sink=lambda frame, batch_id: None,
        checkpoint_location=str(tmp_path / "chk"),
        config={**local_config(tmp_path), "dstl.spark.parallelism": "2"},
    )
    try:
        query.process_all_available()
        first = query.last_progress
        assert first is not None and first["batchId"] == query.progress[-1].batch_id == 0
        write(1, [("u0", 1), ("u1", -1), ("u2", -1), ("new", 1)])
        query.process_all_available()
        last = query.last_progress  # no wait for the listener bus: the batch is there
        assert last["batchId"] == query.progress[-1].batch_id == 1
    finally:
        query.stop()
    (operator,) = [op for op in last["stateOperators"] if op["operatorName"] == OPERATOR_NAME]
    assert operator["numRowsTotal"] == 9  # 10 users, 2 forgotten, 1 new
    assert operator["numRowsUpdated"] == 2 and operator["numRowsRemoved"] == 2
    assert operator["numShufflePartitions"] == operator["numStateStoreInstances"] == 2
    assert operator["memoryUsedBytes"] > 0 and operator["commitTimeMs"] >= 0
    assert operator["customMetrics"]["persistedBytes"] == last.state.persisted_bytes > 0
    assert last["sink"]["numOutputRows"] == 2  # u0 and new
    assert last["numInputRows"] == 4
    assert json.loads(last.json)["stateOperators"] == last["stateOperators"]
    assert dict(last)["dstl"]["rows_removed"] == 2
    assert first["stateOperators"][-1]["numRowsTotal"] == 10
    assert [p["batchId"] for p in query.recent_progress] == [0, 1]
