"""Snapshot objects: one per materialization, a checksummed section per key group.

Layout (little-endian)::

    magic "DSTM" | version u8 | reserved 3 | meta length u32 | section count u32 | crc32c u32
    meta (JSON: registrations, SQN)          } covered by the header crc
    index: count x (key group i32 | offset u64 | length u32)
    sections: msgpack [[state, key, entry], ...] followed by its crc32c u32

A restore of some key groups reads the header and index, then only its sections.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import google_crc32c
import msgpack

from dstl.spi import CorruptedError, InvalidHandleError, KeyGroupRange, check_relative_path

from ..documents import MAX_DOCUMENT_BYTES, check_fields, parse_json
from ..keygroups import MAX_KEY_GROUPS

_MAGIC = b"DSTM"
_HEADER = struct.Struct("<4sB3xIII")
_ENTRY = struct.Struct("<iQI")
_CRC = struct.Struct("<I")


@dataclass(frozen=True)
class MaterializationRef:
    """A snapshot object: where, which key groups, and the log SQN it covers up to."""

    path: str
    key_groups: KeyGroupRange
    sqn: int
    size: int
    entries: int = 0  # entries (or tombstones) it holds: decides when the next one must be full

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "path": self.path,
            "key_groups": [self.key_groups.start, self.key_groups.end],
            "sqn": self.sqn,
            "size": self.size,
            "entries": self.entries,
        }

    @classmethod
    def from_dict(cls, doc: Any) -> MaterializationRef:  # noqa: ANN401 - untrusted JSON
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
            return cls(path, KeyGroupRange(start, end), sqn, size, entries)
        except (KeyError, TypeError, ValueError) as exc:
            msg = f"invalid materialization reference: {exc}"
            raise InvalidHandleError(msg) from exc


def write_snapshot(sections: dict[int, list[list[Any]]], meta: dict[str, Any]) -> bytes:
    """The snapshot object for ``sections`` (key group -> [[state, key, entry], ...])."""
    meta_bytes = json.dumps(meta, sort_keys=True).encode()
    bodies = []
    for key_group in sorted(sections):
        body = msgpack.packb(sections[key_group], use_bin_type=True)
        bodies.append((key_group, body + _CRC.pack(google_crc32c.value(body))))
    offset = _HEADER.size + len(meta_bytes) + _ENTRY.size * len(bodies)
    index = []
    for key_group, body in bodies:
        index.append(_ENTRY.pack(key_group, offset, len(body)))
        offset += len(body)
    index_bytes = b"".join(index)
    crc = google_crc32c.value(meta_bytes + index_bytes)
    header = _HEADER.pack(_MAGIC, 1, len(meta_bytes), len(bodies), crc)
    return b"".join([header, meta_bytes, index_bytes, *(body for _, body in bodies)])


def read_sections(
    read_range: Any,  # noqa: ANN401 - callable (start, end) -> bytes
    key_groups: KeyGroupRange,
    *,
    where: str,
) -> tuple[dict[str, Any], Iterator[tuple[int, list[Any]]]]:
    """The meta and the sections of ``key_groups`` (each verified); reads only what it needs."""
    head = read_range(0, _HEADER.size)
    if len(head) < _HEADER.size:
        msg = "snapshot header truncated"
        raise CorruptedError(msg, location=where, offset=0)
    magic, version, meta_len, count, crc = _HEADER.unpack_from(head, 0)
    if magic != _MAGIC or version != 1:
        msg = f"not a dstl snapshot (magic {magic!r}, version {version})"
        raise CorruptedError(msg, location=where, offset=0)
    if count > MAX_KEY_GROUPS or meta_len > MAX_DOCUMENT_BYTES:
        # Checked before reading: a damaged header must not make a restore allocate gigabytes.
        msg = (
            f"snapshot header claims {count} sections and {meta_len} bytes of meta "
            f"(at most {MAX_KEY_GROUPS} and {MAX_DOCUMENT_BYTES})"
        )
        raise CorruptedError(msg, location=where, offset=0)
    needed = _HEADER.size + meta_len + _ENTRY.size * count
    if len(head) < needed:
        head = read_range(0, needed)
    meta_bytes = head[_HEADER.size : _HEADER.size + meta_len]
    index_bytes = head[_HEADER.size + meta_len : needed]
    if len(index_bytes) != _ENTRY.size * count or google_crc32c.value(meta_bytes + index_bytes) != crc:
        msg = "snapshot header checksum mismatch"
        raise CorruptedError(msg, location=where, offset=0)
    try:
        what = f"snapshot meta of {where}"
        meta = check_fields(parse_json(meta_bytes, what), what, {})
    except InvalidHandleError as exc:
        raise CorruptedError(str(exc), location=where, offset=_HEADER.size) from exc
    index = [_ENTRY.unpack_from(index_bytes, i * _ENTRY.size) for i in range(count)]

    def sections() -> Iterator[tuple[int, list[Any]]]:
        for key_group, offset, length in index:
            if key_group not in key_groups:
                continue
            raw = read_range(offset, offset + length)
            body, stored = raw[: -_CRC.size], raw[-_CRC.size :]
            if len(raw) != length or _CRC.unpack(stored)[0] != google_crc32c.value(body):
                msg = f"snapshot section of key group {key_group} failed its checksum"
                raise CorruptedError(msg, location=where, offset=offset)
            try:
                entries = msgpack.unpackb(body, raw=False, strict_map_key=False)
            except (ValueError, TypeError, msgpack.UnpackException) as exc:
                msg = f"snapshot section of key group {key_group} does not decode: {exc}"
                raise CorruptedError(msg, location=where, offset=offset) from exc
            if not isinstance(entries, list):
                msg = f"snapshot section of key group {key_group} is not a list of entries"
                raise CorruptedError(msg, location=where, offset=offset)
            yield key_group, entries

    return meta, sections()
