"""The changelog keyed-state backend (engine-agnostic) and ``dstl.backend.spark``.

- key → key-group hashing that matches Spark SQL's
  ``pmod(xxhash64(...), max_parallelism)`` exactly (:mod:`dstl.backend.keygroups`);
- keyed state (Value, List, Map, Reducing, optional TTL) bound to a current key,
  and per-key timers in processing and event time kept as keyed state
  (:mod:`dstl.backend.keyed`),
  safe serialization (msgpack by default, pickle only by name), heap and LMDB
  delegates, and the changelog layer: every mutation applied and logged,
  registrations logged as metadata, checkpoint = snapshot chain + persisted log,
  restore (and rescale) = snapshot sections + log filtered by key group
  (:class:`ChangelogKeyedStateBackend`);
- background materialization, full and incremental, in per-key-group sections;
- the checkpoint coordinator: completed checkpoints as JSON, retention, a
  shared-state registry that discards unreferenced log locations and snapshots,
  recovery that removes what a crash left behind.
"""

from __future__ import annotations

from .changelog import BackendSnapshot, ChangelogKeyedStateBackend
from .checkpoints import CheckpointCoordinator, CompletedCheckpoint, TimeProgress
from .delegate import HeapDelegate, StateDelegate
from .keyed import (
    ListState,
    MapState,
    ReducingState,
    StateDescriptor,
    StateKind,
    TimeDomain,
    TimerService,
    ValueState,
)
from .keygroups import (
    DEFAULT_MAX_PARALLELISM,
    key_group_for,
    key_group_range_for_instance,
    spark_key_group_expr,
    spark_xxhash64,
)
from .pacing import foreground
from .serialization import MsgpackSerializer, PickleSerializer, Serializer

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
    "TimeDomain",
    "TimeProgress",
    "TimerService",
    "ValueState",
    "foreground",
    "key_group_for",
    "key_group_range_for_instance",
    "spark_key_group_expr",
    "spark_xxhash64",
]
