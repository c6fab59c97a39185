"""Forged change sets: whatever a checksummed change set claims, a reader reports it or reads it right.

Anyone who can write an object can checksum it, and a bug in a writer of another
release produces the same: a change set whose count, flags, lengths or zstd frame
lie under a valid checksum. Each forgery below is stored through the backdoor
(behind padding, so the reported offset is checked too) and read through every
read path: it raises :class:`CorruptedError` naming where, before returning any
change of it. Bodies that earlier releases wrote (zlib) read back exactly.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import pytest
import zstandard

from dstl.conformance import requires
from dstl.conformance.testing import assert_explained, persist
from dstl.spi import ChangelogHandle, CorruptedError, KeyGroupRange
from dstl.spi.kit.changeset_format import CHANGE_ITEM, CHANGE_SET_HEADER_SIZE, forge_change_set

KG = KeyGroupRange(0, 4)
CHANGES = [(0, b"alpha"), (1, b""), (3, b"gamma" * 20)]
ZLIB, ZSTD = 1, 2  # the format's flags: pinned here, as an earlier release wrote them
MAX_RATIO = 256  # the format's bound on a body over its stored size: no writer stores more, so more is a bomb

pytestmark = requires("forgery_injection")


def _body(changes: list[tuple[int, bytes]]) -> bytes:
    return b"".join(CHANGE_ITEM.pack(key_group, len(data)) + data for key_group, data in changes)


def _zstd_declaring(body: bytes, declared: int) -> bytes:
    """A zstd frame of ``body`` whose header declares ``declared`` bytes of content."""
    frame = bytearray(zstandard.ZstdCompressor(write_content_size=True).compress(body))
    assert frame[4] & 0xE0 == 0x20, "expected a single-segment frame with a one-byte content size"
    frame[5] = declared
    return bytes(frame)


def _zeros_at_ratio(extra: int) -> tuple[bytes, bytes]:
    """``(body, zstd frame)``: one change of zeros, the body ``MAX_RATIO`` times the frame plus ``extra``."""
    compressor = zstandard.ZstdCompressor(write_content_size=True)
    for size in range(8, 200):  # the frame's size barely moves with the body's: find where they meet
        length = MAX_RATIO * size + extra - CHANGE_ITEM.size
        body = CHANGE_ITEM.pack(0, length) + bytes(length)
        stored = compressor.compress(body)
        if len(stored) == size:
            return body, stored
    raise AssertionError(f"no zstd frame of zeros is exactly 1/{MAX_RATIO} of its body (+{extra})")


def _forgeries(log_id: str, epoch: int, sqn: int) -> dict[str, bytes]:
    """Each hostile change set of the handle's log, epoch and SQN, by what it lies about."""
    body = _body(CHANGES)
    count = len(CHANGES)
    last_length_at = len(body) - len(CHANGES[-1][1]) - CHANGE_ITEM.size + 4  # the last item's u32 length

    def frame(stored: bytes, **fields) -> bytes:
        values = {"log_id": log_id, "epoch": epoch, "sqn": sqn, "count": count, **fields}
        return forge_change_set(values.pop("log_id"), stored_body=stored, **values)

    honest = frame(body)
    longer = bytearray(body)
    longer[last_length_at] += 1
    return {
        "header cut short": honest[: CHANGE_SET_HEADER_SIZE - 1],
        "nothing but a header": honest[:CHANGE_SET_HEADER_SIZE],
        "body cut short": honest[:-1],
        "wrong magic": frame(body, magic=b"DSTX"),
        "newer version": frame(body, version=2),
        "unknown flags": frame(body, flags=4),
        "both codec flags": frame(body, flags=ZLIB | ZSTD),
        "count too high": frame(body, count=count + 1),
        "count too low": frame(body, count=count - 1),
        "change longer than the body": frame(bytes(longer)),
        "log id not UTF-8": frame(body, log_id=b"\xff" * len(log_id)),
        "another log": frame(body, log_id=log_id + "x"),
        "another epoch": frame(body, epoch=epoch + 1),
        "another SQN": frame(body, sqn=sqn + 1),
        "zstd frame without a content size": frame(
            zstandard.ZstdCompressor(write_content_size=False).compress(body), flags=ZSTD
        ),
        "zstd frame declaring less": frame(_zstd_declaring(body, len(body) - 1), flags=ZSTD),
        "zstd frame declaring more": frame(_zstd_declaring(body, len(body) + 1), flags=ZSTD),
        "zstd frame one byte over the bound": frame(_zeros_at_ratio(1)[1], flags=ZSTD, count=1),
        "zstd frame cut short": frame(_zstd_declaring(body, len(body))[:-3], flags=ZSTD),
        "zstd frame with trailing bytes": frame(_zstd_declaring(body, len(body)) + b"tail", flags=ZSTD),
        "not a zstd frame": frame(body, flags=ZSTD),
        "zlib stream cut short": frame(zlib.compress(body)[:-4], flags=ZLIB),
        "zlib stream with trailing bytes": frame(zlib.compress(body) + b"tail", flags=ZLIB),
        "not a zlib stream": frame(body, flags=ZLIB),
    }


def _read_paths(storage) -> dict[str, Callable[[ChangelogHandle], list]]:
    """Every way to read a handle; each returns what it yielded before it raised."""

    def via(read: Callable) -> Callable[[ChangelogHandle], list]:
        def run(handle: ChangelogHandle) -> list:
            returned: list = []
            reader = storage.create_reader()
            try:
                for item in read(reader, handle):
                    returned.append(item)
            except CorruptedError as exc:
                exc.returned = returned  # type: ignore[attr-defined]
                raise
            finally:
                reader.close()
            return returned

        return run

    return {
        "read": via(lambda reader, handle: reader.read(handle)),
        "read filtered": via(lambda reader, handle: reader.read(handle, KeyGroupRange(0, 2))),
        "read_change_sets": via(lambda reader, handle: reader.read_change_sets(handle)),
        "read_change_sets filtered": via(
            lambda reader, handle: reader.read_change_sets(handle, KeyGroupRange(0, 2))
        ),
    }


@pytest.fixture
def honest(storage, sut):
    """A handle of one change set of :data:`CHANGES`, to forge others of its log, epoch and SQN."""
    writer = storage.create_writer("op", KG, epoch=7)
    for key_group, data in CHANGES:
        writer.append(key_group, data)
    handle = persist(writer, 0, 1, sut.timeout)
    assert len(handle.location_dicts) == 1, "forge() needs a handle of one change set"
    return handle


@pytest.mark.parametrize("lie", sorted(_forgeries("op", 0, 0)))
def test_a_forged_change_set_is_reported_where_it_lies_and_nothing_of_it_returned(storage, sut, honest, lie):
    backdoor = sut.require_backdoor()
    data = _forgeries(honest.log_id, honest.epoch, honest.sqn_range.start)[lie]
    forged, offset = backdoor.forge(storage, honest, data)
    for path, read in _read_paths(storage).items():
        with pytest.raises(CorruptedError) as info:
            read(forged)
        assert not info.value.returned, f"{path} returned changes of a change set that {lie}"
        assert_explained(info.value)
        assert info.value.offset == offset, (
            f"{path}: a change set that {lie} starts at offset {offset}, the error says {info.value.offset}"
        )


@pytest.mark.parametrize("codec", ["plain", "zlib", "zstd"])
@pytest.mark.parametrize("changes", [CHANGES, []], ids=["changes", "empty"])
def test_a_change_set_in_any_codec_a_release_wrote_reads_back_exactly(storage, sut, honest, codec, changes):
    backdoor = sut.require_backdoor()
    body = _body(changes)
    stored, flags = {
        "plain": (body, 0),
        "zlib": (zlib.compress(body), ZLIB),  # earlier releases
        "zstd": (zstandard.ZstdCompressor(write_content_size=True).compress(body), ZSTD),
    }[codec]
    fields = (honest.log_id, honest.epoch, honest.sqn_range.start, len(changes), stored)
    data = forge_change_set(*fields, flags=flags) if flags else forge_change_set(*fields)  # plain: no flags
    forged, _ = backdoor.forge(storage, honest, data)
    reader = storage.create_reader()
    try:
        read = [(c.key_group, c.data) for c in reader.read(forged)]
        filtered = [(c.key_group, c.data) for c in reader.read(forged, KeyGroupRange(0, 2))]
        sets = list(reader.read_change_sets(forged))
    finally:
        reader.close()
    assert read == changes
    assert filtered == [c for c in changes if c[0] < 2]
    # an empty change set carries nothing: read_change_sets may yield it or leave it out (the SPI's
    # default, built on read, cannot see it), but never under another SQN
    start = honest.sqn_range.start
    held = [(sqn, list(decoded)) for sqn, decoded in sets if decoded]
    assert held == ([(start, changes)] if changes else [])
    assert all(sqn == start for sqn, _ in sets)


def test_a_zstd_frame_at_the_bound_reads_back(storage, sut, honest):
    """A body exactly ``MAX_RATIO`` times its zstd frame is what a writer may store: it reads back."""
    backdoor = sut.require_backdoor()
    body, stored = _zeros_at_ratio(0)
    data = forge_change_set(honest.log_id, honest.epoch, honest.sqn_range.start, 1, stored, flags=ZSTD)
    forged, _ = backdoor.forge(storage, honest, data)
    reader = storage.create_reader()
    try:
        read = [(change.key_group, change.data) for change in reader.read(forged)]
    finally:
        reader.close()
    assert read == [(0, bytes(len(body) - CHANGE_ITEM.size))]
