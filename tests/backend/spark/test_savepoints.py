"""Savepoints: taken from a job on ``local``, a new job continues from them on ``kafka``, ``filesystem``."""

import json
import shutil

import pytest

from dstl.backend.checkpoints.savepoints import SAVEPOINT_FILE, Savepoint, adopt_savepoint, read_savepoint
from dstl.backend.spark import read_state
from dstl.backend.spark.demo.pipeline import expected_state, start_pipeline, write_input_file
from dstl.spi import ChangelogHandle, InvalidHandleError, KeyGroupRange, SequenceNumberRange
from dstl.spi.cli import main

ROWS = 400


def run(spark, workdir, config, files):
    for index in files:
        write_input_file(workdir / "input", index, ROWS)
    query = start_pipeline(spark, workdir, config, trigger={"availableNow": True})
    query.await_termination(timeout=300)
    assert query.exception() is None, query.exception()
    return query.progress


@pytest.fixture(scope="module")
def savepoint(spark, tmp_path_factory):
    """A savepoint of a job that ran 3 batches on local storage (its logs are not needed after)."""
    base = tmp_path_factory.mktemp("savepoint")
    workdir = base / "first"
    config = {
        "dstl.storage": "local",
        "dstl.spark.working-dir": str(base / "working-first"),
        "state.changelog.materialization.interval": "0s",
    }
    run(spark, workdir, config, range(3))
    target = base / "savepoint"
    assert main(["savepoint", str(workdir / "checkpoint"), str(target)]) == 0
    shutil.rmtree(workdir / "checkpoint" / "dstl-changelog")  # the local log: a savepoint needs none of it
    return workdir, target


def test_a_savepoint_is_self_contained_full_snapshots(savepoint):
    _, target = savepoint
    point = read_savepoint(str(target))
    assert point.job == "demo" and point.snapshots
    assert all(not s.handles and len(s.materialized) == 1 for s in point.snapshots.values())
    assert point.time.watermark_ms is not None  # the demo runs on event time: its clock goes along
    assert main(["savepoint", str(savepoint[0] / "checkpoint"), str(target)]) != 0  # not over another


@pytest.mark.parametrize("storage", ["kafka", "filesystem"])
def test_a_job_continues_from_a_savepoint_on_another_storage(spark, savepoint, tmp_path, storage, request):
    first, target = savepoint
    workdir = tmp_path / "second"
    if storage == "kafka":
        config = dict(request.getfixturevalue("kafka_config"))
    else:
        config = {"dstl.storage": "filesystem", "dstl.dfs.base-path": (tmp_path / "dfs").as_uri()}
    config |= {
        "dstl.spark.working-dir": str(tmp_path / "working"),
        "state.changelog.materialization.interval": "0s",
        "state.savepoint.path": str(target),
    }
    run(spark, workdir, config, range(3, 5))  # only the new files: the savepoint holds the first three
    everything = tmp_path / "all"
    shutil.copytree(first / "input", everything)
    for path in (workdir / "input").iterdir():
        shutil.copy2(path, everything / path.name)
    expected = expected_state(spark, everything, None)
    rows = read_state(spark, str(workdir / "checkpoint"), config=config).collect()
    totals = {json.loads(r["key"]): json.loads(r["value"]) for r in rows if r["state"] == "total"}
    assert totals == {user: figures["total"] for user, figures in expected.items()}
    events = {json.loads(r["key"]): json.loads(r["value"]) for r in rows if r["state"] == "events"}
    assert events == {user: figures["events"] for user, figures in expected.items()}


def test_a_damaged_or_mismatched_savepoint_is_refused(savepoint, tmp_path):
    _, target = savepoint
    with pytest.raises(InvalidHandleError, match="max-parallelism=128"):
        adopt_savepoint(str(target), tmp_path.as_uri(), "job", max_parallelism=64)
    doc = json.loads((target / SAVEPOINT_FILE).read_text())
    name = next(iter(doc["checkpoint"]["snapshots"]))
    handle = ChangelogHandle.create(
        storage_id="local", log_id="x", key_groups=KeyGroupRange(0, 64), sqn_range=SequenceNumberRange(0, 1)
    )
    handle_doc = json.loads(handle.to_json())
    doc["checkpoint"]["snapshots"][name]["handles"] = [handle_doc]
    with pytest.raises(InvalidHandleError, match="not one self-contained full snapshot"):
        Savepoint.from_json(json.dumps(doc), "forged")
    with pytest.raises(InvalidHandleError, match="holds no savepoint"):
        read_savepoint(str(tmp_path))
