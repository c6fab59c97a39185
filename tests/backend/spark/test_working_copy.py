"""The working copy's stamp: what it names is trusted only when it is intact."""

import json

import pytest

from dstl.backend.changelog import BackendSnapshot
from dstl.backend.spark._private import working_copy
from dstl.backend.spark._private.working_copy import WorkingCopy, snapshot_digest


@pytest.fixture
def copy(tmp_path):
    return WorkingCopy(tmp_path, "op-kg0-64", map_size=1 << 20)


def test_a_marked_copy_names_its_checkpoint_and_registrations(copy):
    snapshot = BackendSnapshot(7, ())
    copy.mark(snapshot, {"totals": ("value", "msgpack")})
    expected = {"totals": ("value", "msgpack")}
    digest = snapshot_digest(snapshot)
    assert copy.stamp() == {"digest": digest, "registrations": expected, "snapshot": snapshot}
    copy.invalidate()
    assert copy.stamp() is None


@pytest.mark.parametrize(
    "registrations",
    [{"totals": 5}, {"totals": ["value"]}, {"totals": ["value", 1]}, {"totals": "value"}, ["totals"]],
)
def test_a_damaged_stamp_means_no_known_checkpoint(copy, registrations):
    copy.mark(BackendSnapshot(7, ()), {"totals": ("value", "msgpack")})
    stamp_file = copy.path / "dstl-stamp.json"
    doc = json.loads(stamp_file.read_text())
    stamp_file.write_text(json.dumps({**doc, "registrations": registrations}))
    assert copy.stamp() is None
    stamp_file.write_text("{not json")
    assert copy.stamp() is None


def _syncs(copy, monkeypatch):
    events = []
    real_sync, real_fsync = copy.delegate.sync, __import__("os").fsync
    monkeypatch.setattr(copy.delegate, "sync", lambda: (events.append("lmdb synced"), real_sync())[1])
    monkeypatch.setattr("os.fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    return events


def test_where_the_boot_is_unknown_the_stamp_is_written_only_after_the_environment_is_synced(
    copy, monkeypatch
):
    monkeypatch.setattr(working_copy, "host_boot", lambda: None)
    events = _syncs(copy, monkeypatch)
    copy.delegate.put("totals", 0, b"k", b"1")
    copy.mark(BackendSnapshot(7, ()), {})
    assert events[0] == "lmdb synced" and events.count("fsync") == 2  # stamp file, then its directory
    assert "boot" not in json.loads((copy.path / "dstl-stamp.json").read_text())
    events.clear()
    copy.invalidate()
    assert events == ["fsync"], "the stamp's removal was not made durable before the copy changes"


def test_a_stamp_of_this_boot_is_written_and_removed_without_a_sync(copy, monkeypatch):
    monkeypatch.setattr(working_copy, "host_boot", lambda: "boot-1")
    events = _syncs(copy, monkeypatch)
    copy.delegate.put("totals", 0, b"k", b"1")
    copy.mark(BackendSnapshot(7, ()), {})
    assert events == [], "nothing on the batch's path waits for the disk"
    assert copy.stamp()["digest"] == snapshot_digest(BackendSnapshot(7, ()))
    copy.invalidate()
    assert events == [] and copy.stamp() is None


def test_a_stamp_from_before_the_host_restarted_vouches_for_nothing(copy, monkeypatch):
    monkeypatch.setattr(working_copy, "host_boot", lambda: "boot-1")
    copy.mark(BackendSnapshot(7, ()), {})
    monkeypatch.setattr(working_copy, "host_boot", lambda: "boot-2")  # the host crashed meanwhile
    assert copy.stamp() is None, "an unsynced copy was trusted across a restart"
    stamp_file = copy.path / "dstl-stamp.json"
    doc = json.loads(stamp_file.read_text())
    stamp_file.write_text(json.dumps({**doc, "boot": None}))  # hostile or damaged: not this boot either
    assert copy.stamp() is None


def test_removing_a_synced_stamp_is_synced_even_where_the_boot_is_known(copy, monkeypatch):
    monkeypatch.setattr(working_copy, "host_boot", lambda: None)
    copy.mark(BackendSnapshot(7, ()), {})  # synced: it would come back after a host crash
    monkeypatch.setattr(working_copy, "host_boot", lambda: "boot-1")
    assert copy.stamp() is not None  # a synced stamp holds across boots
    events = _syncs(copy, monkeypatch)
    copy.invalidate()
    assert events == ["fsync"] and copy.stamp() is None


def test_the_host_boot_is_read_from_the_kernel_where_there_is_one():
    from pathlib import Path

    source = Path("/proc/sys/kernel/random/boot_id")
    expected = source.read_text().strip() if source.exists() else None
    assert working_copy.host_boot() == expected


KILL_BEFORE_THE_STAMP = """
import os, signal, sys
from dstl.backend.changelog import BackendSnapshot
from dstl.backend.spark._private.working_copy import WorkingCopy
copy = WorkingCopy(sys.argv[1], "op-kg0-64", map_size=1 << 20)
copy.mark(BackendSnapshot(1, ()), {})
copy.invalidate()
copy.delegate.put("totals", 0, b"k", b"2")
real_open = os.open
def dying_open(path, *args, **kwargs):
    if "dstl-stamp" in str(path):
        os.kill(os.getpid(), signal.SIGKILL)  # after the LMDB write (and any sync), before the new stamp
    return real_open(path, *args, **kwargs)
os.open = dying_open
copy.mark(BackendSnapshot(2, ()), {})
"""


def test_a_process_killed_before_its_stamp_leaves_no_stamp(tmp_path):
    import signal
    import subprocess
    import sys

    child = subprocess.run(
        [sys.executable, "-c", KILL_BEFORE_THE_STAMP, str(tmp_path)], capture_output=True, timeout=60
    )
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]
    reopened = WorkingCopy(tmp_path, "op-kg0-64", map_size=1 << 20)
    assert reopened.stamp() is None, "a stamp vouches for a copy that changed after it"
    assert reopened.delegate.get("totals", 0, b"k") == b"2", "the committed write is missing"


def test_a_copy_stamped_by_another_record_layout_is_restored_not_read(copy):
    snapshot = BackendSnapshot(7, ())
    copy.mark(snapshot, {"totals": ("value", "msgpack")})
    stamp_file = copy.path / "dstl-stamp.json"
    doc = json.loads(stamp_file.read_text())
    for layout in (None, 1, doc["layout"] + 1):
        stamp_file.write_text(json.dumps({**doc, "layout": layout}))
        assert copy.stamp() is None, f"a copy of layout {layout} was trusted"
    stamp_file.write_text(json.dumps(doc))
    assert copy.stamp() is not None


def test_an_offer_is_taken_once(copy):
    checkpoint, rebased = BackendSnapshot(7, ()), BackendSnapshot(7, (), ())
    copy.offer(checkpoint, rebased, run_id=3)
    assert copy.take_offer() == (3, checkpoint, rebased, [])
    assert copy.take_offer() is None
    (copy.path / "dstl-materialized.json").write_text('{"run": 3, "checkpoint": {"checkpoint_id": -1}}')
    assert copy.take_offer() is None and not (copy.path / "dstl-materialized.json").exists()


def test_expired_keys_ride_with_the_offer_and_leftovers_carry_to_the_next_task(copy):
    found = [("sessions", 3, b"\x00key"), ("sessions", 70, b"")]
    copy.offer(BackendSnapshot(7, ()), BackendSnapshot(7, (), ()), run_id=3, expired=found)
    assert copy.take_offer().expired == found
    copy.keep_expired(found[:1])
    assert copy.take_expired() == found[:1]
    assert copy.take_expired() == []  # taken once
    copy.keep_expired(found)
    copy.keep_expired([])  # nothing left: nothing carried
    assert copy.take_expired() == []


def test_damaged_expired_hints_are_dropped_not_trusted(copy):
    sidecar = copy.path / "dstl-expired.json"
    sidecar.write_text(json.dumps({"expired": [["s", 1, "zz"], ["s", "1", "00"], "x", ["s", 2, "0a"]]}))
    assert copy.take_expired() == [("s", 2, b"\n")]  # only the well-formed one
    sidecar.write_text("{not json")
    assert copy.take_expired() == [] and not sidecar.exists()


def test_one_materialization_claim_at_a_time_per_copy(copy):
    claim = copy.claim_materialization()
    assert claim is not None
    assert copy.claim_materialization() is None  # another task of this process
    claim.close()
    again = copy.claim_materialization()
    assert again is not None
    again.close()


def test_another_process_s_claim_holds_until_it_ends(tmp_path):
    import subprocess
    import sys

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from dstl.backend.spark._private.working_copy import WorkingCopy\n"
            f"claim = WorkingCopy({str(tmp_path)!r}, 'op-kg0-64', map_size=1 << 20).claim_materialization()\n"
            "print('held' if claim else 'refused', flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        copy = WorkingCopy(tmp_path, "op-kg0-64", map_size=1 << 20)
        assert copy.claim_materialization() is None
        holder.kill()  # dies holding it: the OS releases the lock
        holder.wait(10)
        claim = copy.claim_materialization()
        assert claim is not None
        claim.close()
    finally:
        holder.kill()
        holder.wait(10)


@pytest.mark.parametrize("lock", ["dstl.lock", "dstl-materializing.lock"])
@pytest.mark.parametrize("entry", ["link", "fifo"])
def test_a_link_or_fifo_in_place_of_a_lock_file_is_refused_and_nothing_outside_is_created(
    copy, tmp_path, lock, entry
):
    import os

    from dstl.spi import DstlError

    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    if entry == "link":
        (copy.path / lock).symlink_to(outside)
    else:
        os.mkfifo(copy.path / lock)
    with pytest.raises(DstlError, match="not a regular file|remove it"):
        if lock == "dstl.lock":
            with copy.exclusive():
                pass
        else:
            copy.claim_materialization()
    assert not outside.exists()


def test_exclusive_nests_within_a_thread_and_still_excludes_other_threads(copy):
    """The kept output's check holds the copy around the task, which takes it again."""
    import threading

    entered = threading.Event()

    def other() -> None:
        with copy.exclusive():
            entered.set()

    nested = threading.Event()
    early: list[bool] = []

    def holder() -> None:
        with copy.exclusive():
            with copy.exclusive():  # would wait for itself if flock were taken twice
                nested.set()
            thread = threading.Thread(target=other)
            thread.start()
            early.append(entered.wait(0.5))
        thread.join(10)

    holding = threading.Thread(target=holder, daemon=True)
    holding.start()
    holding.join(20)
    assert nested.is_set(), "the nested exclusive() waited for its own thread"
    assert early == [False], "another thread entered while the copy was held"
    assert entered.is_set()


def test_the_copys_documents_are_never_written_through_a_link(copy, tmp_path):
    import os

    from dstl.spi import DstlError

    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    (copy.path / f"dstl-expired.tmp{os.getpid()}").symlink_to(outside)
    with pytest.raises(DstlError, match="not a regular file: remove it"):
        copy.keep_expired([("n", 1, b"k")])
    assert not outside.exists()


def test_a_hard_link_in_place_of_a_temporary_file_is_refused_and_its_file_kept(copy, tmp_path):
    import os

    from dstl.spi import DstlError

    outside = tmp_path.parent / f"{tmp_path.name}-outside-file"
    outside.write_bytes(b"someone else's")
    os.link(outside, copy.path / f"dstl-expired.tmp{os.getpid()}")
    with pytest.raises(DstlError, match="not a regular file: remove it"):
        copy.keep_expired([("n", 1, b"k")])
    assert outside.read_bytes() == b"someone else's"


def test_a_stale_temporary_file_of_a_dead_process_is_replaced(copy):
    import os

    (copy.path / f"dstl-expired.tmp{os.getpid()}").write_bytes(b"half a document")
    copy.keep_expired([("n", 1, b"k")])
    assert copy.take_expired() == [("n", 1, b"k")]
    assert not (copy.path / f"dstl-expired.tmp{os.getpid()}").exists()


def test_a_stamp_is_warm_at_the_base_and_committed_in_the_lineage(copy):
    from dstl.backend.spark._private.working_copy import held_checkpoint

    earlier, base = BackendSnapshot(6, ()), BackendSnapshot(7, ())
    lineage = (snapshot_digest(earlier), snapshot_digest(base))
    assert held_checkpoint(None, base, lineage) == (False, False)
    copy.mark(base, {})
    assert held_checkpoint(copy.stamp(), base, lineage) == (True, True)
    copy.mark(earlier, {})
    assert held_checkpoint(copy.stamp(), base, lineage) == (False, True)  # it can catch up
    assert held_checkpoint(copy.stamp(), base, ()) == (False, False)  # of no known checkpoint


def test_wait_for_snapshots_waits_for_every_claim_under_the_working_dir(tmp_path):
    import threading

    from dstl.backend.spark import wait_for_snapshots

    copies = [WorkingCopy(tmp_path, f"op-kg{start}-{start + 64}", map_size=1 << 20) for start in (0, 64)]
    assert wait_for_snapshots(tmp_path, timeout=5)  # nothing runs
    claim = copies[1].claim_materialization()
    assert claim is not None
    assert not wait_for_snapshots(tmp_path, timeout=0.3)  # a snapshot still runs
    threading.Timer(0.3, claim.close).start()  # ... and ends
    assert wait_for_snapshots(tmp_path, timeout=30)
    again = copies[1].claim_materialization()  # the wait left no claim behind
    assert again is not None
    again.close()
