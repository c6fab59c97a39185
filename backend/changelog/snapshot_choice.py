"""Full or incremental: what a started materialization decides in the background, and how."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..delegate import StateView
    from .changed_keys import ChangedKeys

__all__ = ["DETACH_SHARE", "SnapshotChoice"]

#: An incremental snapshot that reads at least this share of the full snapshot's keys reads
#: a copy of the state too (:meth:`SnapshotChoice.detach_if_long`): copying every page costs
#: far less than reading and encoding a quarter of the keys in Python.
DETACH_SHARE = 0.25


@dataclass(frozen=True)
class SnapshotChoice:
    """What decides between a full and an incremental snapshot, taken when a materialization starts.

    With the state's view and the resumed log to read, it goes to the background thread.
    """

    view: StateView  # the state at the materialization's SQN
    resumed_log: Callable[[Callable[[str, int, bytes], None]], None] | None  # keys changed since the chain
    forced: bool  # asked for, every k-th one, or TTL due
    full_keys: int  # entries of the chain's full snapshot
    chain_keys: int  # entries of its incrementals
    per_group: float  # entries per key group of the full snapshot (a whole group's estimate)
    bridging: bool  # a full snapshot also writes the incremental bridging the previous chain

    def outgrown(self, dirty: ChangedKeys) -> bool:
        """Whether the incrementals with ``dirty`` would reach the size of a full snapshot."""
        return self.chain_keys + dirty.estimate(self.per_group) >= self.full_keys

    def detach_if_long(self, full: bool, dirty: ChangedKeys) -> None:
        """Detach the view onto a copy of the state when the snapshot reads much of it.

        A long read of the live store keeps every page the batches replace meanwhile
        from reuse (:meth:`~dstl.backend.delegate.StateView.detach`).
        """
        if full or dirty.estimate(self.per_group) >= DETACH_SHARE * self.full_keys:
            self.view.detach()
