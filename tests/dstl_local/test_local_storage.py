"""Local-disk storage specifics: crash safety, recovery, group commit, segment GC."""

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dstl.conformance.testing import persist, read_data
from dstl.spi import (
    ChangelogHandle,
    ClosedError,
    ConfigError,
    CorruptedError,
    FencedError,
    InvalidHandleError,
    KeyGroupRange,
    StorageError,
    load_storage,
)
from tests.dstl_local.crash_child import payload

KG = KeyGroupRange(0, 8)


def noise(size: int, seed: int = 0) -> bytes:
    """Incompressible change data: these tests size segments by what is stored."""
    return random.Random(seed).randbytes(size)


@pytest.fixture
def local_config(tmp_path):
    return {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "dstl")}


def test_missing_dir_is_a_clear_config_error():
    with pytest.raises(ConfigError, match=r"dstl.local.dir is not set"):
        load_storage({"dstl.storage": "local"}, job_id="j")


def test_sigkill_at_random_points_loses_nothing_acknowledged(tmp_path):
    directory = tmp_path / "crash"
    rng = random.Random(1234)
    acknowledged: list[tuple[str, dict]] = []
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    for kill in range(20):
        run = f"r{kill}"
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.dstl_local.crash_child", str(directory), run],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        # Wait for its first acknowledged persist (however slow the machine), then
        # kill at a random point of the append/persist loop.
        first = child.stdout.readline()
        time.sleep(rng.random() * 0.3)
        child.send_signal(signal.SIGKILL)
        out, err = child.communicate(timeout=30)
        assert child.returncode == -signal.SIGKILL, err.decode()[-2000:]
        lines = (first + out).decode().splitlines()
        # The last line may be cut mid-way by the kill: it was never fully reported.
        events = []
        for line in lines:
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                assert line is lines[-1], "only the last line can be torn"
        assert events, f"run {run} completed no persist before the kill: {err.decode()[-2000:]}"
        acknowledged.extend((run, event) for event in events[-2:])
        # Recovery (a fresh instance) cuts torn tails; everything acknowledged is intact.
        with load_storage(
            {"dstl.storage": "local", "dstl.local.dir": str(directory)}, job_id="crash"
        ) as fresh:
            for ack_run, event in acknowledged:
                handle = ChangelogHandle.from_json(event["handle"])
                data = read_data(fresh, handle)
                n = event["writer"]
                assert data == [
                    payload(f"{ack_run}-{n}", i, len(d) - len(f"{ack_run}-{n}:{i}:"))
                    for i, d in enumerate(data)
                ]
                assert len(data) == event["count"]


def _write_and_kill_instance(config):
    storage = load_storage(config, job_id="job")
    writer = storage.create_writer("op", KG)
    writer.append(1, b"acknowledged")
    handle = persist(writer, 0, 1)
    segment = storage.segments_dir / handle.location_dicts[0]["segment"].split("/")[-1]
    # Simulate a crash: release the liveness lock without sealing the segment.
    storage._instance_lock.release()
    return handle, segment


def test_torn_tail_is_cut_on_recovery(local_config):
    handle, segment = _write_and_kill_instance(local_config)
    good_size = segment.stat().st_size
    with open(segment, "ab") as file:
        file.write(b"DSTC\x01\x00garbage-of-an-unacknowledged-write")
    with load_storage(local_config, job_id="job") as fresh:
        assert segment.stat().st_size == good_size
        assert fresh.metrics.counter("recovered_torn_bytes") > 0
        assert read_data(fresh, handle) == [b"acknowledged"]


def test_damage_in_the_middle_is_quarantined_and_only_its_handle_fails(local_config):
    storage = load_storage(local_config, job_id="job")
    writer = storage.create_writer("op", KG)
    writer.append(1, b"first")
    first = persist(writer, 0, 1)
    writer.append(1, b"second")
    second = persist(writer, 1, 2)
    storage._instance_lock.release()
    segment = storage.segments_dir / first.location_dicts[0]["segment"].split("/")[-1]
    raw = bytearray(segment.read_bytes())
    raw[first.location_dicts[0]["length"] - 2] ^= 0xFF  # inside the first change set
    segment.write_bytes(bytes(raw))
    with load_storage(local_config, job_id="job") as fresh:  # the job still starts
        assert fresh.metrics.counter("quarantined_segments") == 1
        with pytest.raises(CorruptedError) as info:
            read_data(fresh, first)
        assert info.value.location == str(segment) and info.value.offset == 0
        assert read_data(fresh, second) == [b"second"]
        fresh.discard([first, second])
        assert segment.exists(), "a quarantined segment was deleted"


def test_a_damaged_complete_last_change_set_is_kept_not_cut_as_a_torn_tail(local_config, caplog):
    handle, segment = _write_and_kill_instance(local_config)
    raw = bytearray(segment.read_bytes())
    raw[-3] ^= 0xFF  # a flipped bit in an acknowledged (complete) change set
    segment.write_bytes(bytes(raw))
    with load_storage(local_config, job_id="job") as fresh:
        assert segment.stat().st_size == len(raw), "acknowledged bytes were cut"
        assert fresh.metrics.counter("recovered_torn_bytes") == 0
        assert "torn tail" not in caplog.text
        assert fresh.metrics.counter("quarantined_segments") == 1
        with pytest.raises(CorruptedError, match="checksum"):
            read_data(fresh, handle)


def test_a_forged_discard_length_cannot_delete_live_change_sets(tmp_path):
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path), "dstl.local.segment-size": "4kb"}
    with load_storage(config, job_id="job") as storage:
        victim = storage.create_writer("victim", KG)
        attacker = storage.create_writer("attacker", KG)
        attacker.append(0, b"a" * 100)
        forged_source = persist(attacker, 0, 1)
        victim.append(0, b"live")
        live = persist(victim, 0, 1)
        victim.append(0, noise(5000, 1))  # rolls: the segment holding both is sealed
        persist(victim, 1, 2)
        attacker.close()
        for length, refused in ((10**12, InvalidHandleError), (10**6, None)):
            doc = forged_source.to_dict()
            doc["locations"][0]["length"] = length  # covers the victim's change set too
            if refused is not None:
                with pytest.raises(refused, match="length"):
                    storage.discard([ChangelogHandle.from_dict(doc)])
            else:
                storage.discard([ChangelogHandle.from_dict(doc)])
        assert storage.metrics.counter("refused_discards") == 1
        assert read_data(storage, live) == [b"live"]


def test_a_deleted_or_replaced_epoch_file_fences_the_old_writer(local_config):
    with load_storage(local_config, job_id="job") as storage:
        for tamper in ("delete", "replace"):
            op = f"op-{tamper}"
            old = storage.create_writer(op, KG, epoch=1)
            old.append(0, b"x")
            persist(old, 0, 1)
            epoch_file = storage.epochs_dir / f"{old.log_id}.epoch"
            if tamper == "delete":
                epoch_file.unlink()
            else:
                copy = epoch_file.with_name("copy")
                copy.write_bytes(epoch_file.read_bytes())
                copy.rename(epoch_file)
            old.append(0, b"y")
            with pytest.raises(FencedError, match="gone, replaced or unreadable"):
                persist(old, 0, 2)
            new = storage.create_writer(op, KG, epoch=2)
            new.append(0, b"z")
            assert read_data(storage, persist(new, 0, 3)) == [b"z"]


def test_a_damaged_epoch_file_fails_closed(local_config):
    with load_storage(local_config, job_id="job") as storage:
        old = storage.create_writer("op", KG, epoch=5)
        epoch_file = storage.epochs_dir / f"{old.log_id}.epoch"
        epoch_file.write_bytes(b"\x00garbage that is not an owner record")
        old.append(0, b"x")
        with pytest.raises(FencedError, match="op"):
            persist(old, 0, 1)
        with pytest.raises(StorageError, match="epoch file .* is damaged"):
            storage.create_writer("op", KG, epoch=6)


def test_concurrent_persists_share_fsyncs(local_config):
    with load_storage(local_config, job_id="job") as storage:
        writers = [storage.create_writer(f"op{n}", KG) for n in range(8)]
        barrier = threading.Barrier(8)

        def work(writer):
            for round_ in range(30):
                writer.append(0, b"x" * 100)
                barrier.wait(timeout=30)
                writer.persist(0, round_ + 1).result(timeout=30)

        threads = [threading.Thread(target=work, args=(w,)) for w in writers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        counters = storage.metrics.counters()
        assert counters["persists"] == 240
        assert counters["fsyncs"] < counters["persists"], counters


def test_segments_roll_and_are_deleted_only_when_fully_discarded(tmp_path):
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path), "dstl.local.segment-size": "4kb"}
    storage = load_storage(config, job_id="job")
    keep_writer = storage.create_writer("keep", KG)
    drop_writer = storage.create_writer("drop", KG)
    dropped = []
    for round_ in range(20):
        drop_writer.append(0, noise(1000, round_))
        dropped.append(persist(drop_writer, drop_writer.next_sqn() - 1, round_))
    keep_writer.append(0, b"keep me")
    kept = persist(keep_writer, 0, 1)
    assert len(storage.list_objects()) > 3, "segments did not roll"
    drop_writer.close()
    storage.discard(dropped)
    remaining = storage.list_objects()
    kept_segment = kept.location_dicts[0]["segment"].split("/")[-1]
    assert kept_segment in remaining
    assert len(remaining) < 4, "fully discarded sealed segments must be deleted"
    assert read_data(storage, kept) == [b"keep me"]
    storage.close()
    assert kept_segment in load_storage(config, job_id="job").list_objects(), "a needed segment was deleted"


def test_a_fully_discarded_active_segment_is_sealed_and_deleted(local_config):
    with load_storage(local_config, job_id="job") as storage:  # 64 MB segments: nothing rolls by size
        writer = storage.create_writer("op", KG)
        handles = []
        for round_ in range(3):
            writer.append(0, b"x" * 1000)
            handles.append(persist(writer, writer.next_sqn() - 1, round_ + 1))
        (segment,) = storage.list_objects()
        storage.discard(handles[:2])
        assert storage.list_objects() == [segment], "deleted while a change set in it is still needed"
        writer.truncate(handles[2].sqn_range.end)
        storage.discard(handles[2:])
        assert storage.list_objects() == [], "dead log stayed on disk"
        writer.append(0, b"after")
        assert read_data(storage, persist(writer, writer.next_sqn() - 1, 4)) == [b"after"]
        assert len(storage.list_objects()) == 1


def test_discard_waits_for_writers_that_still_reuse_a_change_set(local_config):
    with load_storage({**local_config, "dstl.local.segment-size": "4kb"}, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        writer.append(0, noise(5000, 2))
        first = persist(writer, 0, 1)
        writer.append(0, noise(5000, 3))  # rolls the segment: the first one is sealed
        persist(writer, 0, 2)
        storage.discard([first])
        first_segment = first.location_dicts[0]["segment"].split("/")[-1]
        assert first_segment in storage.list_objects(), "deleted while the writer still reuses it"
        writer.truncate(1)
        assert first_segment not in storage.list_objects()


def test_fsync_can_be_disabled(local_config):
    with load_storage({**local_config, "dstl.local.fsync": "false"}, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        writer.append(0, b"x")
        assert read_data(storage, persist(writer, 0, 1)) == [b"x"]
        assert storage.metrics.counter("fsyncs") == 0
        assert storage.metrics.counter("writes") == 1
        assert storage.metrics.percentiles("batch_requests") == {50: 1, 90: 1, 99: 1}


def test_locations_cannot_escape_the_base_directory(local_config, tmp_path):
    with load_storage(local_config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        writer.append(0, b"x")
        doc = persist(writer, 0, 1).to_dict()
    doc["locations"][0]["segment"] = "../../etc/passwd"
    with pytest.raises(ValueError, match="safe relative path"):
        ChangelogHandle.from_dict(doc)


def test_unwritable_directory_is_a_storage_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StorageError, match="cannot use dstl.local.dir"):
        load_storage({"dstl.storage": "local", "dstl.local.dir": str(blocker / "sub")}, job_id="job")


def test_a_discard_never_deletes_another_jobs_segments(tmp_path):
    config = {"dstl.storage": "local", "dstl.local.dir": str(tmp_path), "dstl.local.segment-size": "4kb"}
    with load_storage(config, job_id="other") as other:
        writer = other.create_writer("op", KG)
        writer.append(0, noise(5000, 4))
        handle = persist(writer, 0, 1)
        writer.truncate(1)
        writer.close()
    segment = tmp_path / handle.location_dicts[0]["segment"]
    with load_storage(config, job_id="job") as storage:
        with pytest.raises(InvalidHandleError, match="does not belong to job 'job'"):
            storage.discard([handle])
        assert read_data(storage, handle) == [noise(5000, 4)]  # reading across jobs is the SPI's contract
    assert segment.exists()


@pytest.mark.parametrize("claim", ["0 999999\n", "0 1\n64 999999\n", "garbage\n0 12\n"])
def test_recovery_never_deletes_a_segment_on_a_dead_instances_forged_discards(local_config, tmp_path, claim):
    storage = load_storage(local_config, job_id="job")
    writer = storage.create_writer("op", KG)
    handles = []
    for n in range(6):
        writer.append(n % 8, f"acknowledged {n}".encode())
        handles.append(persist(writer, n, n + 1))
    (segment,) = (tmp_path / "dstl" / "job" / "segments").glob("*.log")
    segment.with_name(segment.name + ".discarded").write_text(claim)  # no real change set is that
    storage._instance_lock.release()  # a crash: the segment was never sealed
    with load_storage(local_config, job_id="job") as fresh:
        assert segment.exists()
        assert [read_data(fresh, h) for h in handles] == [[f"acknowledged {n}".encode()] for n in range(6)]


def test_a_handle_naming_another_logs_change_set_frees_nothing(local_config):
    with load_storage(local_config, job_id="job") as storage:
        victim, thief = storage.create_writer("victim", KG), storage.create_writer("thief", KG)
        victim.append(0, b"live data of another log")
        live = persist(victim, 0, 1)
        thief.append(1, b"the thief's own")
        own = persist(thief, 0, 1)
        victim.close()
        thief.close()

        def forged(handle, **changes):
            doc = json.loads(handle.to_json())
            doc.update(changes)
            return ChangelogHandle.from_json(json.dumps(doc))

        storage.discard([own, forged(live, log_id="thief.kg0-8")])  # the thief names the victim's spot
        storage.discard([forged(live, epoch=live.epoch + 1)])
        (location,) = live.location_dicts
        storage.discard([forged(live, locations=[{**location, "sqn": 5}])])
        assert storage.metrics.counter("refused_discards") == 3
        assert read_data(storage, live) == [b"live data of another log"]
    with load_storage(local_config, job_id="job") as fresh:
        assert read_data(fresh, live) == [b"live data of another log"]
        fresh.discard([live])
        with pytest.raises(StorageError):
            read_data(fresh, live)


def test_a_failed_start_is_a_storage_error_and_leaks_no_descriptor_or_lock(local_config, tmp_path):
    segments = tmp_path / "dstl" / "job" / "segments"
    segments.mkdir(parents=True)
    (segments / "seg-deadbeef0000-1.log").mkdir()  # a dead instance's segment that is a directory
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        with pytest.raises(StorageError, match="seg-deadbeef0000-1.log"):
            load_storage(local_config, job_id="job")
    assert len(os.listdir("/proc/self/fd")) == before
    assert not list((tmp_path / "dstl" / "job").glob("instance-*.lock"))


@pytest.fixture
def held_group_commit(monkeypatch):
    """Holds the first sync until released: persists submitted meanwhile queue into one batch.

    Returns ``(leading, release)``: ``leading`` is set once the first sync started.
    """
    real_sync = os.fdatasync
    leading, release = threading.Event(), threading.Event()

    def slow_first_sync(fd):
        if not leading.is_set():
            leading.set()
            release.wait(10)  # the leader's sync holds the next batch back
        real_sync(fd)

    monkeypatch.setattr(os, "fdatasync", slow_first_sync)
    return leading, release


def _behind_a_leader(storage, names, leading):
    """Writers of ``names`` (each has appended its log id), and a leader whose persist holds the syncs."""
    leader, *writers = (storage.create_writer(name, KG) for name in ("leader", *names))
    for writer in (leader, *writers):
        writer.append(0, f"{writer.log_id}".encode())
    first = threading.Thread(target=lambda: leader.persist(0, 1).result(timeout=30))
    first.start()
    assert leading.wait(10)
    return first, writers


def test_closing_a_writer_whose_persist_waits_in_a_group_commit_fails_only_that_persist(
    local_config, held_group_commit
):
    """Every request's owner is checked; one closed writer's request must not fail the batch it joined."""
    leading, release = held_group_commit
    with load_storage(local_config, job_id="job") as storage:
        first, (closing, other) = _behind_a_leader(storage, ("closing", "other"), leading)
        waiting = [closing.persist(0, 1), other.persist(0, 1)]  # queued behind the leader: one batch
        closing.close()
        release.set()
        first.join(10)
        with pytest.raises((ClosedError, FencedError)):
            waiting[0].result(timeout=30)
        handle = waiting[1].result(timeout=30)
        assert read_data(storage, handle) == [other.log_id.encode()]


def test_a_follower_fenced_while_it_waits_in_a_group_commit_fails_alone(local_config, held_group_commit):
    """Every request's owner is checked when its batch is written, not only the leader's: a newer
    epoch that claims a follower's log while it waits fences exactly that persist."""
    leading, release = held_group_commit
    with load_storage(local_config, job_id="job") as storage:
        first, (other, fenced) = _behind_a_leader(storage, ("other", "fenced"), leading)
        # queued behind the leader, one batch: ``other`` leads it, ``fenced`` follows
        waiting = [other.persist(0, 1), fenced.persist(0, 1)]
        newer = storage.create_writer("fenced", KG, epoch=1)  # claims the follower's log meanwhile
        release.set()
        first.join(10)
        with pytest.raises(FencedError):
            waiting[1].result(timeout=30)
        handle = waiting[0].result(timeout=30)
        assert read_data(storage, handle) == [other.log_id.encode()]
        newer.close()
