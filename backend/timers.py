"""Per-key timers in processing time and event time, kept as keyed state.

A timer is an entry of an internal map state (one per time domain): under the
key it belongs to, map key = its expiry in epoch milliseconds. So timers are
logged in the changelog under their key's key group, materialized, restored and
rescaled with that key group, exactly like the state they drive.

Firing order is time, then key (the key's stored bytes). A timer is removed from
state as it fires, in the same checkpoint interval as whatever its handler
writes: a batch replayed after a failure finds it registered again and fires it
again, and a completed checkpoint never holds a fired timer, so across replays
each timer's effects are committed once.

The order of firing comes from an in-memory heap per domain, built from the
state when first needed after the state was loaded (restore, resume) and kept up
to date by registrations; deletions are resolved when a deleted timer reaches
the top (it is no longer in state). Its memory grows with the number of timers,
not with the rest of the state.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import msgpack

from .state import StateDescriptor, StateKind, map_key_from_bytes

if TYPE_CHECKING:
    from .changelog.backend import ChangelogKeyedStateBackend
    from .state import MapState

__all__ = ["RESERVED_PREFIX", "TimeDomain", "TimerService"]

#: State names starting with this are dstl's own (timers); users cannot register them.
RESERVED_PREFIX = "__dstl."


class TimeDomain(enum.Enum):
    """The clock a timer follows."""

    PROCESSING = "processing"
    EVENT = "event"


class TimerService:
    """Register, delete, list and fire the current key's timers (one per backend)."""

    def __init__(self, backend: ChangelogKeyedStateBackend) -> None:
        self._backend = backend
        self._states: dict[TimeDomain, MapState] = {
            domain: backend._register(
                StateDescriptor(f"{RESERVED_PREFIX}timers.{domain.value}", StateKind.MAP)
            )
            for domain in TimeDomain
        }
        # Per domain: (expiry ms, key bytes, key group); None until built from the state.
        self._queues: dict[TimeDomain, list[tuple[int, bytes, int]] | None] = dict.fromkeys(TimeDomain)

    def register(self, expiry_ms: int, domain: TimeDomain = TimeDomain.PROCESSING) -> None:
        """Register a timer of the current key at ``expiry_ms`` (registering it again changes nothing)."""
        expiry_ms = _checked(expiry_ms)
        state = self._states[domain]
        if state.contains(expiry_ms):
            return
        state.put(expiry_ms, True)
        queue = self._queues[domain]
        if queue is not None:
            key_group, key = self._backend._current()
            heapq.heappush(queue, (expiry_ms, key, key_group))

    def delete(self, expiry_ms: int, domain: TimeDomain = TimeDomain.PROCESSING) -> None:
        """Delete the current key's timer at ``expiry_ms`` (no-op when there is none)."""
        self._states[domain].remove(_checked(expiry_ms))

    def list(self, domain: TimeDomain = TimeDomain.PROCESSING) -> list[int]:
        """The current key's timers, earliest first."""
        return sorted(int(expiry) for expiry, _ in self._states[domain].items())

    def fire(self, up_to_ms: int, domain: TimeDomain = TimeDomain.PROCESSING) -> Iterator[tuple[Any, int]]:
        """Fire every timer due at ``up_to_ms`` (expiry <= it): ``(key, expiry ms)``, time then key order.

        Before each ``(key, expiry)`` is yielded, the key is made current and the timer
        removed from state; a handler run at that point writes to the key's state.
        Timers the handler registers that are due by ``up_to_ms`` fire in this call too.
        """
        queue = self._queue(domain)
        state = self._states[domain]
        backend = self._backend
        while queue and queue[0][0] <= up_to_ms:
            expiry, raw_key, _ = heapq.heappop(queue)
            key = map_key_from_bytes(raw_key)
            backend.set_current_key(key)
            if not state.contains(expiry):
                continue  # deleted, or a second entry of a timer registered again
            state.remove(expiry)
            yield key, expiry

    def next_expiry(self, domain: TimeDomain = TimeDomain.PROCESSING) -> int | None:
        """The earliest registered timer's expiry in ``domain`` (``None`` when there is none)."""
        queue = self._queue(domain)
        state = self._states[domain]
        while queue:
            expiry, raw_key, _ = queue[0]
            self._backend.set_current_key(map_key_from_bytes(raw_key))
            if state.contains(expiry):
                return expiry
            heapq.heappop(queue)
        return None

    def invalidate(self) -> None:
        """The state was loaded anew (restore, resume): rebuild the firing order from it when next needed."""
        self._queues = dict.fromkeys(TimeDomain)

    def _queue(self, domain: TimeDomain) -> list[tuple[int, bytes, int]]:
        queue = self._queues[domain]
        if queue is None:
            queue = self._queues[domain] = self._scan(domain)
        return queue

    def _scan(self, domain: TimeDomain) -> list[tuple[int, bytes, int]]:
        """Every registered timer of ``domain`` in this backend's key groups, as a heap."""
        name = self._states[domain].name
        delegate = self._backend.delegate
        queue = []
        for key_group in self._backend.key_groups:
            for raw_key, entry in delegate.entries(name, key_group):
                queue.extend((int(msgpack.unpackb(expiry)), raw_key, key_group) for expiry in entry)
        heapq.heapify(queue)
        return queue


def _checked(expiry_ms: Any) -> int:  # noqa: ANN401 - caller input
    if isinstance(expiry_ms, bool) or not isinstance(expiry_ms, int):
        msg = f"a timer's expiry is an int of epoch milliseconds, got {expiry_ms!r}"
        raise TypeError(msg)
    return expiry_ms
