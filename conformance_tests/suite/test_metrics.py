"""Metrics: the required counters exist and move."""

from __future__ import annotations

import os

from dstl.conformance import requires
from dstl.conformance.testing import persist
from dstl.spi import REQUIRED_COUNTERS, FencedError, KeyGroupRange


def test_required_counters_exist(storage):
    counters = storage.metrics.counters()
    missing = [name for name in REQUIRED_COUNTERS if name not in counters]
    assert not missing, f"missing counters: {missing}"


def test_counters_move(storage, sut):
    writer = storage.create_writer("op", KeyGroupRange(0, 2))
    before = storage.metrics.counters()
    writer.append(0, os.urandom(100))  # incompressible: what is uploaded is at least what was written
    writer.append(1, b"y")
    writer.append_meta(b"m")
    handle = persist(writer, 0, 1, sut.timeout)
    after = storage.metrics.counters()
    assert after["appends"] - before["appends"] == 3, "every append counts once, metadata too"
    assert after["persists"] - before["persists"] == 1
    assert after["uploads"] > before["uploads"]
    assert after["uploaded_bytes"] - before["uploaded_bytes"] >= 101
    persist(writer, 0, 2, sut.timeout)  # nothing new: nothing counted twice
    again = storage.metrics.counters()
    assert again["appends"] == after["appends"] and again["persists"] == after["persists"] + 1
    storage.discard([handle])
    assert storage.metrics.counter("discarded_change_sets") > before["discarded_change_sets"]


def test_handle_sizes_count_every_byte_appended(storage, sut):
    """``size`` is the data of every change the handle holds, metadata included; ``incremental_size``
    what this persist uploaded anew."""
    writer = storage.create_writer("op", KeyGroupRange(0, 2))
    writer.append(0, b"x" * 40)
    writer.append_all([1, 0, 1], [b"a" * 20, b"b" * 7, b"c" * 3])  # the bulk path counts each change
    writer.append_meta(b"m" * 30)
    first = persist(writer, 0, 1, sut.timeout)
    assert (first.size, first.incremental_size) == (100, 100)
    writer.confirm(first.sqn_range.start, first.sqn_range.end, 1)
    writer.append_meta(b"n" * 5)
    writer.append(1, b"")
    second = persist(writer, 0, 2, sut.timeout)
    assert (second.size, second.incremental_size) == (105, 5)


@requires("fencing")
def test_a_failed_persist_is_counted(sut):
    storage = sut.open()
    old = storage.create_writer("op", KeyGroupRange(0, 4), epoch=1)
    before = storage.metrics.counter("persist_failures")
    sut.open().create_writer("op", KeyGroupRange(0, 4), epoch=2)
    old.append(0, b"fenced")
    try:
        old.persist(0, 1).result(timeout=sut.timeout)
    except FencedError:
        pass
    else:
        raise AssertionError("a persist of a fenced writer completed")
    assert storage.metrics.counter("persist_failures") == before + 1


def test_every_change_set_is_uploaded_once(storage, sut):
    """Persists, uploads ahead (where a storage does them) and reuse never upload a change set twice."""
    writer = storage.create_writer("op", KeyGroupRange(0, 2))
    before = storage.metrics.counter("uploaded_bytes")
    written = 0
    for checkpoint in range(1, 11):
        for _ in range(20):  # 20 KB a change set: past where storages upload ahead of the persist
            writer.append(checkpoint % 2, os.urandom(1000))  # incompressible: stored about as written
            written += 1000
        writer.next_sqn()
        handle = persist(writer, 0, checkpoint, sut.timeout)
        writer.confirm(handle.sqn_range.start, handle.sqn_range.end, checkpoint)
    uploaded = storage.metrics.counter("uploaded_bytes") - before
    # at most a kilobyte of framing per change set on top of the data (ten change sets)
    assert written <= uploaded <= written + 10 * 1024, (written, uploaded)
