"""Discarded change sets give their disk space back while the segment holding them lives on."""

import errno
import logging
import os
import random
import shutil
import subprocess
import uuid

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dstl.conformance.testing import persist, read_data
from dstl.local._private import holes
from dstl.local._private.holes import merged, punch_holes
from dstl.spi import CorruptedError, KeyGroupRange, StorageError, load_storage

KG = KeyGroupRange(0, 8)
CHANGE = 20_000  # bytes per dropped change set: several blocks each


def noise(size: int, seed: int) -> bytes:
    """Incompressible change data: what is written is what is stored."""
    return random.Random(seed).randbytes(size)


def allocated(path) -> int:
    """Bytes of disk the file occupies (holes excluded), as ``du`` counts them."""
    return os.stat(path).st_blocks * 512


def file_system_punches_holes(directory) -> bool:
    """Whether the kernel and file system under ``directory`` punch holes, asked with util-linux's
    ``fallocate(1)``: the oracle is not the code under test, so a broken ``punch_holes`` fails the
    tests below instead of skipping them."""
    tool = shutil.which("fallocate")
    if tool is None:
        pytest.skip("no fallocate(1) to tell whether the file system punches holes")
    probe = directory / "probe"
    probe.write_bytes(noise(1 << 16, 0))
    os.fsync(os.open(probe, os.O_RDONLY))
    punched = subprocess.run([tool, "--punch-hole", "--offset", "0", "--length", str(1 << 16), str(probe)])
    return punched.returncode == 0 and allocated(probe) < 1 << 16


@pytest.fixture
def config(tmp_path):
    if not file_system_punches_holes(tmp_path):
        pytest.skip(f"the file system under {tmp_path} cannot punch holes")
    return {"dstl.storage": "local", "dstl.local.dir": str(tmp_path / "dstl")}  # 64 MB segments


def persist_each(writer, payloads) -> list:
    """Append and persist each payload as a change set of its own; their handles, in order."""
    handles = []
    for payload in payloads:
        writer.append(0, payload)
        sqn = writer.next_sqn() - 1
        handles.append(persist(writer, sqn, sqn + 1))
    return handles


def _interleaved(storage, rounds=30):
    """A kept and a dropped log writing into one segment, in turn; returns both writers and handles."""
    keep, drop = storage.create_writer("keep", KG), storage.create_writer("drop", KG)
    kept, dropped = [], []
    for round_ in range(rounds):
        drop.append(0, noise(CHANGE, round_))
        dropped.append(persist(drop, drop.next_sqn() - 1, round_ + 1))
        keep.append(1, f"kept {round_}".encode())
        kept.append(persist(keep, keep.next_sqn() - 1, round_ + 1))
    return keep, drop, kept, dropped


def test_discarded_change_sets_free_their_blocks_and_live_ones_stay_readable(config):
    with load_storage(config, job_id="job") as storage:
        keep, drop, kept, dropped = _interleaved(storage)
        (segment,) = storage.list_objects()
        path = storage.segments_dir / segment
        size, before = os.stat(path).st_size, allocated(path)
        drop.truncate(len(dropped))  # no writer reuses them any more
        storage.discard(dropped)
        assert storage.list_objects() == [segment], "the segment still holds live change sets"
        assert os.stat(path).st_size == size
        block = os.stat(path).st_blksize
        whole_blocks = sum(  # a dropped change set sits between two kept ones: its whole blocks go
            ((loc["offset"] + loc["length"]) // block - -(-loc["offset"] // block)) * block
            for handle in dropped
            for loc in handle.location_dicts
        )
        freed = before - allocated(path)
        assert whole_blocks >= 0.6 * CHANGE * len(dropped)
        # The holes fragment the file: ext4 may take a block for the extent tree.
        assert freed >= whole_blocks - 2 * block, (before, allocated(path), whole_blocks)
        assert [read_data(storage, h) for h in kept] == [[f"kept {r}".encode()] for r in range(len(kept))]
        storage.discard(dropped)  # again: already accounted, not a forged handle
        assert storage.metrics.counter("refused_discards") == 0
        with pytest.raises(StorageError, match="was discarded") as refused:
            read_data(storage, dropped[5])
        assert not isinstance(refused.value, CorruptedError), "a freed change set is not damage"


def test_a_change_set_a_writer_still_reuses_keeps_its_blocks_until_released(config):
    with load_storage(config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        writer.append(0, noise(CHANGE * 4, 1))
        first = persist(writer, 0, 1)
        writer.append(0, b"later")
        persist(writer, 0, 2)  # reuses the first change set: pinned
        (segment,) = storage.list_objects()
        path = storage.segments_dir / segment
        before = allocated(path)
        storage.discard([first])
        assert allocated(path) == before, "blocks of a change set still reused were freed"
        writer.truncate(1)  # the writer lets go of it
        assert before - allocated(path) >= 0.8 * CHANGE * 4


def test_recovery_of_a_crashed_instance_skips_the_holes(config):
    storage = load_storage(config, job_id="job")
    keep, drop, kept, dropped = _interleaved(storage, rounds=10)
    drop.truncate(len(dropped))
    storage.discard(dropped)
    storage._instance_lock.release()  # a crash: the segment was never sealed
    with load_storage(config, job_id="job") as fresh:
        assert fresh.metrics.counter("quarantined_segments") == 0
        assert fresh.metrics.counter("recovered_torn_bytes") == 0
        assert [read_data(fresh, h) for h in kept] == [[f"kept {r}".encode()] for r in range(len(kept))]


def test_runs_merge_and_only_whole_blocks_inside_them_are_punched(tmp_path):
    assert merged([(10, 5), (0, 10), (30, 5), (32, 10)]) == [(0, 15), (30, 42)]
    assert merged([(0, 10), (2, 3)]) == [(0, 10)]  # a run inside another
    if not file_system_punches_holes(tmp_path):
        pytest.skip("the file system cannot punch holes")
    path = tmp_path / "f"
    data = noise(8 * 4096, 2)
    path.write_bytes(data)
    os.fsync(os.open(path, os.O_RDONLY))
    before = allocated(path)
    # (start, end) runs: block 1 whole (blocks 0 and 2 in part); one from inside block 3 to
    # inside block 4 (nothing whole: skipped); blocks 5 and 6 whole: every run is punched
    freed = punch_holes(path, [(100, 2 * 4096 + 50), (3 * 4096 + 10, 4 * 4096 + 10), (5 * 4096, 7 * 4096)])
    assert freed == 3 * 4096
    assert before - allocated(path) == 3 * 4096
    holes = data[:4096] + bytes(4096) + data[2 * 4096 : 5 * 4096] + bytes(2 * 4096) + data[7 * 4096 :]
    assert path.read_bytes() == holes
    assert os.stat(path).st_size == len(data)  # the size is kept
    assert punch_holes(tmp_path / "missing", [(0, 8192)]) == 0


def test_a_file_system_refusing_the_punch_frees_nothing_and_says_why(tmp_path, caplog):
    """An error other than "not supported" is logged with the kernel's reason; the bytes freed
    before it are counted (here: none, as the device refuses the first run)."""
    with caplog.at_level(logging.WARNING, logger="dstl.local"):
        assert punch_holes("/dev/null", [(0, 8192)]) == 0  # a device: ENODEV
    assert caplog.messages == [f"could not free discarded bytes of /dev/null: {os.strerror(errno.ENODEV)}"]


def test_without_hole_punching_nothing_is_freed(tmp_path, monkeypatch):
    """Not Linux (no ``fallocate``): discards free their space only when the segment goes."""
    path = tmp_path / "f"
    data = noise(4 * 4096, 5)
    path.write_bytes(data)
    monkeypatch.setattr(holes, "_FALLOCATE", None)
    assert punch_holes(path, [(0, 4 * 4096)]) == 0
    assert path.read_bytes() == data


def test_holes_are_punched_past_two_gibibytes(tmp_path):
    """Offsets of a long segment do not fit a C ``int``: they reach the kernel as 64-bit ``off_t``."""
    if not file_system_punches_holes(tmp_path):
        pytest.skip("the file system cannot punch holes")
    path = tmp_path / "sparse"
    far = (1 << 31) + 4096
    with open(path, "wb") as sparse:  # only the last blocks hold data
        sparse.seek(far)
        sparse.write(noise(2 * 4096, 6))
    assert punch_holes(path, [(far, far + 4096)]) == 4096
    with open(path, "rb") as sparse:
        sparse.seek(far)
        assert sparse.read(4096) == bytes(4096)


def test_a_frame_hidden_in_change_data_cannot_be_discarded_or_freed(config):
    """A handle is untrusted: a frame-like run of bytes inside a live change set is not a change set."""
    from dstl.spi import ChangelogHandle
    from dstl.spi.kit import encode_change_set

    inner = encode_change_set("fake.kg0-8", 1, 0, [(0, noise(CHANGE * 2, 7))])
    with load_storage(config, job_id="job") as storage:
        victim = storage.create_writer("victim", KG)
        victim.append(0, noise(100, 8) + inner + noise(100, 9))
        live = persist(victim, 0, 1)
        (segment,) = storage.list_objects()
        path = storage.segments_dir / segment
        hidden_at = path.read_bytes().find(inner)
        assert hidden_at > 0, "the test needs the inner frame stored as written"
        doc = live.to_dict()
        doc["locations"][0].update(offset=hidden_at, length=len(inner))
        before = allocated(path)
        storage.discard([ChangelogHandle.from_dict(doc)])
        assert storage.metrics.counter("refused_discards") == 1
        assert allocated(path) == before, "blocks inside a live change set were freed"
        assert read_data(storage, live) == [noise(100, 8) + inner + noise(100, 9)]


def _holes(path, end: int) -> set[int]:
    """The block indexes of ``path`` below ``end`` that are holes (``SEEK_HOLE``/``SEEK_DATA``)."""
    block = os.stat(path).st_blksize
    found: set[int] = set()
    fd = os.open(path, os.O_RDONLY)
    try:
        position = 0
        while position < end:
            try:
                hole = os.lseek(fd, position, os.SEEK_HOLE)
            except OSError:
                break
            if hole >= end:
                break
            try:
                data = os.lseek(fd, hole, os.SEEK_DATA)
            except OSError:  # ENXIO: a hole to the end of the file
                data = end
            found.update(range(hole // block, min(data, end) // block))
            position = data
    finally:
        os.close(fd)
    return found


def _blocks_inside(intervals, block: int) -> set[int]:
    return {index for start, end in intervals for index in range(-(-start // block), end // block)}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=st.lists(st.tuples(st.integers(1, 3 * 4096 + 7), st.booleans()), min_size=2, max_size=9))
@example(layout=[(5000, True), (4096, False), (9000, True)])  # a live change set between two dropped
@example(layout=[(3 * 4096, True), (3 * 4096, True), (10, False)])  # neighbours merge into one run
def test_holes_are_exactly_the_whole_blocks_of_the_discarded_change_sets(config, layout):
    """Hole punching frees the whole blocks inside discarded extents, and nothing of a live one."""
    own = {**config, "dstl.local.dir": f"{config['dstl.local.dir']}-{uuid.uuid4().hex}"}  # one per example
    with load_storage(own, job_id="job") as storage:
        handles = []
        for index, (size, drop) in enumerate(layout):
            writer = storage.create_writer(f"log{index}", KG)
            writer.append(0, noise(size, index))
            handles.append(persist(writer, 0, 1))
            if drop:
                writer.truncate(1)  # no writer reuses it any more
        (segment,) = storage.list_objects()
        path = storage.segments_dir / segment
        extents = [(loc["offset"], loc["length"]) for h in handles for loc in h.location_dicts]
        dropped = [h for h, (_, drop) in zip(handles, layout, strict=True) if drop]
        kept = [
            (index, h) for index, (h, (_, drop)) in enumerate(zip(handles, layout, strict=True)) if not drop
        ]
        block = os.stat(path).st_blksize
        storage.discard(dropped)
        end = max(offset + length for offset, length in extents)
        gone = merged((loc["offset"], loc["length"]) for h in dropped for loc in h.location_dicts)
        live = merged((loc["offset"], loc["length"]) for _, h in kept for loc in h.location_dicts)
        if not kept:
            assert not path.exists(), "a segment with nothing live stays"
        else:
            assert _holes(path, end) == _blocks_inside(gone, block) - _blocks_touched(live, block)
            for index, handle in kept:
                assert read_data(storage, handle) == [noise(layout[index][0], index)]


def _blocks_touched(intervals, block: int) -> set[int]:
    return {index for start, end in intervals for index in range(start // block, -(-end // block))}


def test_a_discard_after_a_restart_steps_over_the_holes_earlier_discards_left(config):
    """A fresh frame index walks the segment from its start: the zeroed blocks of change sets
    discarded before are stepped over by their recorded discards, so later ones are found."""
    with load_storage(config, job_id="job") as storage:
        keep, drop, kept, dropped = _interleaved(storage, rounds=12)
        drop.truncate(len(dropped))
        storage.discard(dropped[:6])
        (segment,) = storage.list_objects()
        path = storage.segments_dir / segment
        after_first = allocated(path)
    with load_storage(config, job_id="job") as fresh:
        fresh.discard(dropped[6:])
        assert fresh.metrics.counter("refused_discards") == 0
        assert after_first - allocated(path) >= 0.6 * CHANGE * 6
        assert [read_data(fresh, h) for h in kept] == [[f"kept {r}".encode()] for r in range(len(kept))]


def test_a_handle_naming_a_torn_tail_is_refused_and_frees_nothing(config):
    """A frame whose bytes do not all exist yet (a write in flight, a torn tail) is no change set,
    even when its header names the handle's log, epoch and sequence number."""
    from dstl.spi import ChangelogHandle

    with load_storage(config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        writer.append(0, noise(CHANGE, 3))
        live = persist(writer, 0, 1)
        (segment,) = storage.list_objects()
        path = storage.segments_dir / segment
        (loc,) = live.location_dicts
        frame = path.read_bytes()[loc["offset"] : loc["offset"] + loc["length"]]
        tail = os.stat(path).st_size
        with open(path, "ab") as torn:  # half of a copy of the live frame, after it
            torn.write(frame[: len(frame) // 2])
        before, size = allocated(path), os.stat(path).st_size
        doc = live.to_dict()
        doc["locations"][0].update(offset=tail, length=len(frame))
        storage.discard([ChangelogHandle.from_dict(doc)])
        assert storage.metrics.counter("refused_discards") == 1
        assert (allocated(path), os.stat(path).st_size) == (before, size)
        assert read_data(storage, live) == [noise(CHANGE, 3)]


def test_discarding_change_sets_one_by_one_reads_each_frame_header_once(config, monkeypatch):
    """The frame walk is kept and continues where it stopped: discarding n change sets one at a
    time reads O(n) headers, not O(n²) (a cost per discard that would grow with the segment)."""
    with load_storage(config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        handles = persist_each(writer, (noise(64, sqn) for sqn in range(200)))
        writer.truncate(200)
        reads = []
        real_pread = os.pread
        monkeypatch.setattr(os, "pread", lambda fd, n, at: reads.append(at) or real_pread(fd, n, at))
        for handle in handles[:-1]:  # the last keeps the segment
            storage.discard([handle])
        monkeypatch.undo()
        assert storage.metrics.counter("refused_discards") == 0
        assert len(reads) <= 2 * len(handles), len(reads)


def test_each_discard_punches_only_the_runs_it_touched(config, monkeypatch):
    """Blocks freed before are not punched again: a discard's cost does not grow with the
    segment's history of discards."""
    with load_storage(config, job_id="job") as storage:
        keep, drop, kept, dropped = _interleaved(storage, rounds=40)
        drop.truncate(len(dropped))
        calls = []
        real = holes._FALLOCATE
        monkeypatch.setattr(holes, "_FALLOCATE", lambda *args: calls.append(args) or real(*args))
        for handle in reversed(dropped):  # kept change sets between them: one run each
            storage.discard([handle])
        assert storage.metrics.counter("refused_discards") == 0
        assert len(calls) == len(dropped), len(calls)


def test_a_walk_stops_at_damage_that_no_discard_explains(config):
    """A frame header that is neither whole nor a recorded discard ends the walk: what lies
    after it cannot be proven a change set, so discards there are refused (and nothing hangs)."""
    import threading

    with load_storage(config, job_id="job") as storage:
        writer = storage.create_writer("op", KG)
        handles = persist_each(writer, (noise(100, sqn) for sqn in range(3)))
        writer.truncate(3)
        (segment,) = storage.list_objects()
        (damaged,) = handles[1].location_dicts
        with open(storage.segments_dir / segment, "r+b") as file:  # the second header zeroed
            file.seek(damaged["offset"])
            file.write(bytes(16))
        done = threading.Event()
        worker = threading.Thread(target=lambda: (storage.discard([handles[2]]), done.set()), daemon=True)
        worker.start()
        assert done.wait(30), "the frame walk did not stop at the damage"
        assert storage.metrics.counter("refused_discards") == 1
