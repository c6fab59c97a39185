"""Segment files: recovery of a dead instance's tail (cut a torn write, keep damage), reading, liveness."""

import os
import random
import stat
import struct
import threading

import pytest

from dstl.local._private.segments import (
    ActiveSegment,
    InstanceLock,
    SegmentRecovery,
    instance_alive,
    instance_of,
    read_change_set_bytes,
    recover_segment,
    segment_name,
)
from dstl.spi import CorruptedError
from dstl.spi.kit import encode_change_set

#: Where a change-set header keeps its body length (magic, version, flags, log length, epoch,
#: sequence number and count come first).
_BODY_LENGTH_AT = 28


def frame(sqn: int, size: int = 200) -> bytes:
    return encode_change_set("op.kg0-8", 1, sqn, [(0, random.Random(sqn).randbytes(size))])


def damaged(blob: bytes) -> bytes:
    """``blob`` with its last byte flipped: whole, but failing its checksum."""
    return blob[:-1] + bytes([blob[-1] ^ 0xFF])


def claiming_more(blob: bytes) -> bytes:
    """``blob`` with a header whose body length runs far past any file (a damaged length field)."""
    return blob[:_BODY_LENGTH_AT] + struct.pack("<I", 1 << 30) + blob[_BODY_LENGTH_AT + 4 :]


def recovered(tmp_path, data: bytes, discarded=None) -> tuple[SegmentRecovery, bytes]:
    path = tmp_path / segment_name("i", 1)
    path.write_bytes(data)
    found = recover_segment(path, (lambda: dict(discarded)) if discarded else dict)
    return found, path.read_bytes()


def test_a_torn_last_change_set_is_cut_off_and_its_size_reported(tmp_path):
    whole = frame(0) + frame(1)
    torn = frame(2)[:150]
    assert recovered(tmp_path, whole + torn) == (SegmentRecovery(cut=150), whole)


@pytest.mark.parametrize(
    "tail",
    [bytes(300), b"\x07" * 10],
    ids=["zeros: a write that never reached the disk", "shorter than a header"],
)
def test_a_tail_that_cannot_be_a_whole_change_set_is_a_torn_write(tmp_path, tail):
    found, left = recovered(tmp_path, frame(0) + tail)
    assert (found.cut, found.damage, left) == (len(tail), None, frame(0))


@pytest.mark.parametrize(
    "after",
    [
        lambda: damaged(frame(1)),  # whole but failing its checksum: maybe acknowledged data, damaged later
        lambda: random.Random(9).randbytes(36),  # a header's worth of garbage
        lambda: random.Random(9).randbytes(80),  # garbage longer than a header
        lambda: damaged(frame(1)) + frame(2),  # damage followed by a valid change set
        lambda: claiming_more(frame(1)) + frame(2),  # a length running past the end, then a valid one
        lambda: claiming_more(frame(1)) + damaged(frame(2)) + frame(3),  # the valid one after two bad
    ],
    ids=[
        "bad-checksum",
        "header-of-garbage",
        "garbage",
        "damage-then-valid",
        "long-then-valid",
        "two-bad-then-valid",
    ],
)
def test_damage_that_may_hold_acknowledged_data_is_kept_and_reported(tmp_path, after):
    data = frame(0) + after()
    found, left = recovered(tmp_path, data)
    assert isinstance(found.damage, CorruptedError) and found.cut == 0
    assert left == data, "recovery cut data that may have been acknowledged"


def test_two_damaged_change_sets_at_the_end_are_kept_and_the_search_ends(tmp_path):
    """The search for a valid change set after damage steps over every bad one and stops."""
    data = frame(0) + damaged(frame(1)) + damaged(frame(2))
    done = threading.Event()
    result = []
    threading.Thread(
        target=lambda: (result.append(recovered(tmp_path, data)), done.set()), daemon=True
    ).start()
    assert done.wait(30), "the search for a valid change set after damage did not end"
    found, left = result[0]
    assert isinstance(found.damage, CorruptedError) and left == data


def test_discarded_change_sets_are_stepped_over_and_what_follows_is_still_checked(tmp_path):
    first, second = frame(0), frame(1)
    freed = bytes(len(second))  # a discarded change set whose blocks were punched: zeros
    discards = {len(first): len(second)}
    assert recovered(tmp_path, first + freed, discards) == (SegmentRecovery(), first + freed)
    torn = frame(2)[:100]  # after the discarded one: still cut
    assert recovered(tmp_path, first + freed + torn, discards) == (SegmentRecovery(cut=100), first + freed)
    # a recorded discard that runs past the end of the file is not stepped over: the tail is torn
    short = second[:120]
    assert recovered(tmp_path, first + short, discards) == (SegmentRecovery(cut=120), first)


def test_segment_names_carry_their_instance_and_a_new_segment_never_reuses_a_file(tmp_path):
    assert segment_name("a1b2", 7) == "seg-a1b2-00000007.log"
    assert instance_of(segment_name("a1b2", 7)) == "a1b2"
    active = ActiveSegment(tmp_path, "a1b2", 7, fsync=True)
    assert active.number == 7 and active.size == 0
    assert stat.S_IMODE(os.stat(active.path).st_mode) == 0o644 & ~_umask()
    active.seal()
    with pytest.raises(FileExistsError):  # an existing segment is never opened for writing again
        ActiveSegment(tmp_path, "a1b2", 7, fsync=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_an_instance_is_alive_while_its_lock_is_held(tmp_path):
    assert not instance_alive(tmp_path, "i")
    lock = InstanceLock(tmp_path, "i")
    assert stat.S_IMODE(os.stat(lock.path).st_mode) == 0o644 & ~_umask()
    assert instance_alive(tmp_path, "i")
    lock.release()
    assert not instance_alive(tmp_path, "i")
    assert not lock.path.exists()


def test_reading_refuses_what_is_not_a_segment_file_without_hanging(tmp_path):
    path = tmp_path / segment_name("i", 1)
    path.write_bytes(frame(0))
    with pytest.raises(CorruptedError, match="segment ends after 0 of 100 bytes"):
        read_change_set_bytes(path, len(frame(0)) + 10, 100)
    link = tmp_path / segment_name("i", 2)
    link.symlink_to(path)
    with pytest.raises(CorruptedError, match=r"cannot be opened: .* \(a link or something else"):
        read_change_set_bytes(link, 0, 10)
    fifo = tmp_path / segment_name("i", 3)
    os.mkfifo(fifo)
    failures = []
    done = threading.Event()

    def read():
        try:
            read_change_set_bytes(fifo, 0, 10)
        except CorruptedError as exc:
            failures.append(str(exc))
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(30), "reading a FIFO planted as a segment hung"
    assert failures and "not a regular file" in failures[0]
