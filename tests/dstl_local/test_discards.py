"""Discard accounting of local segments: pins, the discard file's format and reading, collection."""

import os
import random
import stat

import pytest

from dstl.local._private import discards
from dstl.local._private.discards import DiscardTracker
from dstl.spi.kit import encode_change_set
from tests.dstl_local.test_discard_space import allocated, file_system_punches_holes

BLOCK = 4096


def frame(sqn: int, size: int) -> bytes:
    """A change set as local stores it: a whole frame, ``size`` bytes of incompressible data."""
    return encode_change_set("op.kg0-8", 1, sqn, [(0, random.Random(sqn).randbytes(size))])


@pytest.fixture
def segments(tmp_path):
    directory = tmp_path / "segments"
    directory.mkdir()
    return directory


def segment(directory, name: str, blobs: list[bytes], *, sealed: bool = True) -> list[tuple[int, int]]:
    """Write a segment of ``blobs``; returns each change set's ``(offset, length)``."""
    data = b"".join(blobs)
    (directory / name).write_bytes(data)
    os.fsync(os.open(directory / name, os.O_RDONLY))
    if sealed:
        (directory / f"{name}.sealed").write_text(str(len(data)))
    extents, offset = [], 0
    for blob in blobs:
        extents.append((offset, len(blob)))
        offset += len(blob)
    return extents


def test_a_discard_is_recorded_as_offset_and_length_lines_beside_the_segment(segments):
    """The discard file is on-disk format: another process (or version) reads the same file."""
    extents = segment(segments, "seg-0-1.log", [frame(0, 100), frame(1, 100)], sealed=False)
    tracker = DiscardTracker(segments)
    assert tracker.discard({"seg-0-1.log": {extents[1]}}) == []
    offset, length = extents[1]
    assert (segments / "seg-0-1.log.discarded").read_text() == f"{offset} {length}\n"
    assert DiscardTracker(segments).discarded_ranges("seg-0-1.log") == {offset: length}


def test_a_change_set_pinned_twice_keeps_its_blocks_until_both_pins_are_gone(segments):
    if not file_system_punches_holes(segments):
        pytest.skip("the file system cannot punch holes")
    extents = segment(segments, "seg-0-1.log", [frame(0, 5 * BLOCK), frame(1, 100)], sealed=False)
    path = segments / "seg-0-1.log"
    tracker = DiscardTracker(segments)
    tracker.pin("seg-0-1.log", 0)
    tracker.pin("seg-0-1.log", 0)  # two writers reuse it
    before = allocated(path)
    tracker.discard({"seg-0-1.log": {extents[0]}})
    assert allocated(path) == before
    assert tracker.unpin([("seg-0-1.log", 0)]) == []  # one pin left
    assert allocated(path) == before
    assert tracker.unpin([("seg-0-1.log", 0)]) == ["seg-0-1.log"]
    assert before - allocated(path) >= 4 * BLOCK


def test_a_segment_is_collected_only_once_no_change_set_in_it_is_pinned(segments):
    extents = segment(segments, "seg-0-1.log", [frame(0, 100), frame(1, 100)])
    tracker = DiscardTracker(segments)
    first, second = extents[0][0], extents[1][0]
    tracker.pin("seg-0-1.log", first)
    tracker.pin("seg-0-1.log", second)
    assert tracker.discard({"seg-0-1.log": set(extents)}) == []  # pinned: kept
    assert tracker.unpin([("seg-0-1.log", first)]) == []
    assert not tracker.collect("seg-0-1.log")
    assert tracker.unpin([("seg-0-1.log", second)]) == ["seg-0-1.log"]
    assert tracker.collect("seg-0-1.log")
    assert sorted(os.listdir(segments)) == ["gc.lock"]  # the segment, its marker and discards: gone


def test_unpinning_what_was_never_pinned_changes_nothing(segments):
    extents = segment(segments, "seg-0-1.log", [frame(0, 100)])
    tracker = DiscardTracker(segments)
    assert tracker.unpin([("seg-0-1.log", 0)]) == []
    tracker.pin("seg-0-1.log", 0)
    assert tracker.discard({"seg-0-1.log": set(extents)}) == []
    assert (segments / "seg-0-1.log").exists(), "a pinned change set's segment was deleted"


def test_collect_deletes_only_sealed_segments_whose_discards_cover_them_and_says_so(segments):
    tracker = DiscardTracker(segments)
    active = segment(segments, "seg-0-1.log", [frame(0, 100)], sealed=False)
    assert tracker.discard({"seg-0-1.log": set(active)}) == []  # still written to: kept
    assert tracker.fully_discarded("seg-0-1.log", active[0][1])
    assert not tracker.fully_discarded("seg-0-1.log", 0)  # nothing written yet is not "all discarded"
    partly = segment(segments, "seg-0-2.log", [frame(0, 100), frame(1, 100)])
    assert tracker.discard({"seg-0-2.log": {partly[0]}}) == []
    assert not tracker.collect("seg-0-2.log")
    quarantined = segment(segments, "seg-0-3.log", [frame(0, 100)])
    (segments / "seg-0-3.log.quarantined").write_text("damaged")
    assert tracker.discard({"seg-0-3.log": set(quarantined)}) == []
    segment(segments, "seg-0-4.log", [])  # sealed empty: nothing in it to keep
    assert tracker.collect("seg-0-4.log")
    segment(segments, "seg-0-5.log", [b"x"])  # one byte, not discarded: kept
    assert not tracker.collect("seg-0-5.log")
    assert tracker.discard({"seg-0-2.log": {partly[1]}}) == ["seg-0-2.log"]
    assert not tracker.collect("seg-0-2.log")  # gone already
    left = sorted(name for name in os.listdir(segments) if name.endswith(".log"))
    assert left == ["seg-0-1.log", "seg-0-3.log", "seg-0-5.log"]
    lock = segments / "gc.lock"  # the lock every process of the job takes to collect
    assert stat.S_IMODE(os.stat(lock).st_mode) == 0o644 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_the_discard_file_is_read_by_whole_lines_and_hostile_lines_are_skipped(segments):
    """Any process appends to the file: a line being written is read once whole; the file is
    untrusted (a dead instance's, or written by hand), so what is not two numbers is skipped."""
    path = segments / "seg-0-1.log.discarded"
    tracker = DiscardTracker(segments)
    path.write_bytes(b"0 100\n")
    assert tracker.discarded_ranges("seg-0-1.log") == {0: 100}
    with open(path, "ab") as file:
        file.write(b"12")  # a line being appended right now
    assert tracker.discarded_ranges("seg-0-1.log") == {0: 100}
    with open(path, "ab") as file:
        file.write(b"34 50\n\xff\xfe junk\n5 x\n7 8\n")
    assert tracker.discarded_ranges("seg-0-1.log") == {0: 100, 1234: 50, 7: 8}
    path.unlink()
    path.write_bytes(b"9 10\n")  # deleted and made anew by another process: shorter
    assert tracker.discarded_ranges("seg-0-1.log") == {9: 10}


def test_reading_the_discard_file_again_parses_only_what_was_appended(segments, monkeypatch):
    """A discard costs what it adds, not the segment's history of discards."""
    path = segments / "seg-0-1.log.discarded"
    tracker = DiscardTracker(segments)
    read = []

    class Counting:
        def __init__(self, *args, **kwargs):
            self._args, self._kwargs = args, kwargs

        def __enter__(self):
            self._file = open(*self._args, **self._kwargs)
            return self

        def __exit__(self, *exc):
            self._file.close()

        def read(self):
            data = self._file.read()
            read.append(len(data))
            return data

        def __getattr__(self, name):
            return getattr(self._file, name)

    monkeypatch.setattr(discards, "open", Counting, raising=False)
    for line in range(100):
        with path.open("a") as file:
            file.write(f"{line * 100} 100\n")
        tracker.discarded_ranges("seg-0-1.log")
        tracker.discarded_ranges("seg-0-1.log")  # nothing new
    assert sum(read) == path.stat().st_size
    assert len(tracker.discarded_ranges("seg-0-1.log")) == 100


def test_a_discarded_frame_whose_header_a_punch_cut_in_two_is_stepped_over_by_its_record(segments):
    """A block boundary inside a discarded frame's header zeroes its lengths but keeps its magic.

    Walking by that header would step a wrong distance, and every later change set of
    the segment would look like no change set at all (its discards refused, its space
    never freed).
    """
    if not file_system_punches_holes(segments):
        pytest.skip("the file system cannot punch holes")
    overhead = len(frame(0, 0))
    head = frame(0, BLOCK - 10 - overhead)  # the next frame starts 10 bytes before a block boundary
    extents = segment(segments, "seg-0-1.log", [head, frame(1, 3 * BLOCK), frame(2, 100), frame(3, 100)])
    (_, _), cut, later, last = extents
    DiscardTracker(segments).discard({"seg-0-1.log": {cut}})
    header = (segments / "seg-0-1.log").read_bytes()[cut[0] : cut[0] + 40]
    assert header.startswith(b"DSTC") and not any(header[10:]), "the punch must cut the header"
    fresh = DiscardTracker(segments)  # another process: it walks the segment from its start
    assert fresh.frames.length_at("seg-0-1.log", later[0]) == later[1]
    assert fresh.frames.length_at("seg-0-1.log", last[0]) == last[1]
