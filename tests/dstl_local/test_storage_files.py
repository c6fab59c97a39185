"""The files local storage keeps for a job: its owner record, segment names and rolls, and the
recovery of dead instances (which never touches a live one's files)."""

import os

import pytest

from dstl.conformance.testing import persist, read_data
from dstl.local._private.storage import read_owner_record
from dstl.spi import JobConflictError, KeyGroupRange, StorageError, load_storage
from tests.dstl_local.test_discard_space import persist_each

KG = KeyGroupRange(0, 8)


def test_the_owner_record_is_read_as_untrusted_input(tmp_path):
    path = tmp_path / "OWNER"
    with pytest.raises(StorageError, match="cannot read the job's owner record"):
        read_owner_record(path)  # missing
    path.mkdir()
    with pytest.raises(StorageError, match="is not a regular file: remove it"):
        read_owner_record(path)
    path.rmdir()
    os.mkfifo(path)  # opened without blocking
    with pytest.raises(StorageError, match="is not a regular file: remove it"):
        read_owner_record(path)
    path.unlink()
    (tmp_path / "elsewhere").write_text("job x")
    path.symlink_to(tmp_path / "elsewhere")  # never followed
    with pytest.raises(StorageError, match="cannot read the job's owner record"):
        read_owner_record(path)
    path.unlink()
    path.write_bytes(b"o" * 4096)
    assert read_owner_record(path) == "o" * 4096
    path.write_bytes(b"o" * 4097)
    with pytest.raises(StorageError, match="is over 4096 bytes: a damaged file, remove it"):
        read_owner_record(path)
    path.write_bytes(b"\xffjob")
    assert read_owner_record(path) == "\ufffdjob"


def test_a_job_directory_holds_its_owner_record_epochs_and_numbered_segments(tmp_path):
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path), "dstl.local.segment-size": "4kb"}
    with load_storage(config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        (first,) = persist_each(writer, [b"x"])
        overhead = first.location_dicts[0]["length"] - 1  # a change set's bytes besides its data
        writer.append(0, os.urandom(4096 - 2 * overhead - 1))  # fills the segment exactly
        persist(writer, 1, 2)
        assert len(storage.list_objects()) == 1
        writer.append(0, b"z")  # one byte more: the next segment
        persist(writer, 2, 3)
        names = sorted(storage.list_objects())
        instance = storage.instance
        assert names == [f"seg-{instance}-00000001.log", f"seg-{instance}-00000002.log"]
        assert (tmp_path / "job" / "epochs" / "op.kg0-8.epoch").is_file()
        storage.bind_job("file:///checkpoints/a")
        assert (tmp_path / "job" / "OWNER").read_text() == "file:///checkpoints/a"
    with load_storage(config, job_id="job") as other, pytest.raises(JobConflictError):
        other.bind_job("file:///checkpoints/b")


def test_recovery_seals_a_dead_instances_segment_and_leaves_a_live_ones_alone(tmp_path):
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path)}
    with load_storage(config, job_id="job") as live:
        writer = live.create_writer("live", KG)
        persist_each(writer, [b"live 1"])
        dead = load_storage(config, job_id="job")
        dying = dead.create_writer("dead", KG)
        dying.append(0, b"acknowledged")
        kept = persist(dying, 0, 1)
        dead_segment = dead.segments_dir / f"seg-{dead.instance}-00000001.log"
        dead._instance_lock.release()  # a crash: never sealed
        with open(dead_segment, "ab") as file:
            file.write(b"DSTC\x01torn")
        stale = live.job_dir / "instance-0123456789ab.lock"  # a dead instance's lock left behind
        stale.touch()
        with load_storage(config, job_id="job") as fresh:
            assert fresh.metrics.counter("recovered_torn_bytes") == len(b"DSTC\x01torn")
            assert (dead_segment.parent / (dead_segment.name + ".sealed")).exists()
            assert read_data(fresh, kept) == [b"acknowledged"]
            live_segment = f"seg-{live.instance}-00000001.log"
            assert not (live.segments_dir / f"{live_segment}.sealed").exists(), "a live segment was sealed"
            assert not stale.exists()
            assert (live.job_dir / f"instance-{live.instance}.lock").exists(), "a live instance lost its lock"
            assert (live.job_dir / f"instance-{fresh.instance}.lock").exists()
        writer.append(0, b"live 2")  # the live instance goes on in its segment
        later = persist(writer, 0, 2)
        assert later.location_dicts[0]["segment"].endswith(live_segment)
        assert read_data(live, later) == [b"live 1", b"live 2"]


def test_deleted_segments_are_counted(tmp_path):
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path), "dstl.local.segment-size": "4kb"}
    with load_storage(config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        handles = persist_each(writer, (os.urandom(3000) for _ in range(3)))  # a segment each
        writer.truncate(3)
        storage.discard(handles)
        assert storage.list_objects() == []
        assert storage.metrics.counter("deleted_objects") == 3  # two sealed, and the active one rolled


def test_orphan_collection_keeps_what_live_handles_need_and_counts_what_it_deletes(tmp_path):
    from dstl.spi import ChangelogHandle

    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path), "dstl.local.segment-size": "4kb"}
    with load_storage(config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        handles = persist_each(writer, (os.urandom(3000) for _ in range(4)))  # a segment each
        writer.truncate(4)
        writer.close()
        segments = storage.list_objects()
        assert len(segments) == 4
        at = 1_000_000_000
        for name in segments:
            os.utime(storage.segments_dir / name, (at, at))
        doc = handles[0].to_dict()
        foreign = ChangelogHandle.from_dict({**doc, "storage_id": "memory"})  # another storage's: not ours
        live = [foreign, handles[1]]
        assert storage.collect_orphans(live, older_than=at) == 0  # written at the cutoff: not older
        assert storage.collect_orphans(live, older_than=at + 1) == 3
        assert storage.list_objects() == [segments[1]]
        assert storage.metrics.counter("orphans_deleted") == 3
        assert storage.metrics.counter("deleted_objects") >= 3


def test_orphan_collection_seals_this_instances_idle_active_segment_and_writing_goes_on(tmp_path):
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path)}
    with load_storage(config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        persist_each(writer, [b"old"])
        writer.truncate(1)
        (active,) = storage.list_objects()
        at = 1_000_000_000
        os.utime(storage.segments_dir / active, (at, at))
        assert storage.collect_orphans([], older_than=at) == 0  # not older than the cutoff: stays active
        assert not (storage.segments_dir / f"{active}.sealed").exists()
        assert storage.collect_orphans([], older_than=at + 1) == 1
        writer.append(0, b"new")
        later = persist(writer, 1, 2)
        assert read_data(storage, later) == [b"new"]
        assert storage.list_objects() == [f"seg-{storage.instance}-00000002.log"]
