"""Decompression bombs: a few stored KB never cost gigabytes, under a capped address space.

The bombs are the ones a hostile tester built: an ~8 KB snapshot section holding a
msgpack array of 268M empty arrays (and one of 4096 arrays of 4096), and a ~32 KB
change set whose zstd body declares and holds 1 GiB.
"""

from __future__ import annotations

import io
import struct

import google_crc32c
import msgpack
import pytest
import zstandard

from dstl.backend.materialization.format import MAX_SECTION_BYTES, read_sections, write_snapshot
from dstl.spi import CorruptedError, KeyGroupRange
from dstl.spi.kit import decode_change_set, encode_change_set
from dstl.spi.kit.changeset_format import forge_change_set
from tests.fuzz.oracle import bounded_memory

_CHUNK = 1 << 20


def _zstd_of_repeated(head: bytes, unit: bytes, count: int) -> bytes:
    """A zstd frame (declaring its size) of ``head`` then ``unit`` ``count`` times, built in chunks."""
    out = io.BytesIO()
    size = len(head) + len(unit) * count
    with zstandard.ZstdCompressor(level=3).stream_writer(out, size=size, closefd=False) as writer:
        writer.write(head)
        block = unit * (_CHUNK // len(unit))
        left = count
        while left:
            step = min(left, len(block) // len(unit))
            writer.write(block[: step * len(unit)])
            left -= step
    return out.getvalue()


def _snapshot_with_section(stored: bytes, raw_length: int) -> bytes:
    """A valid version-2 zstd snapshot whose one section is ``stored`` (checksummed, indexed)."""
    valid = write_snapshot({0: [["s", b"k", b"v"]]}, {"sqn": 1, "registrations": {}}, "zstd")
    preamble = valid[:8]
    section = stored + struct.pack("<I", google_crc32c.value(stored))
    meta = b'{"registrations": {}, "sqn": 1}'
    index = struct.pack("<iQII", 0, 8, len(section), raw_length)
    meta_offset = 8 + len(section)
    crc = google_crc32c.value(meta + index)
    trailer = struct.pack("<QIII4s", meta_offset, len(meta), 1, crc, b"DSTE")
    return preamble + section + meta + index + trailer


def _read(snapshot: bytes) -> None:
    _, sections = read_sections(
        lambda start, end: snapshot[start:end], KeyGroupRange(0, 8), where="bomb", size=len(snapshot)
    )
    list(sections)


@pytest.mark.parametrize(
    ("shape", "head", "unit", "count"),
    [
        # an array32 of 268M empty arrays: 256 MiB raw, ~8 KB stored
        ("flat", b"\xdd" + struct.pack(">I", MAX_SECTION_BYTES - 5), b"\x90", MAX_SECTION_BYTES - 5),
        # 4096 arrays of 4096 empty arrays each: every array short, millions in all
        ("nested", b"\xdc\x10\x00", b"\xdc\x10\x00" + b"\x90" * 4096, 4096),
    ],
)
def test_a_snapshot_section_bomb_is_corruption_not_memory_exhaustion(shape, head, unit, count):
    stored = _zstd_of_repeated(head, unit, count)
    raw_length = len(head) + len(unit) * count
    assert len(stored) < 64 << 10 and raw_length <= MAX_SECTION_BYTES
    snapshot = _snapshot_with_section(stored, raw_length)
    with bounded_memory(), pytest.raises(CorruptedError, match="does not decode"):
        _read(snapshot)


def test_a_change_set_whose_zstd_body_holds_a_gigabyte_is_refused_before_it_is_inflated():
    stored = _zstd_of_repeated(b"", b"\0" * 4096, (1 << 30) // 4096)
    assert len(stored) < 64 << 10
    frame = forge_change_set("op.kg0-8", 1, 0, 1, stored, flags=2)
    with bounded_memory(), pytest.raises(CorruptedError, match="decompression bomb"):
        decode_change_set(frame, 0, location="bomb")


def test_writers_never_store_what_readers_would_refuse():
    # a run of one byte compresses thousands of times: stored plain, it reads back
    frame = encode_change_set("op.kg0-8", 1, 0, [(0, b"\0" * (8 << 20))], codec="zstd")
    assert len(frame) > 8 << 20
    assert decode_change_set(frame, 0, location="plain").changes == [(0, b"\0" * (8 << 20))]
    # ordinary change data is stored compressed
    varied = b"".join(msgpack.packb([0, 1, f"user-{n}".encode(), n]) for n in range(20_000))
    small = encode_change_set("op.kg0-8", 1, 0, [(0, varied)], codec="zstd")
    assert len(small) < len(varied) // 2
    assert decode_change_set(small, 0, location="zstd").changes == [(0, varied)]
