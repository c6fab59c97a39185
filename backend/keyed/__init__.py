"""Keyed state: states bound to a current key, their timers and TTL, over a :class:`KeyedContext`.

The bottom layer of the backend: nothing here knows the changelog, the
materializer or Spark. The changelog backend implements :class:`KeyedContext`.
"""

from __future__ import annotations

from .context import KeyedContext
from .factories import StateFactories
from .ops import REPLACING, Op
from .state import (
    KeySet,
    ListState,
    MapState,
    ReducingState,
    StateDescriptor,
    StateKind,
    ValueState,
    map_key_bytes,
    map_key_from_bytes,
    map_keys_bytes,
)
from .timers import RESERVED_PREFIX, TimeDomain, TimerService
from .ttl import TTL_SUFFIX, purge_expired, unstamp

__all__ = [
    "REPLACING",
    "RESERVED_PREFIX",
    "TTL_SUFFIX",
    "KeySet",
    "KeyedContext",
    "ListState",
    "MapState",
    "Op",
    "ReducingState",
    "StateDescriptor",
    "StateFactories",
    "StateKind",
    "TimeDomain",
    "TimerService",
    "ValueState",
    "map_key_bytes",
    "map_keys_bytes",
    "map_key_from_bytes",
    "purge_expired",
    "unstamp",
]
