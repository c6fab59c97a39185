"""The changelog keyed-state backend (engine-agnostic) and ``dstl.backend.spark``.

Present so far:

- key → key-group hashing that matches Spark SQL's
  ``pmod(xxhash64(...), max_parallelism)`` exactly (:mod:`dstl.backend.keygroups`);
- keyed state (Value, List, Map, Reducing) bound to a current key, safe
  serialization (msgpack by default, pickle only by name), a heap delegate, and
  the changelog layer: every mutation applied and logged, registrations logged
  as metadata, checkpoint = persist, restore (and rescale) = replay filtered by
  key group (:class:`ChangelogKeyedStateBackend`).

- full materialization in per-key-group sections, truncation on confirm;
- the checkpoint coordinator: completed checkpoints as JSON, retention, a
  shared-state registry that discards unreferenced log locations and snapshots,
  recovery that removes what a crash left behind.

Incremental materialization, the on-disk delegate, TTL, metrics and the Spark
integration land with their issues.
"""

from __future__ import annotations

from .changelog import BackendSnapshot, ChangelogKeyedStateBackend
from .coordinator import CheckpointCoordinator, CompletedCheckpoint
from .delegate import HeapDelegate, StateDelegate
from .keygroups import (
    DEFAULT_MAX_PARALLELISM,
    key_group_for,
    key_group_range_for_instance,
    spark_key_group_expr,
    spark_xxhash64,
)
from .serialization import MsgpackSerializer, PickleSerializer, Serializer
from .state import ListState, MapState, ReducingState, StateDescriptor, StateKind, ValueState

__all__ = [
    "DEFAULT_MAX_PARALLELISM",
    "BackendSnapshot",
    "ChangelogKeyedStateBackend",
    "CheckpointCoordinator",
    "CompletedCheckpoint",
    "HeapDelegate",
    "ListState",
    "MapState",
    "MsgpackSerializer",
    "PickleSerializer",
    "ReducingState",
    "Serializer",
    "StateDelegate",
    "StateDescriptor",
    "StateKind",
    "ValueState",
    "key_group_for",
    "key_group_range_for_instance",
    "spark_key_group_expr",
    "spark_xxhash64",
]
