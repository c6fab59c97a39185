"""The record layout of state in LMDB: where a key's value or elements live, and reading and writing them.

A key's records start with its *base*: the state's name (length-prefixed), the key
group (4 bytes, big-endian) and the key (length-prefixed), so that no key's records
fall among another's. A value is one record at the base; a list's elements follow it
under ``0x01`` and an index, a map's entries under ``0x02`` and the map key.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from .base import SECTION_ENTRIES

_KG = struct.Struct(">i")
_KEY_LENGTH = struct.Struct(">H")
_INDEX = struct.Struct(">Q")
_LIST, _MAP = b"\x01", b"\x02"  # element tags after a key's base
_MAX_KEY = 511  # LMDB's default key size limit

#: The record layout, in the Spark working copy's stamp: a copy of another layout is restored, not read.
LAYOUT = 2


def _prefix(state: str, key_group: int) -> bytes:
    name = state.encode()
    return bytes([len(name)]) + name + _KG.pack(key_group)


def _base(prefix: bytes, key: bytes) -> bytes:
    """A key's records start with this: length-prefixed, so no key's records fall among another's."""
    return prefix + _KEY_LENGTH.pack(len(key)) + key


def _bases_of(prefixes: Iterable[bytes], keys: Sequence[bytes]) -> list[bytes]:
    """:func:`_base` of each key after its prefix, built in C (the bulk paths bind many keys)."""
    return list(map(b"".join, zip(prefixes, map(_KEY_LENGTH.pack, map(len, keys)), keys, strict=True)))


def _decoded(records: Iterator[tuple[bytes, bytes]], prefix: bytes) -> Iterator[tuple[bytes, Any]]:
    """``(key, entry)`` from a cursor's records under ``prefix``, the elements of a collection gathered."""
    for key, entry, _ in _chunked(records, prefix, limit=None):
        yield key, entry


#: An LMDB transaction. lmdb's hints type keys and values as ``bytes | memoryview`` (for
#: ``buffers=True``); this store never asks for buffers, so they are bytes.
_Txn = Any


def _next_index(txn: _Txn, base: bytes) -> int:
    """The index after the last element of the list at ``base`` (0 when empty): one seek."""
    first = base + _LIST
    cursor = txn.cursor()
    moved = cursor.prev() if cursor.set_range(base + _MAP) else cursor.last()
    last = cursor.key() if moved else b""
    if last.startswith(first) and len(last) == len(first) + _INDEX.size:
        return _INDEX.unpack_from(last, len(first))[0] + 1
    return 0


def _chunked(
    records: Iterator[tuple[bytes, bytes]], prefix: bytes, limit: int | None = SECTION_ENTRIES
) -> Iterator[tuple[bytes, Any, bool]]:
    """``(key, part, continued)`` from a cursor's records under ``prefix``, streamed.

    Collections come in parts of at most ``limit`` elements (``None``: whole).
    """
    at = len(prefix)
    key: bytes | None = None
    part: Any = None
    continued = False
    for raw_key, raw in records:
        if not raw_key.startswith(prefix):
            break
        (length,) = _KEY_LENGTH.unpack_from(raw_key, at)
        this = raw_key[at + 2 : at + 2 + length]
        tail = raw_key[at + 2 + length :]
        if this != key:
            if key is not None:
                yield key, part, continued
            key, part, continued = this, None, False
        elif limit is not None and part is not None and type(part) is not bytes and len(part) == limit:
            yield key, part, continued
            part, continued = None, True
        if not tail:
            part = raw
        elif tail[:1] == _LIST:
            if part is None:
                part = []
            part.append(raw)
        else:
            if part is None:
                part = {}
            part[tail[1:]] = raw
    if key is not None:
        yield key, part, continued


def _value_rows(state: str, records: list[tuple[bytes, bytes]], at: int) -> list[list[Any]] | None:
    """``[state, key, value]`` of ``records`` (all under one prefix ``at`` bytes long) when each is a value.

    ``None`` when any is a collection's element (its key carries a tail past the stored
    key): the caller reads those through :func:`_chunked`. C-level passes, no step per record.
    """
    # _KEY_LENGTH read inline (big-endian, 2 bytes): a call per record would cost a fifth more
    tails = [len(raw_key) - (raw_key[at] << 8 | raw_key[at + 1]) for raw_key, _ in records]
    if not records or min(tails) != max(tails) or tails[0] != at + 2:
        return None
    return [[state, raw_key[at + 2 :], raw] for raw_key, raw in records]


def _entry_at(txn: _Txn, base: bytes) -> Any | None:
    cursor = txn.cursor()
    if not cursor.set_range(base) or not cursor.key().startswith(base):
        return None
    prefix = base[: 1 + base[0] + _KG.size]  # the state and key group part of the base
    for _, entry in _decoded(iter(cursor), prefix):
        return entry
    return None


def _remove(txn: _Txn, base: bytes) -> None:
    """Delete the key's value record and every element record."""
    txn.delete(base)
    cursor = txn.cursor()
    if cursor.set_range(base + _LIST):
        while cursor.key().startswith(base) and cursor.delete():
            pass


def _store(txn: _Txn, base: bytes, entry: Any) -> None:
    """Write ``entry`` at ``base``: bytes as one record, a list or map as one record per element."""
    if type(entry) is bytes:
        txn.put(base, entry)  # a key's state has one kind: no elements to remove
        return
    _remove(txn, base)
    if isinstance(entry, list):
        first = base + _LIST
        for index, element in enumerate(entry):
            txn.put(first + _INDEX.pack(index), element)
    elif isinstance(entry, dict):
        first = base + _MAP
        for map_key, value in entry.items():
            txn.put(first + map_key, value)
    else:
        msg = f"a state entry is bytes, a list or a dict of bytes, not {type(entry).__name__}"
        raise TypeError(msg)
