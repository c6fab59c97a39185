"""Every read path holds to the same properties: ``read`` and ``read_change_sets``, filtered or not.

``read_change_sets`` with a key-group filter is what a restore uses; storages that
hold decoded change sets override it, so it is checked on its own, not through ``read``.
"""

from __future__ import annotations

import os

import pytest

from dstl.conformance import requires
from dstl.conformance.testing import assert_explained, change_bytes, persist
from dstl.spi import ChangelogHandle, CorruptedError, KeyGroupRange, SequenceNumberRange, StorageError

KG = KeyGroupRange(0, 16)
#: filters a restore uses: everything, one instance's half, a slice, one group, none of the log's
FILTERS = [None, KeyGroupRange(0, 16), KeyGroupRange(0, 8), KeyGroupRange(5, 11), KeyGroupRange(15, 16)]


def _written(writer):
    """Change sets over every key group, meta records, empty and large values; ``(sqn, kg, data)``."""
    expected = []
    for round_ in range(12):
        sqn = writer.next_sqn()
        if round_ % 4 == 0:
            writer.append_meta(change_bytes("meta", round_))
            expected.append((sqn, -1, change_bytes("meta", round_)))
        for index in range(round_ % 5 + 1):
            key_group = (round_ * 7 + index * 3) % 16
            data = change_bytes(f"r{round_}", index)
            if index == 2:
                data = b""
            elif index == 3:
                data = os.urandom(3000)
            writer.append(key_group, data)
            expected.append((sqn, key_group, data))
    return expected


def _wanted(expected, key_groups):
    return [c for c in expected if key_groups is None or c[1] < 0 or c[1] in key_groups]


def _via_read(storage, handle, key_groups):
    reader = storage.create_reader()
    try:
        return [(c.sqn, c.key_group, c.data) for c in reader.read(handle, key_groups)]
    finally:
        reader.close()


def _via_change_sets(storage, handle, key_groups):
    reader = storage.create_reader()
    try:
        sets = list(reader.read_change_sets(handle, key_groups))
    finally:
        reader.close()
    sqns = [sqn for sqn, changes in sets if changes]
    assert sqns == sorted(set(sqns)), f"change sets out of SQN order or split: {sqns}"
    return [(sqn, kg, bytes(data)) for sqn, changes in sets for kg, data in changes]


@pytest.mark.parametrize("key_groups", FILTERS, ids=lambda r: "all" if r is None else f"{r.start}-{r.end}")
def test_every_read_path_yields_the_same_changes(storage, sut, key_groups):
    writer = storage.create_writer("paths", KG)
    expected = _written(writer)
    handle = persist(writer, writer.initial_sqn(), 1, sut.timeout)
    wanted = _wanted(expected, key_groups)
    assert _via_read(storage, handle, key_groups) == wanted
    assert _via_change_sets(storage, handle, key_groups) == wanted
    fresh = sut.open()
    assert _via_change_sets(fresh, handle, key_groups) == wanted


def test_read_change_sets_keeps_a_persist_exact_and_truncation_final(storage, sut):
    writer = storage.create_writer("paths", KG)
    expected = _written(writer)
    first = persist(writer, writer.initial_sqn(), 1, sut.timeout)
    middle = expected[len(expected) // 2][0]
    writer.truncate(middle)
    writer.append(3, b"after truncation")
    later = persist(writer, middle, 2, sut.timeout)
    tail = [c for c in expected if c[0] >= middle] + [(later.sqn_range.end - 1, 3, b"after truncation")]
    for key_groups in FILTERS:
        assert _via_change_sets(storage, later, key_groups) == _wanted(tail, key_groups)
        assert _via_change_sets(storage, first, key_groups) == _wanted(expected, key_groups)


@requires("corruption_injection")
@pytest.mark.parametrize("key_groups", [None, KeyGroupRange(0, 8)], ids=["all", "filtered"])
def test_read_change_sets_reports_corruption(storage, sut, key_groups):
    writer = storage.create_writer("paths", KG)
    for key_group in KG:
        writer.append(key_group, change_bytes("c", key_group, 200))
    handle = persist(writer, 0, 1, sut.timeout)
    sut.require_backdoor().corrupt(storage, handle)
    with pytest.raises(CorruptedError) as info:
        _via_change_sets(sut.open(), handle, key_groups)
    assert_explained(info.value)


@requires("corruption_injection")
@pytest.mark.parametrize("path", ["read", "read_change_sets"])
@pytest.mark.parametrize("key_groups", FILTERS, ids=lambda r: "all" if r is None else f"{r.start}-{r.end}")
@pytest.mark.parametrize("ranged", [False, True], ids=["whole", "ranged"])
def test_every_read_path_verifies_what_it_returns(storage, sut, path, key_groups, ranged):
    """Reads verify on every path: whole, filtered by key group, streamed, or a partial SQN range.

    Every change set spans every key group, so each filter meets the damaged one (the
    first); whatever the path, it is a :class:`CorruptedError` and none of its changes
    are returned (a restore served from a cache of what was written, or a fast path
    that skips the checksum, returns them).
    """
    writer = storage.create_writer("verified", KG)
    written = []
    for round_ in range(4):
        sqn = writer.next_sqn()
        for key_group in KG:
            data = change_bytes(f"v{round_}", key_group, 64)
            writer.append(key_group, data)
            written.append((sqn, key_group, data))
    handle = persist(writer, writer.initial_sqn(), 1, sut.timeout)
    if ranged:  # a partial read: all but the last change set
        handle = _handle_like(handle, sqn_range=SequenceNumberRange(handle.sqn_range.start, written[-1][0]))
    sut.require_backdoor().corrupt(storage, handle)
    reader = sut.open().create_reader()
    returned = []
    try:
        with pytest.raises(CorruptedError) as info:
            if path == "read":
                for change in reader.read(handle, key_groups):
                    returned.append((change.sqn, change.key_group, bytes(change.data)))
            else:
                for sqn, changes in reader.read_change_sets(handle, key_groups):
                    returned.extend((sqn, key_group, bytes(data)) for key_group, data in changes)
    finally:
        reader.close()
    damaged = written[0][0]
    assert not [change for change in returned if change[0] == damaged], "the damaged change set was returned"
    assert all(change in written for change in returned), "bytes nobody wrote were returned"
    assert_explained(info.value)


@requires("physical_truncation")
def test_read_change_sets_of_a_discarded_handle_is_an_error_not_empty(storage, sut):
    writer = storage.create_writer("paths", KG)
    writer.append(1, b"gone")
    handle = persist(writer, 0, 1, sut.timeout)
    writer.close()
    storage.discard([handle])
    for key_groups in (None, KeyGroupRange(0, 8)):
        with pytest.raises(StorageError) as info:
            _via_change_sets(sut.open(), handle, key_groups)
        assert_explained(info.value)


def _handle_like(handle, **changes):
    fields = {
        "storage_id": handle.storage_id,
        "log_id": handle.log_id,
        "key_groups": handle.key_groups,
        "sqn_range": handle.sqn_range,
        "epoch": handle.epoch,
        "locations": handle.location_dicts,
    }
    return ChangelogHandle.create(**{**fields, **changes})


@pytest.mark.parametrize("path", ["read", "read_change_sets"])
def test_only_the_handles_sqn_range_is_read_whatever_its_locations_say(storage, sut, path):
    writer = storage.create_writer("paths", KG)
    expected = _written(writer)
    handle = persist(writer, writer.initial_sqn(), 1, sut.timeout)
    start, end = handle.sqn_range.start + 2, handle.sqn_range.end - 3
    narrowed = _handle_like(handle, sqn_range=SequenceNumberRange(start, end))
    got = (_via_read if path == "read" else _via_change_sets)(storage, narrowed, None)
    assert got == [c for c in expected if start <= c[0] < end]


@pytest.mark.parametrize("path", ["read", "read_change_sets"])
@pytest.mark.parametrize("lie", ["log", "epoch", "sqn"])
def test_a_location_of_another_change_set_is_corruption_not_data(storage, sut, path, lie):
    """A handle is untrusted input: its locations must lead to the change sets it names."""
    writer = storage.create_writer("paths", KG, epoch=5)
    other = storage.create_writer("other", KG, epoch=5)
    for index in range(3):
        writer.append(index, change_bytes("mine", index))
        other.append(index, change_bytes("theirs", index))
        writer.next_sqn()
        other.next_sqn()
    mine = persist(writer, 0, 1, sut.timeout)
    theirs = persist(other, 0, 1, sut.timeout)
    if lie == "log":  # my log's SQNs, their change sets
        forged = _handle_like(mine, locations=theirs.location_dicts)
    elif lie == "epoch":  # my change sets, claimed for another epoch
        forged = _handle_like(mine, epoch=6)
    else:  # my change sets, each under the next SQN
        locations = [{**loc, "sqn": int(loc["sqn"]) + 1} for loc in mine.location_dicts]
        forged = _handle_like(mine, sqn_range=SequenceNumberRange(1, 4), locations=locations)
    with pytest.raises(CorruptedError) as info:
        (_via_read if path == "read" else _via_change_sets)(sut.open(), forged, None)
    assert_explained(info.value)
