"""One checkpoint of a benchmark configuration: changelog, or changelog off with a snapshot."""

from __future__ import annotations

import time
from dataclasses import dataclass

from dstl.backend.changelog import BackendSnapshot, ChangelogKeyedStateBackend
from dstl.backend.delegate import StateDelegate


def entry_count(delegate: StateDelegate) -> int:
    """Entries the delegate holds, over every state and key group."""
    return sum(len(group) for groups in delegate.snapshot().values() for group in groups.values())


@dataclass(frozen=True)
class CheckpointFigures:
    """Duration, bytes uploaded for the checkpoint, bytes a restore reads, and what to restore."""

    seconds: float
    checkpointed: int
    full_size: int
    snapshot: BackendSnapshot


def take_checkpoint(backend: ChangelogKeyedStateBackend, checkpoint_id: int, mode: str) -> CheckpointFigures:
    """``changelog``: persist the log (and confirm); ``full``/``incremental``: upload a snapshot."""
    began = time.perf_counter()
    if mode == "changelog":
        snapshot = backend.checkpoint(checkpoint_id).result(timeout=600)
        elapsed = time.perf_counter() - began
        backend.notify_checkpoint_complete(snapshot)
        metrics = backend.metrics()
        return CheckpointFigures(
            elapsed,
            metrics["lastIncSizeOfMaterializedState"] + metrics["lastIncSizeOfNonMaterializedState"],
            metrics["lastFullSizeOfMaterializedState"] + metrics["lastFullSizeOfNonMaterializedState"],
            snapshot,
        )
    ref = backend.materialize().result(timeout=600)
    elapsed = time.perf_counter() - began
    chain = backend.materializer.chain
    full_size = sum(r.size for r in chain)
    return CheckpointFigures(elapsed, ref.size, full_size, BackendSnapshot(checkpoint_id, (), chain))
