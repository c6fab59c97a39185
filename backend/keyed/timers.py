"""Per-key timers in processing time and event time, kept as keyed state.

A timer is an entry of an internal map state (one per time domain): under the
key it belongs to, map key = its expiry in epoch milliseconds. So timers are
logged in the changelog under their key's key group, materialized, restored and
rescaled with that key group, exactly like the state they drive.

A second internal state orders them by time: under the same key group, a value
whose stored key is the expiry (8 bytes, big-endian) and 8 bytes of the key's
hash, holding the keys' bytes. On a store kept in key order (LMDB) the timers
due are found by seeking to each key group's first entry, so a fresh backend
over a large state (a Spark task) fires and reports its next timer at a cost
of the timers due, not of every timer. On the heap the order comes from an
in-memory heap built once from the state after a load (restore, resume) and
kept up to date by registrations.

Firing order is time, then key (the key's stored bytes). A timer is removed from
state as it fires, in the same checkpoint interval as whatever its handler
writes: a batch replayed after a failure finds it registered again and fires it
again, and a completed checkpoint never holds a fired timer, so across replays
each timer's effects are committed once.
"""

from __future__ import annotations

import builtins
import enum
import hashlib
import heapq
import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import msgpack

from .state import StateDescriptor, StateKind, map_key_from_bytes

#: Timers as a heap of ``(expiry ms, raw key, key group)`` (stores not in key order).
#: (``TimerService.list`` shadows the builtin in its class body: the alias names it outside.)
_Heap = list[tuple[int, bytes, int]]

if TYPE_CHECKING:
    from .context import KeyedContext
    from .state import MapState, ValueState

__all__ = ["RESERVED_PREFIX", "TimeDomain", "TimerService"]

#: State names starting with this are dstl's own (timers); users cannot register them.
RESERVED_PREFIX = "__dstl."


class TimeDomain(enum.Enum):
    """The clock a timer follows."""

    PROCESSING = "processing"
    EVENT = "event"


_INDEX_KEY = struct.Struct(">QQ")  # expiry (offset to sort signed values), key hash
_OFFSET = 1 << 63


def _index_key(expiry_ms: int, key: bytes) -> bytes:
    digest = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
    return _INDEX_KEY.pack(expiry_ms + _OFFSET, digest)


def _index_expiry(index_key: bytes) -> int:
    return _INDEX_KEY.unpack(index_key)[0] - _OFFSET


class TimerService:
    """Register, delete, list and fire the current key's timers (one per backend)."""

    def __init__(self, context: KeyedContext) -> None:
        self._context = context
        self._states: dict[TimeDomain, MapState] = {
            domain: context.register_internal(
                StateDescriptor(f"{RESERVED_PREFIX}timers.{domain.value}", StateKind.MAP)
            )
            for domain in TimeDomain
        }
        self._index: dict[TimeDomain, ValueState] = {
            domain: context.register_internal(
                StateDescriptor(f"{RESERVED_PREFIX}timers.{domain.value}.by-time", StateKind.VALUE)
            )
            for domain in TimeDomain
        }
        # Heap order (unordered stores): (expiry ms, key bytes, key group); None until built.
        self._queues: dict[TimeDomain, _Heap | None] = dict.fromkeys(TimeDomain)
        # While fire() runs: the timers registered since it began, (expiry, raw key). They fire in a
        # later call, as in Spark (a batch's expired timers are the ones registered before it fires).
        self._registered_while_firing: dict[TimeDomain, set[tuple[int, bytes]]] = {}

    def register(self, expiry_ms: int, domain: TimeDomain = TimeDomain.PROCESSING) -> None:
        """Register a timer of the current key at ``expiry_ms`` (registering it again changes nothing)."""
        expiry_ms = _checked(expiry_ms)
        state = self._states[domain]
        if state.contains(expiry_ms):
            return
        state.put(expiry_ms, True)
        key_group, key = self._context.current_key()
        index_key = _index_key(expiry_ms, key)
        self._update_index(domain, key_group, index_key, add=key)
        queue = self._queues[domain]
        if queue is not None:
            heapq.heappush(queue, (expiry_ms, key, key_group))
        fresh = self._registered_while_firing.get(domain)
        if fresh is not None:
            fresh.add((expiry_ms, key))

    def delete(self, expiry_ms: int, domain: TimeDomain = TimeDomain.PROCESSING) -> None:
        """Delete the current key's timer at ``expiry_ms`` (no-op when there is none)."""
        expiry_ms = _checked(expiry_ms)
        state = self._states[domain]
        if not state.contains(expiry_ms):
            return
        state.remove(expiry_ms)
        key_group, key = self._context.current_key()
        self._update_index(domain, key_group, _index_key(expiry_ms, key), remove=key)

    def list(self, domain: TimeDomain = TimeDomain.PROCESSING) -> list[int]:
        """The current key's timers, earliest first."""
        return sorted(int(expiry) for expiry, _ in self._states[domain].items())

    def fire(self, up_to_ms: int, domain: TimeDomain = TimeDomain.PROCESSING) -> Iterator[tuple[Any, int]]:
        """Fire every timer due at ``up_to_ms`` (expiry <= it): ``(key, expiry ms)``, time then key order.

        Before each ``(key, expiry)`` is yielded, the key is made current and the timer
        removed from state; a handler run at that point writes to the key's state.
        Timers registered while the call runs (a handler re-arming its key, even at a
        time already due) fire in a later call, as in Spark, where the timers a batch
        fires are the ones registered before it began firing.
        """
        fresh: set[tuple[int, bytes]] = set()
        self._registered_while_firing[domain] = fresh
        try:
            if self._context.delegate.ordered:
                yield from self._fire_ordered(up_to_ms, domain, fresh)
            else:
                yield from self._fire_heap(up_to_ms, domain, fresh)
        finally:
            del self._registered_while_firing[domain]

    def _fire_heap(
        self, up_to_ms: int, domain: TimeDomain, fresh: set[tuple[int, bytes]]
    ) -> Iterator[tuple[Any, int]]:
        """:meth:`fire` on a store not in key order: the heap of every timer."""
        queue = self._queue(domain)
        state = self._states[domain]
        context = self._context
        later: _Heap = []  # registered during this call: back on the heap for the next one
        try:
            while queue and queue[0][0] <= up_to_ms:
                entry = heapq.heappop(queue)
                expiry, raw_key, _ = entry
                if (expiry, raw_key) in fresh:
                    later.append(entry)
                    continue
                key = map_key_from_bytes(raw_key)
                context.set_current_key(key)
                if not state.contains(expiry):
                    continue  # deleted, or a second entry of a timer registered again
                self.delete(expiry, domain)
                yield key, expiry
        finally:
            for entry in later:
                heapq.heappush(queue, entry)

    def _fire_ordered(
        self, up_to_ms: int, domain: TimeDomain, fresh: set[tuple[int, bytes]]
    ) -> Iterator[tuple[Any, int]]:
        """:meth:`fire` on a store in key order: a merge of each key group's earliest index entry.

        The index is read as the merge advances, so it also meets timers registered
        during this call: those in ``fresh`` are passed over (they fire next call).
        """
        state, context = self._states[domain], self._context
        merge = [head for key_group in context.key_groups if (head := self._head(domain, key_group, None))]
        heapq.heapify(merge)
        while merge and merge[0][0] <= up_to_ms:
            # every entry of the earliest expiry (any key group), then its keys in key order
            expiry, due = merge[0][0], set[bytes]()
            while merge and merge[0][0] == expiry:
                _, index_key, key_group = heapq.heappop(merge)
                if (after := self._head(domain, key_group, index_key)) is not None:
                    heapq.heappush(merge, after)
                due.update(self._keys_at(domain, key_group, index_key))
            for raw_key in sorted(due):
                if (expiry, raw_key) in fresh:
                    continue
                key = map_key_from_bytes(raw_key)
                context.set_current_key(key)
                if not state.contains(expiry):
                    continue  # deleted by a handler meanwhile
                self.delete(expiry, domain)
                yield key, expiry

    def next_expiry(self, domain: TimeDomain = TimeDomain.PROCESSING) -> int | None:
        """The earliest registered timer's expiry in ``domain`` (``None`` when there is none)."""
        if self._context.delegate.ordered:
            heads = [self._head(domain, key_group, None) for key_group in self._context.key_groups]
            return min((head[0] for head in heads if head is not None), default=None)
        queue = self._queue(domain)
        state = self._states[domain]
        while queue:
            expiry, raw_key, _ = queue[0]
            self._context.set_current_key(map_key_from_bytes(raw_key))
            if state.contains(expiry):
                return expiry
            heapq.heappop(queue)
        return None

    def invalidate(self) -> None:
        """The state was loaded anew (restore, resume): rebuild the firing order from it when next needed."""
        self._queues = dict.fromkeys(TimeDomain)

    # -- the time-ordered index ------------------------------------------------------------------
    def _update_index(
        self, domain: TimeDomain, key_group: int, index_key: bytes, *, add: bytes = b"", remove: bytes = b""
    ) -> None:
        """Add or remove one key at an index entry (keys whose hashes collide share it)."""
        index = self._index[domain]
        with self._context.bound_to(key_group, index_key):
            keys = [k for k in (index.value() or []) if k != remove]
            if add and add not in keys:
                keys.append(add)
            if keys:
                index.update(keys)
            else:
                index.clear()

    def _head(self, domain: TimeDomain, key_group: int, after: bytes | None) -> tuple[int, bytes, int] | None:
        """The key group's first index entry after ``after``: ``(expiry, index key, key group)``."""
        found = self._context.delegate.entries_after(self._index[domain].name, key_group, after, 1)
        if not found:
            return None
        index_key = found[0][0]
        return _index_expiry(index_key), index_key, key_group

    def _keys_at(self, domain: TimeDomain, key_group: int, index_key: bytes) -> builtins.list[bytes]:
        """The keys with a timer at an index entry (read now: firing may have changed it)."""
        with self._context.bound_to(key_group, index_key):
            return list(self._index[domain].value() or [])

    # -- the heap (stores not in key order) -------------------------------------------------------
    def _queue(self, domain: TimeDomain) -> _Heap:
        queue = self._queues[domain]
        if queue is None:
            queue = self._queues[domain] = self._scan(domain)
        return queue

    def _scan(self, domain: TimeDomain) -> _Heap:
        """Every registered timer of ``domain`` in this backend's key groups, as a heap."""
        name = self._states[domain].name
        delegate = self._context.delegate
        queue: _Heap = []
        for key_group in self._context.key_groups:
            for raw_key, entry in delegate.entries(name, key_group):
                queue.extend((int(msgpack.unpackb(expiry)), raw_key, key_group) for expiry in entry)
        heapq.heapify(queue)
        return queue


def _checked(expiry_ms: Any) -> int:
    if isinstance(expiry_ms, bool) or not isinstance(expiry_ms, int):
        msg = f"a timer's expiry is an int of epoch milliseconds, got {expiry_ms!r}"
        raise TypeError(msg)
    if not -_OFFSET <= expiry_ms < _OFFSET:
        msg = f"a timer's expiry is a 64-bit number of epoch milliseconds, got {expiry_ms}"
        raise ValueError(msg)
    return expiry_ms
