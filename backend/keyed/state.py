"""Keyed state bound to the backend's current key: Value, List, Map, Reducing."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import msgpack

from ..serialization import Serializer
from .ops import Op
from .stored_values import StoredValues
from .ttl import TTL_SUFFIX, stamp, unstamp

if TYPE_CHECKING:
    from .context import KeyedContext

__all__ = [
    "KeySet",
    "ListState",
    "MapState",
    "ReducingState",
    "StateDescriptor",
    "StateKind",
    "ValueState",
    "map_key_bytes",
    "map_key_from_bytes",
]


class StateKind(enum.Enum):
    """The kinds of keyed state."""

    VALUE = "value"
    LIST = "list"
    MAP = "map"
    REDUCING = "reducing"


@dataclass(frozen=True)
class StateDescriptor:
    """A state's name, kind and value serializer (and reduce function for REDUCING).

    :ivar ttl: seconds after its last write at which a value expires (``None``: never).
        Values then carry their write time, so turning TTL on or off for a
        checkpointed state is refused at restore; changing the duration is allowed.
    """

    name: str
    kind: StateKind
    serializer: str = "msgpack"
    reduce: Callable[[Any, Any], Any] | None = None
    ttl: float | None = None

    def __post_init__(self) -> None:
        if self.ttl is not None and not self.ttl > 0:
            msg = f"state {self.name!r}: ttl must be a positive number of seconds, got {self.ttl!r}"
            raise ValueError(msg)

    @property
    def stored_format(self) -> str:
        """The serializer name as registered in the log (marks TTL, which changes stored values)."""
        return self.serializer + (TTL_SUFFIX if self.ttl is not None else "")


def map_key_from_bytes(raw: bytes) -> Any:
    """A map key (or a state key) from its stored bytes; a tuple comes back as a tuple (hashable)."""
    return msgpack.unpackb(raw, raw=False, use_list=False, strict_map_key=False)


def map_key_bytes(key: object) -> bytes:
    """Stable bytes of a map key (plain data only, so equal keys give equal bytes)."""
    try:
        return msgpack.packb(key, use_bin_type=True)
    except (TypeError, ValueError) as exc:
        msg = f"map key of type {type(key).__name__} is not plain data: {exc}"
        raise TypeError(msg) from exc


def map_keys_bytes(keys: Sequence[object]) -> tuple[bytes, ...]:
    """:func:`map_key_bytes` of each key, with one packer for all (the bulk path binds many keys)."""
    pack = msgpack.Packer(use_bin_type=True).pack
    try:
        return tuple(map(pack, keys))
    except (TypeError, ValueError):
        return tuple(map_key_bytes(key) for key in keys)  # raises, naming the key's type


@dataclass(frozen=True)
class KeySet:
    """Keys bound once for bulk state access: each key's key group and stored bytes.

    Build it with ``backend.key_set(keys)`` (or ``context.key_set``) and pass it to
    every ``*_many`` call of the batch: the hashing and encoding are then paid once
    per key, not once per key and state.
    """

    keys: tuple[Any, ...]
    groups: tuple[int, ...]
    raw: tuple[bytes, ...]
    #: the binder knew no key is there twice (a grouped batch's keys): not checked again
    known_distinct: bool = field(default=False, repr=False, compare=False)

    def __len__(self) -> int:
        """How many keys."""
        return len(self.keys)

    @cached_property
    def distinct(self) -> bool:
        """Whether no key is there twice (known once per key set, whatever states it serves)."""
        return self.known_distinct or len(set(self.raw)) == len(self.raw)

    def subset(self, positions: Iterable[int]) -> KeySet:
        """The keys at ``positions``, in that order."""
        positions = list(positions)
        return KeySet(
            tuple(self.keys[i] for i in positions),
            tuple(self.groups[i] for i in positions),
            tuple(self.raw[i] for i in positions),
        )


def _last_per_key(keys: KeySet, values: Iterable[Any]) -> tuple[KeySet, list[Any]]:
    """Each key once, with its last value (first-seen order); the lengths must match."""
    values = list(values)
    if len(values) != len(keys):
        msg = f"got {len(values)} values for {len(keys)} keys"
        raise ValueError(msg)
    if keys.distinct:
        return keys, values
    last = {raw: i for i, raw in enumerate(keys.raw)}
    first = list(dict.fromkeys(keys.raw))
    positions = [last[raw] for raw in first]
    return keys.subset(positions), [values[i] for i in positions]


class _KeyedState:
    def __init__(
        self,
        context: KeyedContext,
        state_id: int,
        descriptor: StateDescriptor,
        serializer: Serializer,
    ) -> None:
        self._context = context
        #: The state's number in the log it is registered in.
        self.state_id = state_id
        self.descriptor = descriptor
        self._serializer = StoredValues(serializer, descriptor.name)  # reads back: damage is named

    @property
    def name(self) -> str:
        return self.descriptor.name

    def _entry(self) -> Any:
        key_group, key = self._context.current_key()
        return self._context.delegate.get(self.name, key_group, key)

    def _dump(self, value: Any) -> bytes:
        payload = self._serializer.dumps(value)
        return payload if self.descriptor.ttl is None else stamp(payload, self._context.clock())

    def _live(self, raw: bytes) -> bytes | None:
        """The serialized value, or ``None`` when it expired."""
        ttl = self.descriptor.ttl
        return raw if ttl is None else unstamp(raw, ttl, self._context.clock())

    def _load(self, raw: bytes | None) -> Any | None:
        live = None if raw is None else self._live(raw)
        return None if live is None else self._serializer.loads(live)

    def _load_current(self, raw: bytes | None) -> Any | None:
        """The current key's loaded value; an expired one is removed from state now (logged)."""
        if raw is None:
            return None
        live = self._live(raw)
        if live is None:
            self._apply(Op.CLEAR)
            self._context.count_expired(1)
            return None
        return self._serializer.loads(live)

    def _apply(self, op: Op, *args: Any) -> None:
        self._context.log_change(op, self.state_id, self.name, *args)

    def _bound(self, keys: KeySet | Iterable[Any]) -> KeySet:
        return keys if isinstance(keys, KeySet) else self._context.key_set(keys)

    def _entries(self, keys: KeySet) -> list[Any]:
        return self._context.delegate.get_many(self.name, keys.groups, keys.raw)

    def _dump_many(self, values: Sequence[Any]) -> list[bytes]:
        payloads = self._serializer.dumps_many(values)
        if self.descriptor.ttl is None:
            return payloads
        now = self._context.clock()
        return [stamp(payload, now) for payload in payloads]

    def _values(self, keys: KeySet | Iterable[Any]) -> list[Any | None]:
        """The loaded single values of ``keys`` (value and reducing state), in order.

        Expired values are removed from state as they are found (logged, in one batch).
        """
        bound = self._bound(keys)
        raws = self._context.delegate.get_values(self.name, bound.groups, bound.raw)
        if self.descriptor.ttl is None:
            return self._serializer.loads_many(raws)
        values: list[Any | None] = []
        expired: list[int] = []
        for index, raw in enumerate(raws):
            live = None if raw is None else self._live(raw)
            if live is None and raw is not None:
                expired.append(index)
            values.append(None if live is None else self._serializer.loads(live))
        if expired:
            self._apply_many(Op.CLEAR, bound.subset(expired), (() for _ in expired))
            self._context.count_expired(len(expired))
        return values

    def _apply_many(self, op: Op, keys: KeySet, args: Iterable[tuple[Any, ...]]) -> None:
        self._context.log_changes(op, self.state_id, self.name, keys, args)

    def clear(self) -> None:
        """Remove the current key's state."""
        self._apply(Op.CLEAR)

    def remove_expired(self) -> None:
        """Remove the current key's expired value (or elements, or entries) from state, logged."""
        self._load_current(self._entry())


class ValueState(_KeyedState):
    """One value per key."""

    def value(self) -> Any | None:
        """The current key's value, or ``None`` (also once it expired: then it is removed)."""
        return self._load_current(self._entry())

    def exists(self) -> bool:
        """Whether the current key has a (live) value."""
        return self.value() is not None

    def get_many(self, keys: KeySet | Iterable[Any]) -> list[Any | None]:
        """The values of ``keys``, in order (``None`` where there is none): one read for all."""
        return self._values(keys)

    def update_many(self, keys: KeySet | Iterable[Any], values: Iterable[Any]) -> None:
        """Set the value of each key (``None`` clears it; a key given twice: the last wins), in bulk."""
        bound, values = _last_per_key(self._bound(keys), values)
        cleared = [i for i, value in enumerate(values) if value is None]
        if cleared:
            self._apply_many(Op.CLEAR, bound.subset(cleared), (() for _ in cleared))
            kept = [i for i, value in enumerate(values) if value is not None]
            bound, values = bound.subset(kept), [values[i] for i in kept]
        self._context.log_values(self.state_id, self.name, bound, self._dump_many(values))

    def update(self, value: Any) -> None:
        """Set the current key's value (``None`` clears it)."""
        if value is None:
            self.clear()
        else:
            self._apply(Op.VALUE_PUT, self._dump(value))


class ReducingState(_KeyedState):
    """A value per key folded with ``descriptor.reduce`` as elements are added."""

    def get(self) -> Any | None:
        """The reduced value, or ``None`` (also once it expired: then it is removed)."""
        return self._load_current(self._entry())

    def add(self, value: Any) -> None:
        """Fold ``value`` into the current key's value (the result is what is logged)."""
        current = self.get()
        reduce = self.descriptor.reduce
        assert reduce is not None  # registration guarantees it
        result = value if current is None else reduce(current, value)
        self._apply(Op.VALUE_PUT, self._dump(result))

    def get_many(self, keys: KeySet | Iterable[Any]) -> list[Any | None]:
        """The reduced values of ``keys``, in order."""
        return self._values(keys)

    def add_many(self, keys: KeySet | Iterable[Any], values: Iterable[Any]) -> None:
        """Fold one value into each key's value (a key given twice folds both, in order)."""
        bound = self._bound(keys)
        values = list(values)
        if len(values) != len(bound):
            msg = f"add_many got {len(values)} values for {len(bound)} keys"
            raise ValueError(msg)
        reduce = self.descriptor.reduce
        assert reduce is not None  # registration guarantees it
        unique, _ = _last_per_key(bound, values)
        folded = dict(zip(unique.raw, self.get_many(unique), strict=True))
        for raw, value in zip(bound.raw, values, strict=True):
            current = folded[raw]
            folded[raw] = value if current is None else reduce(current, value)
        payloads = self._dump_many([folded[raw] for raw in unique.raw])
        self._context.log_values(self.state_id, self.name, unique, payloads)


class ListState(_KeyedState):
    """A list per key."""

    def remove_expired(self) -> None:
        """Remove the current key's expired elements from state, logged."""
        self.get()

    def get(self) -> list[Any]:
        """The current key's elements (empty list when none; expired elements are removed)."""
        entry = self._entry() or []
        if self.descriptor.ttl is None:
            return [self._serializer.loads(e) for e in entry]
        kept = [(raw, live) for raw in entry if (live := self._live(raw)) is not None]
        if len(kept) < len(entry):
            if kept:
                self._apply(Op.LIST_SET, [raw for raw, _ in kept])  # the kept elements keep their write times
            else:
                self._apply(Op.CLEAR)
            self._context.count_expired(len(entry) - len(kept))
        return [self._serializer.loads(live) for _, live in kept]

    def add(self, value: Any) -> None:
        """Append one element."""
        self._apply(Op.LIST_ADD, self._dump(value))

    def add_all(self, values: Iterable[Any]) -> None:
        """Append several elements."""
        for value in values:
            self.add(value)

    def get_many(self, keys: KeySet | Iterable[Any]) -> list[list[Any]]:
        """The elements of each key's list, in order (empty lists where there are none)."""
        loads, live = self._serializer.loads, self._live
        return [
            [loads(e) for e in (live(x) for x in entry or []) if e is not None]
            for entry in self._entries(self._bound(keys))
        ]

    def add_many(self, keys: KeySet | Iterable[Any], values: Iterable[Any]) -> None:
        """Append one element to each key's list (a key given twice gets both, in order)."""
        dump = self._dump
        self._apply_many(Op.LIST_ADD, self._bound(keys), ((dump(value),) for value in values))

    def update(self, values: Iterable[Any]) -> None:
        """Replace the elements."""
        self._apply(Op.LIST_SET, [self._dump(v) for v in values])


class MapState(_KeyedState):
    """A map per key (map keys must be plain data).

    Every operation reaches one entry of the map, so its cost does not grow with
    the map; :meth:`items` streams.
    """

    def _raw(self, raw_key: bytes) -> bytes | None:
        key_group, key = self._context.current_key()
        return self._context.delegate.map_get(self.name, key_group, key, raw_key)

    def _live_items(self) -> Iterator[tuple[bytes, bytes]]:
        """Live entries (serialized), expired ones left out."""
        key_group, key = self._context.current_key()
        items = self._context.delegate.map_items(self.name, key_group, key)
        if self.descriptor.ttl is None:
            return items
        return ((k, live) for k, v in items if (live := self._live(v)) is not None)

    def get(self, map_key: Any) -> Any | None:
        """The value under ``map_key``, or ``None`` (an expired entry is removed)."""
        raw_key = map_key_bytes(map_key)
        return self._loaded_entry(raw_key, self._raw(raw_key))

    def _loaded_entry(self, raw_key: bytes, raw: bytes | None) -> Any | None:
        """An entry's loaded value; an expired entry is removed from state now (logged)."""
        if raw is None:
            return None
        live = self._live(raw)
        if live is None:
            self._expire_entry(raw_key)
            return None
        return self._serializer.loads(live)

    def remove_expired(self) -> None:
        """Remove the current key's expired entries from state, logged (the map is read in chunks)."""
        key_group, key = self._context.current_key()
        entries = self._context.delegate.map_items(self.name, key_group, key)
        for raw_key in [k for k, v in entries if self._live(v) is None]:
            self._expire_entry(raw_key)

    def _expire_entry(self, raw_key: bytes) -> None:
        """Remove an entry found expired (logged, counted)."""
        self._apply(Op.MAP_REMOVE, raw_key)
        self._context.count_expired(1)

    def put(self, map_key: Any, value: Any) -> None:
        """Set ``map_key`` to ``value``."""
        self._apply(Op.MAP_PUT, map_key_bytes(map_key), self._dump(value))

    def remove(self, map_key: Any) -> None:
        """Remove ``map_key`` (no-op when absent)."""
        raw_key = map_key_bytes(map_key)
        if self._raw(raw_key) is not None:  # expired entries too: removing frees them now
            self._apply(Op.MAP_REMOVE, raw_key)

    def contains(self, map_key: Any) -> bool:
        """Whether ``map_key`` is present (an expired entry is removed)."""
        raw_key = map_key_bytes(map_key)
        raw = self._raw(raw_key)
        if raw is None:
            return False
        if self._live(raw) is not None:
            return True
        self._expire_entry(raw_key)
        return False

    def items(self) -> Iterator[tuple[Any, Any]]:
        """``(map key, value)`` pairs, streamed (the map may change meanwhile)."""
        loads = self._serializer.loads
        for raw_key, raw_value in self._live_items():
            yield map_key_from_bytes(raw_key), loads(raw_value)

    def keys(self) -> Iterator[Any]:
        """The map keys, streamed."""
        for raw_key, _ in self._live_items():
            yield map_key_from_bytes(raw_key)

    def values(self) -> Iterator[Any]:
        """The values, streamed."""
        loads = self._serializer.loads
        for _, raw_value in self._live_items():
            yield loads(raw_value)

    def is_empty(self) -> bool:
        """Whether the current key's map is empty (of live entries)."""
        return next(iter(self._live_items()), None) is None

    def get_many(self, keys: KeySet | Iterable[Any], map_keys: Iterable[Any]) -> list[Any | None]:
        """The value under each key's map key (pairs in order), ``None`` where absent."""
        bound = self._bound(keys)
        get = self._context.delegate.map_get
        return [
            self._load(get(self.name, group, raw, map_key_bytes(map_key)))
            for group, raw, map_key in zip(bound.groups, bound.raw, map_keys, strict=True)
        ]

    def put_many(self, keys: KeySet | Iterable[Any], map_keys: Iterable[Any], values: Iterable[Any]) -> None:
        """Set each key's ``map_key`` to its value (triples in order)."""
        dump = self._dump
        pairs = ((map_key_bytes(m), dump(v)) for m, v in zip(map_keys, values, strict=True))
        self._apply_many(Op.MAP_PUT, self._bound(keys), pairs)
