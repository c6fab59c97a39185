"""Change records written to the DSTL: msgpack arrays, registrations as metadata."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import Any

import msgpack

from dstl.spi import CorruptedError

from ..keyed.ops import Op


def encode_change(op: Op, state_id: int, key: bytes, *args: Any) -> bytes:
    """One change record."""
    return msgpack.packb([int(op), state_id, key, *args], use_bin_type=True)


def encode_value_puts(state_id: int, keys: Sequence[bytes], values: Sequence[bytes]) -> list[bytes]:
    """The ``VALUE_PUT`` records of ``keys`` (each :func:`encode_change`'s), with one packer for all."""
    if len(keys) != len(values):
        msg = f"{len(keys)} keys for {len(values)} values"
        raise ValueError(msg)
    pack = msgpack.Packer(use_bin_type=True).pack  # packs a tuple as the array encode_change writes
    return list(map(pack, zip(repeat(int(Op.VALUE_PUT)), repeat(state_id), keys, values)))


_OPS = tuple(Op)  # index -> member: cheaper than Op(value) on the replay path
_ARITY = (1, 0, 1, 1, 2, 1)  # arguments each op carries, by op


def decode_change(data: bytes, *, where: str) -> tuple[Op, int, bytes, list[Any]]:
    """``(op, state id, key, arguments)``; :class:`CorruptedError` on anything else."""
    try:
        op, state_id, key, *args = msgpack.unpackb(data, raw=False, strict_map_key=False)
        well_typed = type(op) is int and type(state_id) is int and type(key) is bytes
        if not well_typed or not 0 <= op < len(_OPS):
            msg = f"op {op!r}, state id {state_id!r} or key {type(key).__name__} is not a state change"
            raise TypeError(msg)
        if len(args) != _ARITY[op]:
            msg = f"{_OPS[op].name} carries {_ARITY[op]} argument(s), not {len(args)}"
            raise TypeError(msg)
        return _OPS[op], state_id, key, args
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        msg = f"undecodable state change record: {exc}"
        raise CorruptedError(msg, location=where) from exc


def encode_registration(state_id: int, name: str, kind: str, serializer: str) -> bytes:
    """The metadata record registering a state under ``state_id`` in this log."""
    return msgpack.packb({"register": state_id, "name": name, "kind": kind, "serializer": serializer})


def decode_registration(data: bytes, *, where: str) -> tuple[int, str, str, str]:
    """``(state id, name, kind, serializer)`` of a registration record."""
    try:
        doc = msgpack.unpackb(data, raw=False)
        return int(doc["register"]), str(doc["name"]), str(doc["kind"]), str(doc["serializer"])
    except (ValueError, TypeError, KeyError, msgpack.ExtraData, msgpack.FormatError) as exc:
        msg = f"undecodable state registration record: {exc}"
        raise CorruptedError(msg, location=where) from exc
