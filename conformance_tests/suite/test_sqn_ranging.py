"""SQN ranging: change-set boundaries, half-open ranges, exact persist ranges."""

from __future__ import annotations

import pytest

from dstl.conformance.testing import change_bytes, persist, read_changes, read_data
from dstl.spi import KeyGroupRange

KG = KeyGroupRange(0, 8)

# (script, expected SQN of each append). "a" appends, "n" is a boundary (next_sqn),
# "p" persists from the initial SQN (also a boundary).
BOUNDARY_RULES = [
    ("a", [0]),
    ("aaa", [0, 0, 0]),
    ("ana", [0, 1]),
    ("nnna", [0]),
    ("annna", [0, 1]),
    ("anana", [0, 1, 2]),
    ("apa", [0, 1]),
    ("appa", [0, 1]),
    ("npna", [0]),
    ("aapnpa", [0, 0, 1]),
]


@pytest.mark.parametrize("values", ["tagged", "empty", "empty-meta"])
@pytest.mark.parametrize(("script", "expected"), BOUNDARY_RULES, ids=[s for s, _ in BOUNDARY_RULES])
def test_boundary_rules(storage, sut, script, expected, values):
    """The rules hold whatever the changes hold: also when every change is zero bytes long."""
    writer = storage.create_writer("op", KG)
    initial = writer.initial_sqn()
    appended = 0
    written = []
    for step in script:
        if step == "a":
            data = change_bytes("b", appended) if values == "tagged" else b""
            if values == "empty-meta":
                writer.append_meta(data)
            else:
                writer.append(appended % 8, data)
            written.append((-1 if values == "empty-meta" else appended % 8, data))
            assert writer.last_appended_sqn() == initial + expected[appended]
            appended += 1
        elif step == "n":
            writer.next_sqn()
        else:
            persist(writer, initial, 1, sut.timeout)
    handle = persist(writer, initial, 2, sut.timeout)
    changes = read_changes(storage, handle)
    assert [sqn - initial for sqn, _, _ in changes] == expected
    assert [(kg, data) for _, kg, data in changes] == written
    assert handle.sqn_range.end == initial + expected[-1] + 1
    assert writer.next_sqn() == handle.sqn_range.end, "a change set of empty changes is still a change set"


def test_next_sqn_is_stable_without_appends(storage):
    writer = storage.create_writer("op", KG)
    first = writer.next_sqn()
    assert writer.next_sqn() == first == writer.initial_sqn()
    assert writer.last_appended_sqn() is None
    writer.append(0, b"x")
    assert writer.next_sqn() == first + 1
    assert writer.next_sqn() == first + 1


def test_persist_from_start_is_exact_with_shared_and_foreign_changes(storage, sut):
    mine = storage.create_writer("mine", KG)
    foreign = storage.create_writer("foreign", KG)
    starts = []
    for sqn in range(6):
        starts.append(mine.next_sqn())
        foreign.next_sqn()
        for index in range(3):
            mine.append((sqn + index) % 8, change_bytes(f"m{sqn}", index))
            foreign.append((sqn + index) % 8, change_bytes(f"f{sqn}", index))
    # One persist each, at the same time: all change sets of both logs may share
    # one object, batch, segment or partition.
    futures = [foreign.persist(0, 1), mine.persist(starts[0], 1)]
    for future in futures:
        future.result(timeout=sut.timeout)
    mine.append(0, change_bytes("m6", 0))
    for index, start in enumerate(starts):
        handle = persist(mine, start, 10 + index, sut.timeout)
        expected = [change_bytes(f"m{s}", i) for s in range(index, 6) for i in range(3)] + [
            change_bytes("m6", 0)
        ]
        assert read_data(storage, handle) == expected, f"persist({start}) returned changes outside its range"
        assert handle.sqn_range.start == start


def test_ranges_are_half_open(storage, sut):
    writer = storage.create_writer("op", KG)
    writer.append(0, b"zero")
    one = writer.next_sqn()
    writer.append(0, b"one")
    handle = persist(writer, one, 1, sut.timeout)
    end = writer.next_sqn()
    assert (handle.sqn_range.start, handle.sqn_range.end) == (one, end)
    assert read_changes(storage, handle) == [(one, 0, b"one")]
    at_end = persist(writer, end, 2, sut.timeout)
    assert at_end.sqn_range.is_empty and read_changes(storage, at_end) == []


def test_persist_beyond_next_sqn_is_rejected(storage):
    writer = storage.create_writer("op", KG)
    writer.append(0, b"x")
    with pytest.raises(ValueError, match="beyond"):
        writer.persist(writer.next_sqn() + 1, 1)


def test_repeated_overlapping_persists(storage, sut):
    writer = storage.create_writer("op", KG)
    total_incremental = 0
    total_size = 0
    for round_ in range(5):
        for index in range(4):
            data = change_bytes(f"r{round_}", index, 32)
            writer.append(index, data)
            total_size += len(data)
        first = persist(writer, 0, 2 * round_ + 1, sut.timeout)
        again = persist(writer, 0, 2 * round_ + 2, sut.timeout)
        total_incremental += first.incremental_size + again.incremental_size
        assert again.incremental_size == 0, "a repeated persist uploaded already persisted changes again"
        assert read_changes(storage, first) == read_changes(storage, again)
        assert first.size == again.size == total_size
    assert total_incremental == total_size


def test_key_group_filter(storage, sut):
    writer = storage.create_writer("op", KG)
    for index in range(40):
        writer.append(index % 8, change_bytes("kg", index))
    writer.append_meta(b"meta")
    handle = persist(writer, 0, 1, sut.timeout)
    subset = KeyGroupRange(2, 5)
    changes = read_changes(storage, handle, subset)
    assert [kg for _, kg, _ in changes if kg >= 0] == [i % 8 for i in range(40) if i % 8 in subset]
    assert (handle.sqn_range.start, -1, b"meta") in changes, "metadata must survive a key-group filter"
    assert read_changes(storage, handle, KeyGroupRange(8, 8)) == [(handle.sqn_range.start, -1, b"meta")]


def test_handle_describes_its_changes(storage, sut):
    writer = storage.create_writer("desc", KeyGroupRange(4, 8), epoch=3)
    writer.append(4, b"abc")
    writer.append(7, b"defg")
    handle = persist(writer, 0, 42, sut.timeout)
    assert handle.storage_id == sut.identifier
    assert handle.key_groups == KeyGroupRange(4, 8)
    assert handle.epoch == 3
    assert handle.checkpoint_id == 42
    assert handle.size == 7
    assert handle.incremental_size == 7
    assert handle.log_id == writer.log_id
