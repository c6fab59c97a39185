"""Savepoint documents are untrusted: adopting one writes only under the job's own snapshots."""

import json
import os

import pytest

from dstl.backend.changelog import BackendSnapshot
from dstl.backend.checkpoints.savepoints import SAVEPOINT_FILE, Savepoint, adopt_savepoint
from dstl.backend.materialization import MaterializationRef
from dstl.spi import InvalidHandleError, KeyGroupRange


def test_an_instance_name_cannot_steer_where_the_copy_is_written(tmp_path):
    source = tmp_path / "savepoint"
    (source / "demo" / "snapshots").mkdir(parents=True)
    (source / "demo" / "snapshots" / "a.snap").write_bytes(b"snapshot bytes")
    ref = MaterializationRef("demo/snapshots/a.snap", KeyGroupRange(0, 128), 1, 14, 1)
    forged = Savepoint("demo", 7, 128, {"../../../escaped": BackendSnapshot(7, (), (ref,))})
    (source / SAVEPOINT_FILE).write_text(forged.to_json())
    assert json.loads((source / SAVEPOINT_FILE).read_text())["checkpoint"]["snapshots"]

    target = tmp_path / "job-state"
    adopted = adopt_savepoint(str(source), target.as_uri(), "job", 128)
    (copied,) = adopted.snapshots["../../../escaped"].materialized
    assert copied.path.startswith("job/snapshots/savepoint-7-")
    assert (target / copied.path).read_bytes() == b"snapshot bytes"
    assert not list(tmp_path.rglob("escaped*"))


def _savepoint_of(tmp_path, make_snapshot, recorded_size=14):
    source = tmp_path / "savepoint"
    (source / "demo" / "snapshots").mkdir(parents=True)
    make_snapshot(source / "demo" / "snapshots" / "a.snap")
    ref = MaterializationRef("demo/snapshots/a.snap", KeyGroupRange(0, 128), 1, recorded_size, 1)
    savepoint = Savepoint("demo", 7, 128, {"kg0-128": BackendSnapshot(7, (), (ref,))})
    (source / SAVEPOINT_FILE).write_text(savepoint.to_json())
    return source


@pytest.mark.parametrize(
    ("case", "size", "complaint"),
    [
        ("dev-zero", 1 << 30, "not a regular file"),
        ("outside", 6, "not a regular file"),
        ("fifo", 14, "not a regular file"),
        ("huge", 1 << 60, "the savepoint says"),
        ("short", 14, "the savepoint says"),
        ("missing", 14, "does not exist"),
        ("directory", 14, "not a regular file"),
    ],
)
def test_adopting_a_hostile_savepoint_copies_nothing_and_says_why(tmp_path, case, size, complaint):
    secret = tmp_path / "secret"
    secret.write_bytes(b"secret")

    def make(path):
        if case == "dev-zero":
            path.symlink_to("/dev/zero")
        elif case == "outside":
            path.symlink_to(secret)
        elif case == "fifo":
            os.mkfifo(path)
        elif case == "directory":
            path.mkdir()
        elif case in ("huge", "short"):
            path.write_bytes(b"short")

    source = _savepoint_of(tmp_path, make, size)
    target = tmp_path / "job-state"
    with pytest.raises(InvalidHandleError, match=complaint):
        adopt_savepoint(str(source), target.as_uri(), "job", 128)
    assert not [p for p in target.rglob("*") if p.is_file()], "a partial copy was left"


def test_a_savepoint_is_never_written_into_the_jobs_checkpoint_directory(tmp_path):
    from dstl.backend.checkpoints import CheckpointLocation
    from dstl.backend.checkpoints.savepoints import write_savepoint
    from tests.backend.test_inspection import _run_job

    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "log")}
    _run_job(config, (tmp_path / "chk").as_uri())
    location = CheckpointLocation(str(tmp_path / "chk"))
    documents, _ = location.checkpoints()
    for target in (tmp_path / "chk", tmp_path / "chk" / "job" / "sp"):
        with pytest.raises(InvalidHandleError, match="inside the job's checkpoint directory"):
            write_savepoint(location, documents[-1], str(target), config)
    assert not (tmp_path / "chk" / SAVEPOINT_FILE).exists()
