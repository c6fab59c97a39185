"""Queries sharing one storage and one working directory never share a job: ids bound to locations."""

import pytest

from dstl.backend.spark.demo.pipeline import start_pipeline, write_input_file
from dstl.backend.spark.job_identity import JOB_ID_FILE, default_job_id, resolve_job_id
from dstl.spi import ConfigError, JobConflictError
from tests.backend.spark.test_query import ROWS, assert_exact, run


def _run(spark, workdir, config, files, job_id=None):
    return run(spark, workdir, config, files, job_id=job_id)


def test_two_queries_with_default_ids_on_one_storage_stay_apart_and_warm(spark, tmp_path):
    shared = {
        "dstl.storage": "local",
        "dstl.local.dir": str(tmp_path / "shared-log"),  # one directory for both, as a team shares one
        "dstl.spark.working-dir": str(tmp_path / "working"),
        "state.changelog.materialization.interval": "0s",
        "state.checkpoints.orphan-collection.interval": "0s",  # collect at every batch
        "state.checkpoints.orphan-collection.grace": "1s",
    }
    first, second = tmp_path / "a", tmp_path / "b"
    runs = {first: [], second: []}
    for files in (2, 4):
        for workdir in (first, second):
            runs[workdir] += _run(spark, workdir, shared, files)
    ids = {w: (w / "checkpoint" / JOB_ID_FILE).read_text() for w in (first, second)}
    assert ids[first] != ids[second]
    assert sorted(p.name for p in (tmp_path / "shared-log").iterdir()) == sorted(ids.values())
    for workdir, progress in runs.items():
        assert len(progress) == 4
        # the working copies of one query are not the other's: every later batch is warm
        later = progress[1:]
        assert [p.warm_instances for p in later] == [p.instances for p in later], workdir
        assert_exact(spark, workdir)


def test_a_second_location_claiming_a_bound_job_id_is_refused_at_start(spark, tmp_path):
    shared = {
        "dstl.storage": "local",
        "dstl.local.dir": str(tmp_path / "shared-log"),
        "dstl.spark.working-dir": str(tmp_path / "working"),
    }
    _run(spark, tmp_path / "a", shared, 1, job_id="team")
    write_input_file(tmp_path / "b" / "input", 0, ROWS)
    with pytest.raises(JobConflictError) as refused:
        start_pipeline(spark, tmp_path / "b", shared, trigger={"availableNow": True}, job_id="team")
    message = str(refused.value)
    assert str(tmp_path / "a" / "checkpoint") in message and str(tmp_path / "b" / "checkpoint") in message
    assert "job_id" in message
    assert not any(spark.streams.active), "the refused query was started"
    # the first job goes on undisturbed
    _run(spark, tmp_path / "a", shared, 2, job_id="team")
    assert_exact(spark, tmp_path / "a")


def test_a_location_keeps_the_job_id_it_started_with(tmp_path):
    location = str(tmp_path / "chk")
    chosen = resolve_job_id(location, None)
    assert chosen == default_job_id((tmp_path / "chk").as_uri()) and chosen.startswith("chk-")
    assert resolve_job_id(location, None) == chosen
    assert resolve_job_id(location, chosen) == chosen
    with pytest.raises(ConfigError, match="differs from the job id"):
        resolve_job_id(location, "another")
    other = str(tmp_path / "explicit")
    assert resolve_job_id(other, "mine") == "mine" and resolve_job_id(other, None) == "mine"
    (tmp_path / "explicit" / JOB_ID_FILE).write_text("../escape")
    with pytest.raises(ConfigError, match="damaged"):
        resolve_job_id(other, None)
