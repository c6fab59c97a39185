"""Binary form of one change set, shared by storages: self-describing and checksummed.

Layout (little-endian)::

    magic "DSTC" | version u8 | flags u8 | log_id length u16 | epoch u64 | sqn u64
    | change count u32 | body length u32 | crc32c u32
    log_id (utf-8)
    body: count x (key_group i32 | data length u32 | data)
          compressed as one zstd frame (declaring its size) when flags & 2,
          as zlib when flags & 1 (written by earlier releases; still read)

The CRC32C covers the header fields before it, the log id and the stored body, so
a flipped bit anywhere is reported as :class:`~dstl.spi.CorruptedError`.
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import google_crc32c
import zstandard

from ..errors import CorruptedError

__all__ = [
    "CHANGE_ITEM",
    "CHANGE_SET_CODECS",
    "CHANGE_SET_HEADER_SIZE",
    "ChangeSetIdentity",
    "DecodedChangeSet",
    "MAX_COMPRESSION_RATIO",
    "decode_body",
    "decode_change_set",
    "change_set_identity",
    "encode_change_set",
    "forge_change_set",
    "frame_change_set",
    "framed_size",
    "iter_change_sets",
]

_MAGIC = b"DSTC"
_VERSION = 1
_FLAG_ZLIB = 1
_FLAG_ZSTD = 2
#: A body is stored plain, as a zlib stream (written by earlier releases) or as one zstd frame.
_KNOWN_FLAGS = (0, _FLAG_ZLIB, _FLAG_ZSTD)
#: Compression a writer may choose for change-set bodies (``dstl.changelog.compression``).
CHANGE_SET_CODECS = ("zstd", "none")
#: A body, decompressed, may not be larger than an uncompressed body could be (its length is a u32).
_MAX_BODY = 0xFFFFFFFF
#: A compressed body decodes to at most this many times its stored size. Writers store a body
#: plain when it compresses better (rare: only runs of the same bytes do), so readers can refuse
#: a frame that declares more: a few stored bytes never cost gigabytes (a decompression bomb).
MAX_COMPRESSION_RATIO = 256
_ZSTD_CHUNK = 1 << 20
_ZSTD_LEVEL = 1  # the fastest level: a persist waits for it, and change data compresses well anyway
_HEADER = struct.Struct("<4sBBHQQII")
_CRC = struct.Struct("<I")
_ITEM = struct.Struct("<iI")
#: Framing of one change inside a body: key group (i32) and data length (u32).
CHANGE_ITEM = _ITEM
CHANGE_SET_HEADER_SIZE = _HEADER.size + _CRC.size
_local = threading.local()


@dataclass(frozen=True, slots=True)
class DecodedChangeSet:
    """A verified change set: its log, writer epoch, SQN and ``(key_group, data)`` pairs."""

    log_id: str
    epoch: int
    sqn: int
    changes: list[tuple[int, bytes]]
    stored_size: int


def encode_change_set(
    log_id: str,
    epoch: int,
    sqn: int,
    changes: Sequence[tuple[int, bytes]],
    *,
    codec: str = "none",
) -> bytes:
    """Encode ``changes`` (in append order) as one checksummed change set."""
    parts: list[bytes] = []
    for key_group, data in changes:
        parts.append(_ITEM.pack(key_group, len(data)))
        parts.append(data)
    return frame_change_set(log_id, epoch, sqn, len(changes), b"".join(parts), codec=codec)


def frame_change_set(
    log_id: str, epoch: int, sqn: int, count: int, body: bytes | bytearray, *, codec: str = "none"
) -> bytes:
    """Frame an already encoded body (``count`` items of :data:`CHANGE_ITEM` + data).

    :param codec: one of :data:`CHANGE_SET_CODECS`. A compressed body is stored only
        when it is smaller than the plain one, and no more than
        :data:`MAX_COMPRESSION_RATIO` times smaller.
    """
    flags = 0
    if codec == "zstd":
        packed = _compressor().compress(body)
        if len(packed) < len(body) <= len(packed) * MAX_COMPRESSION_RATIO:
            body, flags = packed, _FLAG_ZSTD
    elif codec != "none":
        msg = f"unknown change-set codec {codec!r}: one of {', '.join(CHANGE_SET_CODECS)}"
        raise ValueError(msg)
    return forge_change_set(log_id, epoch, sqn, count, body, flags=flags)


def forge_change_set(
    log_id: str | bytes,
    epoch: int,
    sqn: int,
    count: int,
    stored_body: bytes | bytearray,
    *,
    flags: int = 0,
    magic: bytes = _MAGIC,
    version: int = _VERSION,
) -> bytes:
    """Frame ``stored_body`` exactly as given, under a valid checksum, whatever the fields say.

    What :func:`frame_change_set` stores, without its care: anyone who can write an
    object can checksum it, so a reader must survive every field lying (the count,
    the flags, the body's own framing, a log id that is not UTF-8). Tests build
    hostile change sets with it.
    """
    log = log_id.encode() if isinstance(log_id, str) else log_id
    header = _HEADER.pack(magic, version, flags, len(log), epoch, sqn, count, len(stored_body))
    crc = google_crc32c.extend(google_crc32c.extend(google_crc32c.value(header), log), stored_body)
    return b"".join((header, _CRC.pack(crc), log, stored_body))


def framed_size(header: bytes | memoryview, *, location: str, offset: int = 0) -> int:
    """The stored size of the change set whose first :data:`CHANGE_SET_HEADER_SIZE` bytes are ``header``.

    Lets a storage check a length it is given (in a handle) against what it wrote,
    without reading the body.

    :raises CorruptedError: when ``header`` is short or is not a change-set header.
    """
    if len(header) < CHANGE_SET_HEADER_SIZE:
        msg = "change set header truncated"
        raise CorruptedError(msg, location=location, offset=offset)
    magic, version, _flags, log_len, _epoch, _sqn, _count, body_len = _HEADER.unpack_from(header, 0)
    if magic != _MAGIC or version != _VERSION:
        msg = "no change-set header"
        raise CorruptedError(msg, location=location, offset=offset)
    return CHANGE_SET_HEADER_SIZE + log_len + body_len


@dataclass(frozen=True, slots=True)
class ChangeSetIdentity:
    """Whose a stored change set is, as its header says: log, writer epoch and SQN."""

    log_id: str
    epoch: int
    sqn: int

    def differs_from(self, log_id: str, epoch: int, sqn: object = None) -> str | None:
        """Why this change set is not the one a handle names (``None`` when it is).

        :param sqn: the SQN the handle's location records, if it records one.
        """
        if self.log_id != log_id:
            return f"it belongs to log {self.log_id!r:.80}, not {log_id!r}"
        if self.epoch != epoch:
            return f"it was written with epoch {self.epoch}, not {epoch}"
        if sqn is not None and sqn != self.sqn:
            return f"it holds SQN {self.sqn}, not {sqn}"
        return None


def change_set_identity(head: bytes | memoryview, *, location: str, offset: int = 0) -> ChangeSetIdentity:
    """The identity in the header at the start of ``head`` (header and log id, the body is not needed).

    Lets a storage check, before it frees a change set a handle names, that the
    change set belongs to the handle's log (the body's checksum is not verified:
    a discard must not cost a read of the body).

    :raises CorruptedError: when ``head`` holds no whole header and log id.
    """
    framed_size(head, location=location, offset=offset)
    _, _, _, log_len, epoch, sqn, _, _ = _HEADER.unpack_from(head, 0)
    log_id = bytes(head[CHANGE_SET_HEADER_SIZE : CHANGE_SET_HEADER_SIZE + log_len])
    if len(log_id) < log_len:
        msg = "change set header truncated in its log id"
        raise CorruptedError(msg, location=location, offset=offset)
    return ChangeSetIdentity(log_id.decode(errors="replace"), epoch, sqn)


def decode_change_set(
    buf: bytes | memoryview,
    offset: int,
    *,
    location: str,
    base_offset: int = 0,
    key_groups: tuple[int, int] | None = None,
) -> DecodedChangeSet:
    """Decode and verify the change set that starts at ``offset`` of ``buf``.

    :param base_offset: position of ``buf`` in the stored object, added to the
        offset that errors report.
    :param key_groups: ``(start, end)``: keep only changes of those key groups and
        metadata records (the whole body is still verified).
    :raises CorruptedError: naming ``location`` and the offset on any damage,
        including a buffer that ends inside the change set.
    """
    try:
        return _decode(memoryview(buf), offset, location, key_groups)
    except CorruptedError as exc:
        if not base_offset:
            raise
        message = str(exc).rsplit(" (", 1)[0]
        raise CorruptedError(message, location=location, offset=base_offset + offset) from exc


def _decode(
    view: memoryview, offset: int, location: str, key_groups: tuple[int, int] | None
) -> DecodedChangeSet:
    end_header = offset + _HEADER.size
    if offset < 0 or end_header + _CRC.size > len(view):
        msg = "change set header truncated"
        raise CorruptedError(msg, location=location, offset=offset)
    magic, version, flags, log_len, epoch, sqn, count, body_len = _HEADER.unpack_from(view, offset)
    if magic != _MAGIC:
        msg = "bad change-set magic"
        raise CorruptedError(msg, location=location, offset=offset)
    if version != _VERSION:
        msg = f"unsupported change-set version {version}"
        raise CorruptedError(msg, location=location, offset=offset)
    (crc,) = _CRC.unpack_from(view, end_header)
    log_start = end_header + _CRC.size
    body_start = log_start + log_len
    body_end = body_start + body_len
    if body_end > len(view):
        msg = "change set truncated"
        raise CorruptedError(msg, location=location, offset=offset)
    actual = google_crc32c.extend(
        google_crc32c.value(bytes(view[offset:end_header])), bytes(view[log_start:body_end])
    )
    if actual != crc:
        msg = "change-set checksum mismatch"
        raise CorruptedError(msg, location=location, offset=offset)
    if flags not in _KNOWN_FLAGS:
        msg = f"unknown change-set flags {flags:#04x} (a codec of a newer release?)"
        raise CorruptedError(msg, location=location, offset=offset)
    try:
        log_id = bytes(view[log_start:body_start]).decode()
        body = bytes(view[body_start:body_end])
        if flags == _FLAG_ZSTD:
            body = _zstd_body(body)
        elif flags == _FLAG_ZLIB:
            body = _zlib_body(body)
    except (UnicodeDecodeError, zlib.error, zstandard.ZstdError) as exc:
        msg = f"change set undecodable after checksum: {exc}"
        raise CorruptedError(msg, location=location, offset=offset) from exc
    changes = _items(body, count, location, offset, key_groups)
    return DecodedChangeSet(log_id, epoch, sqn, changes, body_end - offset)


def _compressor() -> zstandard.ZstdCompressor:
    """This thread's compressor (a ``ZstdCompressor`` is not thread-safe; making one costs ~10 µs)."""
    compressor = getattr(_local, "zstd", None)
    if compressor is None:
        compressor = _local.zstd = zstandard.ZstdCompressor(level=_ZSTD_LEVEL, write_content_size=True)
    return compressor


def _zstd_body(stored: bytes) -> bytes:
    """The body in a zstd frame, at most the size its frame declares (and no more than a body may be).

    The checksum does not make a body trustworthy (anyone who can write the object
    can checksum it), so a frame's declared size bounds what is allocated.
    """
    declared = zstandard.frame_content_size(stored)
    if declared < 0 or declared > _MAX_BODY:
        msg = f"zstd frame declares no usable content size ({declared})"
        raise zstandard.ZstdError(msg)
    if declared > len(stored) * MAX_COMPRESSION_RATIO:
        msg = (
            f"zstd frame of {len(stored)} bytes declares {declared}: more than {MAX_COMPRESSION_RATIO} "
            "times its size, which no writer stores (a decompression bomb)"
        )
        raise zstandard.ZstdError(msg)
    # Streamed: memory follows what the frame really holds, not what it claims (a forged
    # small frame declaring 4 GiB allocates nothing).
    parts, total = [], 0
    with zstandard.ZstdDecompressor().stream_reader(stored) as reader:
        while chunk := reader.read(_ZSTD_CHUNK):
            total += len(chunk)
            if total > declared:
                msg = f"zstd frame holds more than the {declared} bytes it declares"
                raise zstandard.ZstdError(msg)
            parts.append(chunk)
    if total != declared:
        msg = f"zstd frame holds {total} bytes, declares {declared}"
        raise zstandard.ZstdError(msg)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _zlib_body(stored: bytes) -> bytes:
    """The body in a zlib stream, no larger than a body may be (deflate itself expands ~1032x at most)."""
    inflater = zlib.decompressobj()
    body = inflater.decompress(stored, min(_MAX_BODY, len(stored) * 1032 + 64))
    if inflater.unconsumed_tail or not inflater.eof:
        msg = "zlib stream longer than a change-set body may be, or cut short"
        raise zlib.error(msg)
    if inflater.unused_data:
        msg = f"{len(inflater.unused_data)} bytes follow the zlib stream"
        raise zlib.error(msg)
    return body


def decode_body(body: bytes, count: int) -> list[tuple[int, bytes]]:
    """The ``(key_group, data)`` pairs of an unframed body (trusted, in-memory)."""
    return _items(body, count, "in-memory body", 0)


def _items(
    body: bytes, count: int, location: str, offset: int, window: tuple[int, int] | None = None
) -> list[tuple[int, bytes]]:
    # The restore path runs this once per change: locals only, one pass, filtering included.
    lowest, highest = window if window is not None else (-(1 << 31), 1 << 31)
    changes: list[tuple[int, bytes]] = []
    append = changes.append
    unpack = _ITEM.unpack_from
    item_size = _ITEM.size
    end = len(body)
    pos = 0
    for _ in range(count):
        if pos + item_size > end:
            msg = "change-set body shorter than its change count"
            raise CorruptedError(msg, location=location, offset=offset)
        key_group, length = unpack(body, pos)
        pos += item_size
        stop = pos + length
        if stop > end:
            msg = "change length runs past the change-set body"
            raise CorruptedError(msg, location=location, offset=offset)
        if lowest <= key_group < highest or key_group < 0:  # metadata records (< 0) always
            append((key_group, body[pos:stop]))
        pos = stop
    if pos != end:
        msg = "trailing bytes in change-set body"
        raise CorruptedError(msg, location=location, offset=offset)
    return changes


def iter_change_sets(buf: bytes | memoryview, *, location: str) -> Iterator[DecodedChangeSet]:
    """Decode every change set stored back to back in ``buf``."""
    offset = 0
    while offset < len(buf):
        decoded = decode_change_set(buf, offset, location=location)
        yield decoded
        offset += decoded.stored_size
