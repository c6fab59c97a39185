"""Metrics of one changelog backend, named as in Flink's changelog state backend."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .materializer import Materializer
    from .snapshot import BackendSnapshot

__all__ = ["BackendMetrics"]


@dataclass
class BackendMetrics:
    """Sizes of the latest checkpoint and durations; materialization counts come from the materializer.

    *Materialized* state is the snapshot chain a checkpoint references, *non-materialized*
    state the log after it. "Full" is everything the checkpoint references, "incremental"
    what was uploaded for it (snapshots new since the previous checkpoint, change sets
    persisted by this checkpoint).
    """

    full_materialized: int = 0
    incremental_materialized: int = 0
    full_non_materialized: int = 0
    incremental_non_materialized: int = 0
    checkpoint_seconds: float = 0.0
    restore_seconds: float = 0.0
    expired_removed: int = 0  # values, list elements and map entries TTL removed from the working state
    rows_updated: int = 0  # changes that wrote, since the checkpoint before the latest
    rows_removed: int = 0  # changes that removed (clears, map removals, TTL clears), likewise
    _previous_refs: frozenset[str] = field(default_factory=frozenset)

    def continued_from(self, snapshot: BackendSnapshot) -> None:
        """The backend continues ``snapshot`` (restored, resumed or caught up): its snapshots are not new."""
        self._previous_refs = frozenset(ref.path for ref in snapshot.all_materialized)

    def checkpointed(self, snapshot: BackendSnapshot, seconds: float, changes: tuple[int, int]) -> None:
        """Record a completed checkpoint of the backend and the ``(updates, removals)`` it holds."""
        self.rows_updated, self.rows_removed = changes
        paths = frozenset(ref.path for ref in snapshot.all_materialized)
        self.full_materialized = sum(ref.size for ref in snapshot.all_materialized)
        self.incremental_materialized = sum(
            ref.size for ref in snapshot.all_materialized if ref.path not in self._previous_refs
        )
        self.full_non_materialized = sum(handle.size for handle in snapshot.all_handles)
        self.incremental_non_materialized = sum(handle.incremental_size for handle in snapshot.handles[-1:])
        self.checkpoint_seconds = seconds
        self._previous_refs = paths

    def as_dict(self, materializer: Materializer) -> dict[str, float]:
        """The metrics by their Flink names (sizes in bytes, durations in milliseconds)."""
        return {
            "lastFullSizeOfMaterializedState": self.full_materialized,
            "lastIncSizeOfMaterializedState": self.incremental_materialized,
            "lastFullSizeOfNonMaterializedState": self.full_non_materialized,
            "lastIncSizeOfNonMaterializedState": self.incremental_non_materialized,
            "numberOfStartedMaterialization": materializer.started,
            "numberOfCompletedMaterialization": materializer.completed,
            "numberOfFailedMaterialization": materializer.failed,
            "lastDurationOfMaterialization": round(materializer.last_duration * 1000, 3),
            "lastCheckpointDuration": round(self.checkpoint_seconds * 1000, 3),
            "lastRestoreDuration": round(self.restore_seconds * 1000, 3),
            "numberOfExpiredEntriesRemoved": self.expired_removed,
            "lastNumRowsUpdated": self.rows_updated,
            "lastNumRowsRemoved": self.rows_removed,
        }
