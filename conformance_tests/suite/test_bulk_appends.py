"""``append_all``: a batch of changes is exactly its changes appended one by one, or none of them."""

from __future__ import annotations

import array

import pytest

from dstl.conformance.testing import change_bytes, persist, read_changes
from dstl.spi import ClosedError, KeyGroupRange

KG = KeyGroupRange(4, 12)


def _batches() -> list[list[tuple[int, bytes]]]:
    """Batches of every size the bulk path sees: one change, none, many, empty and large values."""
    many = [(4 + i % 8, change_bytes("many", i)) for i in range(300)]
    return [
        [(5, b"one")],
        [],
        many,
        [(11, b""), (4, b"x" * 70_000), (11, b"")],
        [(7, change_bytes("last", 0))],
    ]


def test_a_batch_reads_back_as_its_changes_appended_one_by_one(storage, sut):
    bulk, single = storage.create_writer("bulk", KG), storage.create_writer("single", KG)
    boundaries = []
    for index, batch in enumerate(_batches()):
        bulk.append_all([kg for kg, _ in batch], [data for _, data in batch])
        for key_group, data in batch:
            single.append(key_group, data)
        bulk.append(6, b"between")  # single appends go on after a batch
        single.append(6, b"between")
        if index % 2:  # a change set boundary between batches
            boundaries.append(bulk.next_sqn())
            single.next_sqn()
    expected = read_changes(storage, persist(single, single.initial_sqn(), 1, sut.timeout))
    written = read_changes(storage, persist(bulk, bulk.initial_sqn(), 1, sut.timeout))
    assert [(kg, data) for _, kg, data in written] == [(kg, data) for _, kg, data in expected]
    assert len(written) == sum(len(batch) + 1 for batch in _batches())
    sqns = [sqn for sqn, _, _ in written]
    assert sqns == sorted(sqns), "a batch's changes keep their order in the log"
    segments = []  # how many boundaries came before each change was appended
    for index, batch in enumerate(_batches()):
        segments += [len([i for i in range(index) if i % 2])] * (len(batch) + 1)
    for sqn, segment in zip(sqns, segments, strict=True):  # a boundary separates what came before and after
        assert segment == 0 or sqn >= boundaries[segment - 1]
        assert segment == len(boundaries) or sqn < boundaries[segment]


def test_an_empty_batch_appends_nothing(storage, sut):
    writer = storage.create_writer("op", KG)
    writer.append_all([], [])
    assert writer.last_appended_sqn() is None
    first = writer.next_sqn()
    writer.append_all([], [])
    assert writer.next_sqn() == first, "an empty batch is no change set"
    writer.append_all([4], [b"x"])
    assert writer.last_appended_sqn() == first
    assert read_changes(storage, persist(writer, first, 1, sut.timeout)) == [(first, 4, b"x")]


def test_a_batch_takes_bytes_like_values_by_their_bytes_and_copies_them(storage, sut):
    buffer = bytearray(b"first")
    numbers = array.array("i", [1, -2, 3])  # 3 items, 12 bytes
    view_source = bytearray(b"second")
    writer = storage.create_writer("op", KG)
    writer.append_all([4, 5, 6], [buffer, numbers, memoryview(view_source)])
    buffer[:] = b"FIRST"
    numbers[0] = 99
    view_source[:] = b"SECOND"
    handle = persist(writer, writer.initial_sqn(), 1, sut.timeout)
    assert [data for _, _, data in read_changes(storage, handle)] == [
        b"first",
        array.array("i", [1, -2, 3]).tobytes(),
        b"second",
    ]


@pytest.mark.parametrize(
    ("key_groups", "data", "error", "words"),
    [
        ([4, 12, 5], [b"a", b"b", b"c"], ValueError, "outside"),
        ([4, 3], [b"a", b"b"], ValueError, "outside"),
        ([4, True], [b"a", b"b"], ValueError, "outside"),
        ([4, 5], [b"a", "text"], TypeError, "bytes"),
        ([4, 5], [b"a", None], TypeError, "bytes"),
        ([4, 5, 6], [b"a", b"b"], ValueError, "3 key groups for 2 changes"),
    ],
)
def test_a_refused_batch_appends_none_of_its_changes(storage, sut, key_groups, data, error, words):
    writer = storage.create_writer("op", KG)
    writer.append(4, b"kept")
    with pytest.raises(error, match=words):
        writer.append_all(key_groups, data)
    writer.append(5, b"also kept")
    handle = persist(writer, writer.initial_sqn(), 1, sut.timeout)
    assert [data for _, _, data in read_changes(storage, handle)] == [b"kept", b"also kept"]


def test_a_batch_after_close_is_refused(storage):
    writer = storage.create_writer("op", KG)
    writer.close()
    with pytest.raises(ClosedError):
        writer.append_all([4], [b"late"])
