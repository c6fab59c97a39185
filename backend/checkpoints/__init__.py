"""Checkpoints: completed checkpoint documents, the coordinator that writes and collects them, savepoints.

- :mod:`.completed`: ``chk-N.json``, every instance's snapshot and the clocks, read as untrusted;
- :mod:`.coordinator`: completing, retaining and discarding checkpoints, the driver lease, recovery;
- :mod:`.location`: a job's checkpoint location, read only (what inspection and savepoints read);
- :mod:`.savepoints`: self-contained full snapshots another job can start from.
"""

from __future__ import annotations

from .completed import CompletedCheckpoint, TimeProgress, read_checkpoints
from .coordinator import CheckpointCoordinator
from .location import CheckpointLocation, instance_key_groups, restored_read_only
from .savepoints import Savepoint, adopt_savepoint, read_savepoint, write_savepoint

__all__ = [
    "CheckpointCoordinator",
    "CheckpointLocation",
    "CompletedCheckpoint",
    "Savepoint",
    "TimeProgress",
    "adopt_savepoint",
    "instance_key_groups",
    "read_checkpoints",
    "read_savepoint",
    "restored_read_only",
    "write_savepoint",
]
