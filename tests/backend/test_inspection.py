"""``dstl inspect``: what a checkpoint holds and the change records of its logs, read only."""

import json

import pytest

from dstl.backend.changelog import ChangelogKeyedStateBackend
from dstl.backend.checkpoints import CheckpointCoordinator, CheckpointLocation, TimeProgress
from dstl.backend.tools import describe_checkpoint, handle_changes
from dstl.spi import InvalidHandleError, KeyGroupRange, load_storage
from dstl.spi.cli import main

ALL = KeyGroupRange(0, 128)


@pytest.fixture
def job(tmp_path):
    """Three checkpoints of a job on local storage: a materialization after the first, then log only."""
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "log")}
    _run_job(config, (tmp_path / "chk").as_uri())
    return config, tmp_path / "chk"


def _run_job(config, checkpoints):
    with load_storage(config, job_id="job") as storage:
        coordinator = CheckpointCoordinator(checkpoints, "job", num_retained=2, config=config)
        backend = ChangelogKeyedStateBackend(storage, "op", ALL, snapshot_dir=checkpoints)
        counts, tags = backend.value_state("counts"), backend.map_state("tags")
        secrets = backend.value_state("secrets", serializer="pickle")
        for checkpoint_id in (1, 2, 3):
            for user in ("alice", "bob"):
                backend.set_current_key(user)
                counts.update((counts.value() or 0) + checkpoint_id)
                tags.put(f"t{checkpoint_id}", checkpoint_id)
                secrets.update({"never": "unpickled"})
            if checkpoint_id == 1:
                backend.materialize().result(timeout=30)
            snapshot = backend.checkpoint(checkpoint_id).result(timeout=30)
            coordinator.complete(
                checkpoint_id, {"kg0-128": snapshot}, TimeProgress(1_000 * checkpoint_id, {})
            )
            backend.notify_checkpoint_complete(snapshot)
        backend.close()


def test_a_checkpoint_shows_its_snapshots_log_handles_and_states(job):
    _, directory = job
    location = CheckpointLocation(str(directory))
    documents, damaged = location.checkpoints()
    assert [c.checkpoint_id for c in documents] == [2, 3] and not damaged
    described = describe_checkpoint(location, documents[-1])
    assert described["checkpoint_id"] == 3 and described["watermark_ms"] == 3_000
    instance = described["instances"]["kg0-128"]
    assert len(instance["materialized"]) == 1 and instance["snapshot_bytes"] > 0
    assert instance["materialized"][0]["entries"] > 0
    assert instance["states"]["counts"] == {"kind": "value", "serializer": "msgpack"}
    assert instance["states"]["tags"]["kind"] == "map"
    assert instance["handles"] and all(h["storage_id"] == "local" for h in instance["handles"])
    with pytest.raises(InvalidHandleError, match="no instance 'kg0-64'"):
        describe_checkpoint(location, documents[-1], "kg0-64")


def test_the_logs_change_records_decode_with_their_states_and_pickle_is_never_loaded(job):
    config, directory = job
    location = CheckpointLocation(str(directory))
    latest = location.checkpoints()[0][-1]
    changes = [
        (change.op.name, change.state, serializer)
        for handle in latest.snapshots["kg0-128"].handles
        for change, serializer in handle_changes(handle, config)
    ]
    assert ("VALUE_PUT", "counts", "msgpack") in changes and ("MAP_PUT", "tags", "msgpack") in changes
    assert ("VALUE_PUT", "secrets", "pickle") in changes


def test_the_command_prints_json_and_change_records(job, tmp_path, capsys):
    config, directory = job
    assert main(["inspect", str(directory), "--json"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert described["retained"] == [2, 3] and described["checkpoint_id"] == 3

    assert (
        main(
            [
                "inspect",
                str(directory),
                "--batch",
                "2",
                "--log",
                "--json",
                "--config",
                f"dstl.local.dir={config['dstl.local.dir']}",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert json.loads(lines[0])["checkpoint_id"] == 2
    records = [json.loads(line) for line in lines[1:]]
    puts = [r for r in records if r["state"] == "counts" and r["op"] == "value_put"]
    assert {r["key"] for r in puts} == {"alice", "bob"}
    assert all(isinstance(r["args"][0], int) for r in puts)
    assert all(r["args"] == [{"bytes": r["args"][0]["bytes"]}] for r in records if r["state"] == "secrets")

    handle = described["instances"]["kg0-128"]["handles"][0]
    snapshot = CheckpointLocation(str(directory)).checkpoints()[0][-1].snapshots["kg0-128"]
    handle_file = tmp_path / "handle.json"
    handle_file.write_text(snapshot.handles[0].to_json())
    assert handle["sqn_range"] == [snapshot.handles[0].sqn_range.start, snapshot.handles[0].sqn_range.end]
    assert (
        main(
            [
                "inspect",
                "--handle",
                str(handle_file),
                "--config",
                f"dstl.local.dir={config['dstl.local.dir']}",
            ]
        )
        == 0
    )
    assert "change records" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batch", "1"], "checkpoint 1 is not retained"),
        (["--instance", "kg0-64"], "no instance 'kg0-64'"),
        (["--job", "other"], "no job 'other'"),
    ],
)
def test_what_the_checkpoint_does_not_hold_is_a_clear_error(job, capsys, argv, message):
    _, directory = job
    assert main(["inspect", str(directory), *argv]) != 0
    assert message in " ".join(capsys.readouterr().out.split())  # rich wraps long lines


def test_a_directory_without_checkpoints_says_so(tmp_path, capsys):
    assert main(["inspect", str(tmp_path)]) != 0
    assert "holds no job's checkpoints" in " ".join(capsys.readouterr().out.split())


def test_a_spark_checkpoint_location_finds_its_state_and_local_log(job, tmp_path):
    import shutil

    _, directory = job
    spark_location = tmp_path / "query"
    shutil.copytree(directory, spark_location / "dstl-state")
    location = CheckpointLocation(str(spark_location))
    assert [c.checkpoint_id for c in location.checkpoints()[0]] == [2, 3]
    assert location.config({})["dstl.local.dir"] == f"{spark_location}/dstl-changelog"
    assert location.config({"dstl.local.dir": "/elsewhere"})["dstl.local.dir"] == "/elsewhere"


def test_a_spark_checkpoint_location_on_filesystem_reads_its_log_where_the_job_put_it(tmp_path, capsys):
    """A Spark job on ``filesystem`` without a base path logs to dstl-dfs: inspect finds it there."""
    spark_location = tmp_path / "query"
    config = {"dstl.storage": "filesystem", "dstl.dfs.base-path": (spark_location / "dstl-dfs").as_uri()}
    _run_job(config, (spark_location / "dstl-state").as_uri())
    assert (
        CheckpointLocation(str(spark_location)).config({})["dstl.dfs.base-path"]
        == config["dstl.dfs.base-path"]
    )

    assert main(["inspect", str(spark_location), "--log", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    records = [json.loads(line) for line in lines[1:]]
    assert {r["key"] for r in records if r["state"] == "counts" and r["op"] == "value_put"} == {
        "alice",
        "bob",
    }


def _tree(root):
    return sorted((str(p.relative_to(root)), p.stat().st_size) for p in root.rglob("*"))


def test_inspect_and_savepoint_create_nothing_where_the_job_keeps_its_log(job, tmp_path):
    config, directory = job
    log_dir = tmp_path / "log"
    before = _tree(log_dir)
    with_log = ["--config", f"dstl.local.dir={log_dir}"]
    assert main(["inspect", str(directory), "--log", "--json", *with_log]) == 0
    assert main(["savepoint", str(directory), str(tmp_path / "sp"), *with_log]) == 0
    assert _tree(log_dir) == before  # no 'inspect' or 'restore' job directories, locks or epoch files


def test_a_read_only_storage_refuses_writes_and_deletes(tmp_path):
    from dstl.spi import ReadOnlyError

    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "log")}
    with load_storage(config, job_id="job") as storage:
        writer = storage.create_writer("op", ALL)
        writer.append(0, b"x")
        handle = writer.persist(0, 1).result(timeout=30)
    before = _tree(tmp_path / "log")
    with load_storage(config, job_id="job", read_only=True) as reader_only:
        assert [c.data for c in reader_only.create_reader().read(handle)] == [b"x"]
        for refused in (
            lambda: reader_only.create_writer("op", ALL),
            lambda: reader_only.discard([handle]),
            lambda: reader_only.collect_orphans([], older_than=0.0),
            lambda: reader_only.bind_job("somewhere"),
        ):
            with pytest.raises(ReadOnlyError, match="read only"):
                refused()
    with load_storage(config, job_id="never-written", read_only=True):
        pass
    assert _tree(tmp_path / "log") == before


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge"])
def test_a_checkpoint_document_that_is_no_regular_file_is_damaged_not_read(job, tmp_path, kind, capsys):
    import os

    _, directory = job
    latest = directory / "job" / "checkpoints" / "chk-000000000003.json"
    latest.unlink()
    if kind == "fifo":
        os.mkfifo(latest)
    elif kind == "dev-zero":
        latest.symlink_to("/dev/zero")
    else:
        with open(latest, "wb") as file:
            file.truncate(1 << 40)  # sparse: 1 TB recorded, nothing read
    assert main(["inspect", str(directory), "--json"]) == 0  # returns, does not hang or blow up
    described = json.loads(capsys.readouterr().out)
    assert described["checkpoint_id"] == 2
    (damaged,) = described["damaged"]
    assert damaged["checkpoint_id"] == 3
    assert "regular file" in damaged["reason"] or "more than" in damaged["reason"]


def test_hostile_names_are_printed_escaped(tmp_path, capsys):
    config = {"dstl.storage": "memory", "dstl.memory.namespace": "hostile-names"}
    checkpoints = (tmp_path / "chk").as_uri()
    with load_storage(config, job_id="job") as storage:
        coordinator = CheckpointCoordinator(checkpoints, "job", config=config)
        backend = ChangelogKeyedStateBackend(storage, "op", ALL, snapshot_dir=checkpoints)
        backend.set_current_key("k")
        backend.value_state("a[/]b\x1b[2Jc").update(1)
        backend.materialize().result(timeout=30)
        snapshot = backend.checkpoint(1).result(timeout=30)
        coordinator.complete(1, {"kg0-128": snapshot}, TimeProgress(None, {"[/]\x1b]0;evil\x07": 5}))
        backend.close()
        assert main(["inspect", str(tmp_path / "chk"), "--batch", "1"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b" in out and "[/]" in out


@pytest.mark.parametrize("what", ["snapshot", "segment"])
def test_a_snapshot_or_segment_that_is_a_fifo_is_reported_not_waited_for(job, tmp_path, capsys, what):
    import os

    config, directory = job
    if what == "snapshot":
        (target,) = (directory / "job" / "snapshots").rglob("*.snap")
    else:
        (target,) = (tmp_path / "log" / "job" / "segments").glob("*.log")
    target.unlink()
    os.mkfifo(target)
    argv = ["inspect", str(directory), "--json", "--config", f"dstl.local.dir={config['dstl.local.dir']}"]
    code = main([*argv, "--log"] if what == "segment" else argv)
    out = capsys.readouterr().out
    if what == "snapshot":
        assert code == 0
        (item,) = json.loads(out)["instances"]["kg0-128"]["materialized"]
        assert "not a regular file" in item["error"]
    else:
        assert code != 0 and "not a regular file" in out
