"""Snapshot objects: one per materialization, checksummed sections per key group.

Version 3, written as a stream (little-endian)::

    magic "DSTM" | version u8 = 3 | codec u8 | reserved 2
    sections: codec(msgpack [[state, [key, ...], [entry, ...](, 1)], ...]) followed by its crc32c u32
    meta (JSON: registrations, SQN)                                } covered by
    index: count x (key group i32 | offset u64 | length u32 |      } the
                    raw length u32)                                } trailer crc
    trailer: meta offset u64 | meta length u32 | section count u32 | crc32c u32 | "DSTE"

The codec (see :mod:`.codecs`) compresses each section on its own; the crc
covers the stored bytes, the raw length bounds decompression. A section holds
*runs* (:mod:`.runs`): the consecutive entries of one state, keys and entries in
two lists. Version 2 is the same object with row-shaped sections, one
``[state, key, entry(, 1)]`` per entry; it is still read.

Sections are written as the state is read, key group by key group (a large key
group in several consecutive sections; a large list or map in parts, each after
the first marked ``1``, which extends the entry), and the index goes last, so a writer
holds one section, never the whole state. Version 1 (index in a header before
the sections, one per key group) is still read::

    magic "DSTM" | version u8 = 1 | reserved 3 | meta length u32 | section count u32 | crc32c u32
    meta | index | sections

A restore of some key groups reads the trailer (or header) and index, then only
its sections.
"""

from __future__ import annotations

import io
import json
import math
import struct
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass
from operator import countOf
from typing import Any, BinaryIO

import google_crc32c
import msgpack

from dstl.spi import CorruptedError, InvalidHandleError, KeyGroupRange
from dstl.spi.kit import check_relative_path

from ..delegate import SECTION_ENTRIES
from ..documents import MAX_DOCUMENT_BYTES, check_fields, parse_json
from ..keygroups import MAX_KEY_GROUPS
from .codecs import CODEC_IDS, CODEC_NAMES, compressor, decompress
from .runs import as_runs, rows_of

_MAGIC = b"DSTM"
_END_MAGIC = b"DSTE"
_PREAMBLE = struct.Struct("<4sBB2x")  # magic, version, codec (versions 2 and 3)
_HEADER = struct.Struct("<4sB3xIII")  # version 1
_TRAILER = struct.Struct("<QIII4s")  # versions 2 and 3
_ENTRY_V1 = struct.Struct("<iQI")
_ENTRY = struct.Struct("<iQII")  # versions 2 and 3: key group, offset, stored length, raw length
_CRC = struct.Struct("<I")
VERSION = 3
#: The most bytes one section may decode to: bounds what a damaged or forged section costs.
MAX_SECTION_BYTES = 256 << 20
#: The most arrays, maps and their elements one version-2 or -3 section decodes to. Writers put at most
#: SECTION_ENTRIES entries (of 3 or 4 items) and SECTION_ENTRIES collection elements in a section,
#: so this is ample; a forged section of millions of tiny arrays (a few KB compressed) is refused
#: before it costs gigabytes.
MAX_SECTION_OBJECTS = 8 * SECTION_ENTRIES
#: The same bound for version-1 sections (one per key group, written before sections were split):
#: it caps the memory of restoring one key group at a few hundred MB.
MAX_V1_SECTION_OBJECTS = 4 << 20


@dataclass(frozen=True)
class MaterializationRef:
    """A snapshot object: where, which key groups, and the log SQN it covers up to."""

    path: str
    key_groups: KeyGroupRange
    sqn: int
    size: int
    entries: int = 0  # entries (or tombstones) it holds: decides when the next one must be full
    #: a full snapshot's TTL clock (epoch s): when it last left expired state out (None: incremental)
    clock: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        doc: dict[str, Any] = {
            "path": self.path,
            "key_groups": [self.key_groups.start, self.key_groups.end],
            "sqn": self.sqn,
            "size": self.size,
            "entries": self.entries,
        }
        if self.clock is not None:
            doc["clock"] = self.clock
        return doc

    @classmethod
    def from_dict(cls, doc: Any) -> MaterializationRef:
        """Validate untrusted JSON."""
        try:
            if not isinstance(doc["path"], str):
                msg = f"path must be a string, got {type(doc['path']).__name__}"
                raise TypeError(msg)
            path = check_relative_path(doc["path"], "snapshot path")
            start, end = doc["key_groups"]
            sqn, size, entries = doc["sqn"], doc["size"], doc.get("entries", 0)
            if not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0
                for v in (start, end, sqn, size, entries)
            ):
                msg = "key groups, sqn, size and entries must be non-negative integers"
                raise TypeError(msg)
            clock = doc.get("clock")
            if clock is not None and (
                isinstance(clock, bool) or not isinstance(clock, int | float) or not math.isfinite(clock)
            ):
                msg = f"clock must be a finite number of seconds, got {clock!r:.40}"
                raise TypeError(msg)
            return cls(path, KeyGroupRange(start, end), sqn, size, entries, clock)
        except (KeyError, TypeError, ValueError) as exc:
            msg = f"invalid materialization reference: {exc}"
            raise InvalidHandleError(msg) from exc


class SnapshotWriter:
    """Writes a snapshot to a binary stream, one key group's section at a time (format version 3).

    :param stream: any writable binary file object (a local file, an fsspec/S3 upload).
    :param codec: section compression, a name of :data:`~.codecs.CODEC_IDS`.
    """

    def __init__(self, stream: BinaryIO, codec: str = "none") -> None:
        self._stream = stream
        self._offset = 0
        self._index: list[bytes] = []
        self._last_key_group: int | None = None
        self._compress = compressor(codec)
        self.entries = 0
        self._write(_PREAMBLE.pack(_MAGIC, VERSION, CODEC_IDS[codec]))

    def _write(self, data: bytes) -> None:
        self._stream.write(data)
        self._offset += len(data)

    def add_section(self, key_group: int, entries: list[list[Any]]) -> None:
        """Append a section of ``key_group`` (``[[state, key, entry], ...]``).

        Key groups never descend; a large key group may take several sections in a row.
        """
        if self._last_key_group is not None and key_group < self._last_key_group:
            msg = f"sections must come in key group order: {key_group} after {self._last_key_group}"
            raise ValueError(msg)
        self._last_key_group = key_group
        raw = msgpack.packb(as_runs(entries), use_bin_type=True)
        if len(raw) > MAX_SECTION_BYTES:
            if len(entries) == 1:
                msg = (
                    f"one entry of key group {key_group} encodes to {len(raw)} bytes, more than a snapshot "
                    f"section holds ({MAX_SECTION_BYTES}): keep single values, lists and maps smaller"
                )
                raise ValueError(msg)
            half = len(entries) // 2
            self.add_section(key_group, entries[:half])
            self.add_section(key_group, entries[half:])
            return
        body = self._compress(raw)
        self._index.append(_ENTRY.pack(key_group, self._offset, len(body) + _CRC.size, len(raw)))
        self._write(body + _CRC.pack(google_crc32c.value(body)))
        self.entries += countOf(map(len, entries), 3)  # parts continuing a collection (4 long): once

    def finish(self, meta: dict[str, Any]) -> int:
        """Write the meta, the index and the trailer; returns the snapshot's size in bytes."""
        meta_bytes = json.dumps(meta, sort_keys=True).encode()
        index_bytes = b"".join(self._index)
        meta_offset = self._offset
        crc = google_crc32c.value(meta_bytes + index_bytes)
        self._write(meta_bytes + index_bytes)
        self._write(_TRAILER.pack(meta_offset, len(meta_bytes), len(self._index), crc, _END_MAGIC))
        return self._offset


def write_snapshot(sections: dict[int, list[list[Any]]], meta: dict[str, Any], codec: str = "none") -> bytes:
    """The snapshot object for ``sections`` (key group -> [[state, key, entry], ...]), in memory."""
    buffer = io.BytesIO()
    writer = SnapshotWriter(buffer, codec)
    for key_group in sorted(sections):
        writer.add_section(key_group, sections[key_group])
    writer.finish(meta)
    return buffer.getvalue()


def _check_counts(count: int, meta_len: int, where: str, max_count: int) -> None:
    if count > max_count or meta_len > MAX_DOCUMENT_BYTES:
        # Checked before reading: a damaged header must not make a restore allocate gigabytes.
        msg = (
            f"snapshot header claims {count} sections and {meta_len} bytes of meta "
            f"(at most {max_count} and {MAX_DOCUMENT_BYTES})"
        )
        raise CorruptedError(msg, location=where, offset=0)


def _v1_head(read_range: Any, where: str) -> tuple[bytes, list[tuple[int, int, int, int]]]:
    """Meta, index and section count of a version-1 snapshot (checked against the header crc)."""
    head = read_range(0, _HEADER.size)
    if len(head) < _HEADER.size:
        msg = "snapshot header truncated"
        raise CorruptedError(msg, location=where, offset=0)
    _, _, meta_len, count, crc = _HEADER.unpack_from(head, 0)
    _check_counts(count, meta_len, where, MAX_KEY_GROUPS)  # version 1: one section per key group
    needed = _HEADER.size + meta_len + _ENTRY_V1.size * count
    head = read_range(0, needed)
    meta_bytes = head[_HEADER.size : _HEADER.size + meta_len]
    index_bytes = head[_HEADER.size + meta_len : needed]
    if len(index_bytes) != _ENTRY_V1.size * count or google_crc32c.value(meta_bytes + index_bytes) != crc:
        msg = "snapshot header checksum mismatch"
        raise CorruptedError(msg, location=where, offset=0)
    index = []
    for i in range(count):  # uncompressed: the raw length is the stored length less its crc
        key_group, offset, length = _ENTRY_V1.unpack_from(index_bytes, i * _ENTRY_V1.size)
        index.append((key_group, offset, length, max(length - _CRC.size, 0)))
    return meta_bytes, index


def _v2_tail(read_range: Any, where: str, size: int | None) -> tuple[bytes, list[tuple[int, int, int, int]]]:
    """Meta, index and section count of a version-2 or -3 snapshot (checked against the trailer crc)."""
    if size is None or size < _PREAMBLE.size + _TRAILER.size:
        msg = f"snapshot of {size} bytes cannot hold a trailer (size unknown or too small)"
        raise CorruptedError(msg, location=where, offset=0)
    tail = read_range(size - _TRAILER.size, size)
    if len(tail) != _TRAILER.size:
        msg = "snapshot trailer truncated (the object is shorter than its reference says)"
        raise CorruptedError(msg, location=where, offset=size - _TRAILER.size)
    meta_offset, meta_len, count, crc, end = _TRAILER.unpack(tail)
    if end != _END_MAGIC:
        msg = f"snapshot trailer damaged (end magic {end!r})"
        raise CorruptedError(msg, location=where, offset=size - _TRAILER.size)
    # Large key groups span several sections, so the count is bounded by what the object can index.
    _check_counts(count, meta_len, where, (size - _PREAMBLE.size - _TRAILER.size) // _ENTRY.size)
    index_end = meta_offset + meta_len + _ENTRY.size * count
    if meta_offset < _PREAMBLE.size or index_end != size - _TRAILER.size:
        msg = "snapshot trailer does not describe the object (offsets out of place)"
        raise CorruptedError(msg, location=where, offset=size - _TRAILER.size)
    block = read_range(meta_offset, index_end)
    meta_bytes, index_bytes = block[:meta_len], block[meta_len:]
    if len(index_bytes) != _ENTRY.size * count or google_crc32c.value(meta_bytes + index_bytes) != crc:
        msg = "snapshot index checksum mismatch"
        raise CorruptedError(msg, location=where, offset=meta_offset)
    return meta_bytes, [_ENTRY.unpack_from(index_bytes, i * _ENTRY.size) for i in range(count)]


class _TooManyObjects(ValueError):
    pass


def _unpack_bounded(body: bytes, budget: int) -> Any:
    """Unpack ``body``, refusing it once its arrays and maps hold more than ``budget`` elements.

    Each container is limited before it is allocated (``max_*_len``), and the hooks
    count every one as it completes: the total is refused early, whatever the nesting.
    """
    spent = 0

    def counted_list(items: list[Any]) -> list[Any]:
        nonlocal spent
        spent += len(items) + 1
        if spent > budget:
            msg = f"section holds more than {budget} arrays, maps and elements"
            raise _TooManyObjects(msg)
        return items

    def counted_map(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
        nonlocal spent
        spent += len(pairs) + 1
        if spent > budget:
            msg = f"section holds more than {budget} arrays, maps and elements"
            raise _TooManyObjects(msg)
        return dict(pairs)

    return msgpack.unpackb(
        body,
        raw=False,
        strict_map_key=False,
        use_list=True,
        list_hook=counted_list,
        object_pairs_hook=counted_map,
        max_array_len=budget,
        max_map_len=budget,
    )


class SnapshotSections:
    """A snapshot's sections of the wanted key groups, each read and verified as it is iterated."""

    def __init__(
        self, read: Callable[[Container[int]], Iterator[tuple[int, list[Any]]]], *, columnar: bool, where: str
    ) -> None:
        self._read = read
        #: the sections hold runs (version 3, :mod:`.runs`), not one row per entry
        self.columnar = columnar
        self._where = where

    def __iter__(self) -> Iterator[tuple[int, list[Any]]]:
        """``(key group, [[state, key, entry(, 1)], ...])`` of every wanted key group's sections, in order."""
        for key_group, body in self._read(()):
            yield key_group, rows_of(body, key_group, self._where) if self.columnar else body

    def excluding(self, key_groups: Container[int]) -> Iterator[tuple[int, list[Any]]]:
        """The sections as stored (runs when :attr:`columnar`) but those of ``key_groups`` (not read)."""
        return self._read(key_groups)


def read_sections(  # noqa: C901 - an untrusted file, checked one field after another
    read_range: Any,
    key_groups: KeyGroupRange,
    *,
    where: str,
    size: int | None = None,
) -> tuple[dict[str, Any], SnapshotSections]:
    """The meta and the sections of ``key_groups`` (each verified); reads only what it needs.

    :param size: the object's size (a reference records it); versions 2 and 3 keep
        their index at the end, so it is required there.
    """
    head = read_range(0, _PREAMBLE.size)
    if len(head) < _PREAMBLE.size:
        msg = "snapshot header truncated"
        raise CorruptedError(msg, location=where, offset=0)
    magic, version, codec = _PREAMBLE.unpack_from(head, 0)
    if magic != _MAGIC:
        msg = f"not a dstl snapshot (magic {magic!r}, version {version})"
        raise CorruptedError(msg, location=where, offset=0)
    if version not in (1, 2, VERSION):
        msg = f"snapshot format version {version}: this dstl reads 1 to {VERSION} (written by a newer one?)"
        raise CorruptedError(msg, location=where, offset=0)
    if version == 1:
        codec = CODEC_IDS["none"]
        meta_bytes, index = _v1_head(read_range, where)
    else:
        meta_bytes, index = _v2_tail(read_range, where, size)
    if codec not in CODEC_NAMES:
        msg = f"snapshot uses unknown codec id {codec} (written by a newer dstl?)"
        raise CorruptedError(msg, location=where, offset=0)
    try:
        what = f"snapshot meta of {where}"
        meta = check_fields(parse_json(meta_bytes, what), what, {})
    except InvalidHandleError as exc:
        raise CorruptedError(str(exc) or type(exc).__name__, location=where, offset=_HEADER.size) from exc

    def sections(skipped: Container[int]) -> Iterator[tuple[int, list[Any]]]:
        for key_group, offset, length, raw_length in index:
            if key_group not in key_groups or key_group in skipped:
                continue
            # Compressed data may come out a little longer than raw: twice the bound is slack enough.
            if raw_length > MAX_SECTION_BYTES or length > 2 * MAX_SECTION_BYTES:
                msg = (
                    f"snapshot section of key group {key_group} claims {raw_length} bytes "
                    f"(at most {MAX_SECTION_BYTES})"
                )
                raise CorruptedError(msg, location=where, offset=offset)
            raw = read_range(offset, offset + length)
            stored, crc = raw[: -_CRC.size], raw[-_CRC.size :]
            if len(raw) != length or length < _CRC.size or _CRC.unpack(crc)[0] != google_crc32c.value(stored):
                msg = f"snapshot section of key group {key_group} failed its checksum"
                raise CorruptedError(msg, location=where, offset=offset)
            body = decompress(codec, stored, raw_length, where=where, offset=offset)
            budget = MAX_SECTION_OBJECTS if version >= 2 else MAX_V1_SECTION_OBJECTS
            try:
                entries = _unpack_bounded(body, budget)
            except (ValueError, TypeError, msgpack.UnpackException) as exc:
                msg = f"snapshot section of key group {key_group} does not decode: {exc}"
                raise CorruptedError(msg, location=where, offset=offset) from exc
            if not isinstance(entries, list):
                msg = f"snapshot section of key group {key_group} is not a list of entries"
                raise CorruptedError(msg, location=where, offset=offset)
            yield key_group, entries

    return meta, SnapshotSections(sections, columnar=version >= 3, where=where)
