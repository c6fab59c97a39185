"""One uploaded object: the change sets of many writers, each addressable by offset.

Layout (little-endian)::

    magic "DSTB" | version u8 | flags u8 | reserved u16 | count u32 | crc32c u32
    index: count x (offset u64 | length u32)          (covered by the crc)
    change sets, sorted by (log, SQN), in the shared checksummed format

Flag 1 marks compressed change sets. Each change set carries its own checksum,
so a reader that fetches one by offset verifies it without the rest.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import google_crc32c

from dstl.spi import CorruptedError

MAGIC = b"DSTB"
VERSION = 1
FLAG_COMPRESSED = 1
_HEADER = struct.Struct("<4sBBHII")
_ENTRY = struct.Struct("<QI")
HEADER_SIZE = _HEADER.size


def build_object(change_sets: Sequence[bytes], *, compressed: bool) -> tuple[bytes, list[int]]:
    """The object bytes and the offset of each change set in it."""
    start = HEADER_SIZE + _ENTRY.size * len(change_sets)
    offsets = []
    position = start
    for blob in change_sets:
        offsets.append(position)
        position += len(blob)
    index = b"".join(_ENTRY.pack(o, len(b)) for o, b in zip(offsets, change_sets, strict=True))
    flags = FLAG_COMPRESSED if compressed else 0
    crc = google_crc32c.value(_HEADER.pack(MAGIC, VERSION, flags, 0, len(change_sets), 0)[:-4] + index)
    header = _HEADER.pack(MAGIC, VERSION, flags, 0, len(change_sets), crc)
    return b"".join([header, index, *change_sets]), offsets


def index_size(header: bytes, *, location: str) -> int:
    """Bytes of header + index, read from the first :data:`HEADER_SIZE` bytes."""
    magic, version, _flags, _reserved, count, _crc = _parse_header(header, location)
    return HEADER_SIZE + _ENTRY.size * count


def read_index(head: bytes, *, location: str) -> list[tuple[int, int]]:
    """``(offset, length)`` of every change set, from the object's first bytes."""
    magic, version, flags, reserved, count, crc = _parse_header(head, location)
    end = HEADER_SIZE + _ENTRY.size * count
    if len(head) < end:
        msg = "object index truncated"
        raise CorruptedError(msg, location=location, offset=HEADER_SIZE)
    index = head[HEADER_SIZE:end]
    if google_crc32c.value(head[: HEADER_SIZE - 4] + index) != crc:
        msg = "object index checksum mismatch"
        raise CorruptedError(msg, location=location, offset=0)
    return [_ENTRY.unpack_from(index, i * _ENTRY.size) for i in range(count)]


def _parse_header(head: bytes, location: str) -> tuple[bytes, int, int, int, int, int]:
    if len(head) < HEADER_SIZE:
        msg = "object header truncated"
        raise CorruptedError(msg, location=location, offset=0)
    fields = _HEADER.unpack_from(head, 0)
    if fields[0] != MAGIC or fields[1] != VERSION:
        msg = f"not a dstl change-set object (magic {fields[0]!r}, version {fields[1]})"
        raise CorruptedError(msg, location=location, offset=0)
    return fields
