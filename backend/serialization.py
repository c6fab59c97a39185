"""Value serializers for keyed state.

State bytes are written to shared storage and read back on restore, so they are
untrusted input: the default serializer (msgpack) can only produce plain data.
Pickle executes code while loading, so it is available only when asked for by
name and never chosen implicitly.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import pickle
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from dstl.spi import ConfigError

__all__ = [
    "MsgpackSerializer",
    "PickleSerializer",
    "Serializer",
    "SparkValueSerializer",
    "SizeOnlySerializer",
    "serializer_for",
    "untrusted_serializer_for",
]


class Serializer(ABC):
    """Turns state values into bytes and back; ``name`` is recorded with the state."""

    name: str

    @abstractmethod
    def dumps(self, value: Any) -> bytes:
        """Encode ``value``."""

    @abstractmethod
    def loads(self, data: bytes) -> Any:
        """Decode bytes written by :meth:`dumps`."""

    def dumps_many(self, values: Sequence[Any]) -> list[bytes]:
        """:meth:`dumps` of each value (serializers override it to encode a batch faster)."""
        dumps = self.dumps
        return [dumps(value) for value in values]

    def loads_many(self, stored: Sequence[bytes | None]) -> list[Any | None]:
        """:meth:`loads` of each stored value, ``None`` (nothing stored) kept as ``None``."""
        loads = self._decoder()
        if None in stored:
            return [None if data is None else loads(data) for data in stored]
        return list(map(loads, stored))  # type: ignore[arg-type]  # no None among them

    def _decoder(self) -> Callable[[bytes], Any]:
        """What :meth:`loads_many` maps over the values (a C function where there is one)."""
        return self.loads


class MsgpackSerializer(Serializer):
    """Plain data: None, bool, int, float, str, bytes, lists/tuples (as lists) and dicts."""

    name = "msgpack"

    def dumps(self, value: Any) -> bytes:
        """Encode ``value``; a clear error for types msgpack cannot carry."""
        try:
            return msgpack.packb(value, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as exc:
            msg = (
                f"state value of type {type(value).__name__} cannot be stored with msgpack ({exc}); "
                "store plain data, or register the state with serializer='pickle' if you trust the storage"
            )
            raise TypeError(msg) from exc

    def loads(self, data: bytes) -> Any:
        """Decode (lists stay lists; map keys keep their types)."""
        return msgpack.unpackb(data, raw=False, strict_map_key=False)

    def _decoder(self) -> Callable[[bytes], Any]:
        return functools.partial(msgpack.unpackb, raw=False, strict_map_key=False)

    def dumps_many(self, values: Sequence[Any]) -> list[bytes]:
        """Each value with one packer (a packer per value costs more than its value); errors as ``dumps``."""
        pack = self._packer().pack
        try:
            return [pack(value) for value in values]
        except (TypeError, ValueError, OverflowError):
            return [self.dumps(value) for value in values]  # raises, naming the value's type

    def _packer(self) -> msgpack.Packer:
        return msgpack.Packer(use_bin_type=True)


class SparkValueSerializer(MsgpackSerializer):
    """The Python values of Spark SQL types, without pickle.

    msgpack's plain data, and datetimes, dates, decimals and durations as msgpack
    extensions: decoding builds only those, so no code runs.
    """

    name = "spark"

    def dumps(self, value: Any) -> bytes:
        """Encode ``value`` (rows and tuples as lists)."""
        try:
            return msgpack.packb(value, use_bin_type=True, default=_spark_extension)
        except (TypeError, ValueError, OverflowError) as exc:
            msg = f"state value of type {type(value).__name__} is not a value of a Spark SQL type ({exc})"
            raise TypeError(msg) from exc

    def _packer(self) -> msgpack.Packer:
        return msgpack.Packer(use_bin_type=True, default=_spark_extension)

    def loads(self, data: bytes) -> Any:
        """Decode; an extension that does not parse is a ``ValueError`` naming it."""
        return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_spark_value)

    def _decoder(self) -> Callable[[bytes], Any]:
        return functools.partial(msgpack.unpackb, raw=False, strict_map_key=False, ext_hook=_spark_value)


#: msgpack extension codes of :class:`SparkValueSerializer`: text forms, parsed on read
_DATETIME, _DATE, _DECIMAL, _DURATION = 1, 2, 3, 4


def _spark_extension(value: Any) -> msgpack.ExtType:
    if isinstance(value, datetime.datetime):
        return msgpack.ExtType(_DATETIME, value.isoformat().encode())
    if isinstance(value, datetime.date):
        return msgpack.ExtType(_DATE, value.isoformat().encode())
    if isinstance(value, decimal.Decimal):
        return msgpack.ExtType(_DECIMAL, str(value).encode())
    if isinstance(value, datetime.timedelta):
        return msgpack.ExtType(_DURATION, str(value // datetime.timedelta(microseconds=1)).encode())
    msg = f"{type(value).__name__} is not a Spark SQL value"
    raise TypeError(msg)


_MAX_EXTENSION = 64  # the text of a datetime, date, decimal (38 digits) or duration fits


def _spark_value(code: int, data: bytes) -> Any:
    try:
        if len(data) > _MAX_EXTENSION:
            raise ValueError(len(data))
        text = data.decode("ascii")
        if code == _DATETIME:
            return datetime.datetime.fromisoformat(text)
        if code == _DATE:
            return datetime.date.fromisoformat(text)
        if code == _DECIMAL:
            return decimal.Decimal(text)
        if code == _DURATION:
            return datetime.timedelta(microseconds=int(text))
    except (ValueError, decimal.InvalidOperation) as exc:
        msg = f"a stored Spark value of extension {code} does not parse: {data[:_MAX_EXTENSION]!r}"
        raise ValueError(msg) from exc
    msg = f"a stored value has msgpack extension {code}, which no Spark SQL type uses"
    raise ValueError(msg)


class PickleSerializer(Serializer):
    """Any picklable value. Loading runs code: use only with storage you trust."""

    name = "pickle"

    def dumps(self, value: Any) -> bytes:
        """Pickle ``value``."""
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def loads(self, data: bytes) -> Any:
        """Unpickle (trusted input only)."""
        return pickle.loads(data)


_SERIALIZERS: dict[str, type[Serializer]] = {
    "msgpack": MsgpackSerializer,
    "pickle": PickleSerializer,
    "spark": SparkValueSerializer,
}
#: serializers whose decoding runs no code: read-only tools decode them
_SAFE = frozenset({MsgpackSerializer.name, SparkValueSerializer.name})


def serializer_for(name: str) -> Serializer:
    """The serializer called ``name`` (``msgpack``, ``spark`` or ``pickle``)."""
    try:
        return _SERIALIZERS[name]()
    except KeyError:
        msg = f"unknown serializer {name!r}: use one of {sorted(_SERIALIZERS)}"
        raise ConfigError(msg) from None


class SizeOnlySerializer(Serializer):
    """Shows a value it must not decode as ``{"bytes": n}``; cannot store anything.

    Read-only tools use it for pickle values of a checkpoint they do not trust:
    whoever can write the checkpoint could otherwise run code in the reader.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def dumps(self, value: Any) -> bytes:
        """Refuse: values are only read here."""
        msg = f"state values of serializer {self.name!r} are read by size only here; nothing can be stored"
        raise ConfigError(msg)

    def loads(self, data: bytes) -> Any:
        """The stored size only."""
        return {"bytes": len(data)}


def untrusted_serializer_for(name: str) -> Serializer:
    """:func:`serializer_for` for reading an untrusted checkpoint: pickle values show their size only."""
    return serializer_for(name) if name in _SAFE else SizeOnlySerializer(name)
