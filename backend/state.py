"""Keyed state bound to the backend's current key: Value, List, Map, Reducing."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack

from .changelog.records import Op
from .serialization import Serializer

if TYPE_CHECKING:
    from .changelog.backend import ChangelogKeyedStateBackend

__all__ = ["ListState", "MapState", "ReducingState", "StateDescriptor", "StateKind", "ValueState"]


class StateKind(enum.Enum):
    """The kinds of keyed state."""

    VALUE = "value"
    LIST = "list"
    MAP = "map"
    REDUCING = "reducing"


@dataclass(frozen=True)
class StateDescriptor:
    """A state's name, kind and value serializer (and reduce function for REDUCING)."""

    name: str
    kind: StateKind
    serializer: str = "msgpack"
    reduce: Callable[[Any, Any], Any] | None = None


def map_key_bytes(key: object) -> bytes:
    """Stable bytes of a map key (plain data only, so equal keys give equal bytes)."""
    try:
        return msgpack.packb(key, use_bin_type=True)
    except (TypeError, ValueError) as exc:
        msg = f"map key of type {type(key).__name__} is not plain data: {exc}"
        raise TypeError(msg) from exc


class _KeyedState:
    def __init__(
        self,
        backend: ChangelogKeyedStateBackend,
        state_id: int,
        descriptor: StateDescriptor,
        serializer: Serializer,
    ) -> None:
        self._backend = backend
        self._id = state_id
        self.descriptor = descriptor
        self._serializer = serializer

    @property
    def name(self) -> str:
        return self.descriptor.name

    def _entry(self) -> Any:  # noqa: ANN401
        key_group, key = self._backend._current()
        return self._backend.delegate.get(self.name, key_group, key)

    def _apply(self, op: Op, *args: Any) -> None:  # noqa: ANN401
        self._backend._apply(op, self._id, self.name, *args)

    def clear(self) -> None:
        """Remove the current key's state."""
        self._apply(Op.CLEAR)


class ValueState(_KeyedState):
    """One value per key."""

    def value(self) -> Any | None:  # noqa: ANN401
        """The current key's value, or ``None``."""
        entry = self._entry()
        return None if entry is None else self._serializer.loads(entry)

    def update(self, value: Any) -> None:  # noqa: ANN401
        """Set the current key's value (``None`` clears it)."""
        if value is None:
            self.clear()
        else:
            self._apply(Op.VALUE_PUT, self._serializer.dumps(value))


class ReducingState(_KeyedState):
    """A value per key folded with ``descriptor.reduce`` as elements are added."""

    def get(self) -> Any | None:  # noqa: ANN401
        """The reduced value, or ``None``."""
        entry = self._entry()
        return None if entry is None else self._serializer.loads(entry)

    def add(self, value: Any) -> None:  # noqa: ANN401
        """Fold ``value`` into the current key's value (the result is what is logged)."""
        current = self.get()
        reduce = self.descriptor.reduce
        assert reduce is not None  # registration guarantees it
        result = value if current is None else reduce(current, value)
        self._apply(Op.VALUE_PUT, self._serializer.dumps(result))


class ListState(_KeyedState):
    """A list per key."""

    def get(self) -> list[Any]:
        """The current key's elements (empty list when none)."""
        entry = self._entry() or []
        return [self._serializer.loads(e) for e in entry]

    def add(self, value: Any) -> None:  # noqa: ANN401
        """Append one element."""
        self._apply(Op.LIST_ADD, self._serializer.dumps(value))

    def add_all(self, values: Iterable[Any]) -> None:
        """Append several elements."""
        for value in values:
            self.add(value)

    def update(self, values: Iterable[Any]) -> None:
        """Replace the elements."""
        self._apply(Op.LIST_SET, [self._serializer.dumps(v) for v in values])


class MapState(_KeyedState):
    """A map per key (map keys must be plain data)."""

    def _map(self) -> dict[bytes, bytes]:
        return self._entry() or {}

    def get(self, map_key: Any) -> Any | None:  # noqa: ANN401
        """The value under ``map_key``, or ``None``."""
        raw = self._map().get(map_key_bytes(map_key))
        return None if raw is None else self._serializer.loads(raw)

    def put(self, map_key: Any, value: Any) -> None:  # noqa: ANN401
        """Set ``map_key`` to ``value``."""
        self._apply(Op.MAP_PUT, map_key_bytes(map_key), self._serializer.dumps(value))

    def remove(self, map_key: Any) -> None:  # noqa: ANN401
        """Remove ``map_key`` (no-op when absent)."""
        raw_key = map_key_bytes(map_key)
        if raw_key in self._map():
            self._apply(Op.MAP_REMOVE, raw_key)

    def contains(self, map_key: Any) -> bool:  # noqa: ANN401
        """Whether ``map_key`` is present."""
        return map_key_bytes(map_key) in self._map()

    def items(self) -> Iterator[tuple[Any, Any]]:
        """``(map key, value)`` pairs."""
        for raw_key, raw_value in list(self._map().items()):
            yield msgpack.unpackb(raw_key, raw=False, strict_map_key=False), self._serializer.loads(raw_value)

    def is_empty(self) -> bool:
        """Whether the current key's map is empty."""
        return not self._map()
