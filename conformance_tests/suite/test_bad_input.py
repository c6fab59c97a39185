"""Bad input: clear errors, nothing lost."""

from __future__ import annotations

import array

import pytest

from dstl.conformance.testing import assert_explained, persist, read_data
from dstl.spi import (
    ChangelogHandle,
    ClosedError,
    DstlError,
    InvalidHandleError,
    InvalidIdentifierError,
    KeyGroupRange,
)

KG = KeyGroupRange(4, 8)


@pytest.mark.parametrize("key_group", [3, 8, 100, -2])
def test_key_group_outside_range(storage, key_group):
    writer = storage.create_writer("op", KG)
    with pytest.raises(ValueError, match="outside"):
        writer.append(key_group, b"x")


@pytest.mark.parametrize("data", ["text", 5, None, [1, 2]])
def test_non_bytes_data(storage, data):
    writer = storage.create_writer("op", KG)
    with pytest.raises(TypeError, match="bytes"):
        writer.append(4, data)


def test_bytes_like_data_is_accepted(storage, sut):
    writer = storage.create_writer("op", KG)
    writer.append(4, bytearray(b"ba"))
    writer.append(5, memoryview(b"mv"))
    assert read_data(storage, persist(writer, 0, 1, sut.timeout)) == [b"ba", b"mv"]


def test_bytes_like_data_is_framed_by_its_bytes_not_its_items(storage, sut):
    """Typed views and arrays: a change is its bytes, however many items they hold."""
    values = [
        array.array("i", [1, -2, 3]),  # 3 items, 12 bytes
        memoryview(array.array("d", [0.5, 1.5])),  # 2 items, 16 bytes
        memoryview(b"abcdefgh").cast("I"),  # 2 items, 8 bytes
        memoryview(b"0123456789")[2:7],  # a slice
        b"last",
    ]
    writer = storage.create_writer("op", KG)
    for value in values:
        writer.append(4, value)
    assert read_data(storage, persist(writer, 0, 1, sut.timeout)) == [memoryview(v).tobytes() for v in values]


def test_the_caller_may_reuse_its_buffer_once_append_returns(storage, sut):
    """What is stored is what the buffer held at ``append``, whatever the caller does with it after."""
    writer = storage.create_writer("op", KG)
    buffer = bytearray(b"first")
    writer.append(4, buffer)
    buffer[:] = b"FIRST"
    view_source = bytearray(b"second")
    writer.append(5, memoryview(view_source))
    view_source[0:6] = b"SECOND"
    numbers = array.array("B", b"third")
    writer.append(6, numbers)
    numbers[0] = ord("T")
    handle = persist(writer, 0, 1, sut.timeout)
    buffer[:] = b"after"
    assert read_data(storage, handle) == [b"first", b"second", b"third"]


@pytest.mark.parametrize("start", [-1, -100, True, "0", 1.5])
def test_bad_start_sqn(storage, start):
    writer = storage.create_writer("op", KG)
    writer.append(4, b"kept")
    with pytest.raises((ValueError, TypeError), match="start_sqn"):
        writer.persist(start, 1)


@pytest.mark.parametrize("epoch", [-1, "1", 1.5, True])
def test_bad_epoch(storage, epoch):
    with pytest.raises((ValueError, TypeError), match="epoch"):
        storage.create_writer("op", KG, epoch=epoch)


@pytest.mark.parametrize("checkpoint_id", [-1, "1", 1.5])
def test_bad_checkpoint_id(storage, checkpoint_id):
    writer = storage.create_writer("op", KG)
    writer.append(4, b"kept")
    with pytest.raises((ValueError, TypeError), match="checkpoint_id"):
        writer.persist(0, checkpoint_id)


def test_checkpoint_zero_is_a_checkpoint(storage, sut):
    writer = storage.create_writer("op", KG)
    writer.append(4, b"first")
    handle = persist(writer, 0, 0, sut.timeout)
    assert read_data(storage, handle) == [b"first"]


def test_epoch_zero_is_the_default_and_a_valid_epoch(storage, sut):
    default = storage.create_writer("default", KG)
    zero = storage.create_writer("zero", KG, epoch=0)
    for writer in (default, zero):
        writer.append(4, b"z")
        handle = persist(writer, 0, 1, sut.timeout)
        assert handle.epoch == 0
        assert read_data(storage, handle) == [b"z"]


@pytest.mark.parametrize(
    "operator_id", ["../escape", "a/b", "/abs", "", ".hidden", "x" * 500, "a\x00b", "a..b"]
)
def test_operator_ids_that_would_escape_are_rejected(storage, operator_id):
    with pytest.raises(InvalidIdentifierError):
        storage.create_writer(operator_id, KG)


def test_use_after_close(storage):
    writer = storage.create_writer("op", KG)
    writer.append(4, b"x")
    writer.close()
    for call in (
        lambda: writer.append(4, b"y"),
        lambda: writer.append_meta(b"m"),
        lambda: writer.persist(0, 1),
    ):
        with pytest.raises(ClosedError, match="closed"):  # the error says what is wrong
            call()


def test_create_writer_after_storage_close(sut):
    storage = sut.open()
    storage.close()
    with pytest.raises(ClosedError, match="closed"):
        storage.create_writer("op", KG)


def test_failed_call_loses_nothing(storage, sut):
    writer = storage.create_writer("op", KG)
    writer.append(4, b"kept")
    with pytest.raises(ValueError):
        writer.append(99, b"rejected")
    with pytest.raises(TypeError):
        writer.append(5, "rejected")
    writer.append(5, b"also kept")
    assert read_data(storage, persist(writer, 0, 1, sut.timeout)) == [b"kept", b"also kept"]


_HOSTILE_VALUES = [None, "abc", -1, 1 << 40, 1 << 62, 1 << 63, 1 << 80, 1.5, True, [1], {"a": 1}]


def _with_location_field(handle, field, value):
    doc = handle.to_dict()
    location = doc["locations"][0]
    if value is None:
        location.pop(field, None)
    else:
        location[field] = value
    return doc


def test_hostile_location_fields_give_dstl_errors(storage, sut):
    """Every location field, missing or out of range: only DstlError escapes a read and a discard."""
    writer = storage.create_writer("op", KG)
    writer.append(4, b"intact")
    handle = persist(writer, 0, 1, sut.timeout)
    forged = []
    for field in sorted(handle.location_dicts[0]):
        for value in _HOSTILE_VALUES:
            try:
                forged.append(
                    (field, value, ChangelogHandle.from_dict(_with_location_field(handle, field, value)))
                )
            except DstlError:
                continue  # refused on load: fine
    escapes = []
    for action in ("read", "discard"):  # reads first: a discard may legitimately free the original
        for field, value, bad in forged:
            try:
                if action == "read":
                    got = read_data(storage, bad)
                    # A valid SQN outside the handle's range is ranged out: nothing to read.
                    ranged_out = field == "sqn" and type(value) is int and value >= 1 and got == []
                    if not ranged_out and (field == "sqn" or got != [b"intact"]):
                        escapes.append((field, value, action, f"returned {got!r:.60}"))
                else:
                    storage.discard([bad])
            except DstlError as exc:
                if not (exc.args and isinstance(exc.args[0], str) and exc.args[0].strip()):
                    escapes.append((field, value, action, f"{type(exc).__name__} without a message"))
            except Exception as exc:
                escapes.append((field, value, action, f"{type(exc).__name__}: {exc}"[:120]))
    assert not escapes, escapes


def test_location_limits_are_exact(storage, sut):
    """A location's numbers are checked against their limits before any byte is touched.

    Past a limit (negative, 2^63 and beyond; a length of 0 or 2^31) the read fails
    with InvalidHandleError naming the field; at a limit the location passes the
    check, and the read fails only because nothing is stored there.
    """
    writer = storage.create_writer("op", KG)
    writer.append(4, b"intact")
    handle = persist(writer, 0, 1, sut.timeout)
    location = handle.location_dicts[0]
    numbers = [f for f, v in sorted(location.items()) if type(v) is int and f != "sqn"]
    beyond = {field: (-1, 1 << 63) for field in numbers}
    at_limit = {}
    if {"offset", "length"} <= set(location):  # the SPI's offset/length fields (a storage's own
        # fields have limits of their own): an offset up to 2^63-1, a change set of 1 byte to 2 GiB
        beyond["length"] = (0, 1 << 31)
        at_limit = {"offset": ((1 << 63) - 1,), "length": (1, (1 << 31) - 1)}
    for field, values in beyond.items():
        for value in values:
            with pytest.raises(InvalidHandleError, match=field) as info:  # on load or on read
                read_data(storage, ChangelogHandle.from_dict(_with_location_field(handle, field, value)))
            assert_explained(info.value)
    for field, values in at_limit.items():
        for value in values:
            edge = ChangelogHandle.from_dict(_with_location_field(handle, field, value))
            try:
                got = read_data(storage, edge)
            except InvalidHandleError as exc:
                raise AssertionError(f"{field}={value} is within its limits: {exc}") from exc
            except DstlError:
                continue  # nothing stored there: the read fails, past the check
            assert got == [b"intact"] or field == "length", f"{field}={value} read {got!r:.60}"
