"""Where a running query finds the batches its run completed: in its runner, or in progress records.

On a classic session the runner runs in the caller's process (:class:`RunnerLedger`);
on Spark Connect it runs in the server's ``foreachBatch`` process, and the caller
learns of each batch from Spark's progress events and the batch's progress record
(:class:`RecordedLedger`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ...checkpoints.completed import read_checkpoints
from ...filesystems import checkpoint_fs

if TYPE_CHECKING:
    from ...checkpoints import CompletedCheckpoint
    from ..progress import BatchProgress
    from ..query_progress import ProgressBridge, QueryProgress
    from .runner import BatchRunner

__all__ = ["BatchLedger", "RecordedLedger", "RunnerLedger"]

#: How long a recorded ledger waits for the progress events of batches Spark reported
#: processed (they come on Spark's listener bus, in moments).
_EVENTS_WAIT_S = 30.0


class BatchLedger(Protocol):
    """The batches a query's run completed, their figures, and waiting for more."""

    def recent(self) -> list[BatchProgress]:
        """Figures of the batches this run completed (the newest ones), oldest first."""
        ...

    def completed_batches(self) -> int:
        """How many batches this run completed."""
        ...

    def add_listener(self, listener: Callable[[BatchProgress], None]) -> None:
        """Call ``listener`` after every completed batch."""
        ...

    def wait_for(self, count: int, timeout: float, ended: Callable[[], bool]) -> bool:
        """Wait until ``count`` batches completed; ``False`` on timeout or once ``ended()``."""
        ...

    def catch_up(self, processed: Callable[[], int], ended: Callable[[], bool]) -> None:
        """Return once this ledger counted the ``processed()`` batches Spark reports processed.

        Called right after Spark's ``processAllAvailable``; ``processed`` is read only
        by a ledger that can lag behind Spark.
        """
        ...

    def latest_checkpoint(self) -> CompletedCheckpoint | None:
        """The newest completed state checkpoint."""
        ...


class RunnerLedger:
    """The runner runs in this process: its own figures, condition and coordinator."""

    def __init__(self, runner: BatchRunner) -> None:
        self._runner = runner

    def recent(self) -> list[BatchProgress]:
        with self._runner.completed:
            return list(self._runner.progress)

    def completed_batches(self) -> int:
        return self._runner.completed_batches

    def add_listener(self, listener: Callable[[BatchProgress], None]) -> None:
        self._runner.listeners.append(listener)

    def wait_for(self, count: int, timeout: float, ended: Callable[[], bool]) -> bool:
        return _wait(self._runner.completed, lambda: self._runner.completed_batches, count, timeout, ended)

    def catch_up(self, processed: Callable[[], int], ended: Callable[[], bool]) -> None:
        pass  # the runner completes a batch inside Spark's foreachBatch, before Spark returns

    def latest_checkpoint(self) -> CompletedCheckpoint | None:
        return self._runner.coordinator.latest()


class RecordedLedger:
    """The runner runs elsewhere (a Connect server): batches as Spark's progress events join their records.

    A batch counts once Spark reported it and its record joined (the bridge's
    listeners run on the client's listener thread).
    """

    def __init__(self, bridge: ProgressBridge, state_dir: str, job_id: str, config: Any) -> None:
        self._bridge = bridge
        self._state_dir = state_dir
        self._job_id = job_id
        self._config = config
        self._completed = 0
        self._changed = threading.Condition()
        bridge.listeners.append(self._count)

    def _count(self, progress: QueryProgress) -> None:
        with self._changed:
            self._completed += 1
            self._changed.notify_all()

    def recent(self) -> list[BatchProgress]:
        return [progress.state for progress in list(self._bridge.recent)]

    def completed_batches(self) -> int:
        with self._changed:
            return self._completed

    def add_listener(self, listener: Callable[[BatchProgress], None]) -> None:
        self._bridge.listeners.append(lambda progress: listener(progress.state))

    def wait_for(self, count: int, timeout: float, ended: Callable[[], bool]) -> bool:
        return _wait(self._changed, lambda: self._completed, count, timeout, ended)

    def catch_up(self, processed: Callable[[], int], ended: Callable[[], bool]) -> None:
        # a batch's progress event can come after processAllAvailable returned
        _wait(self._changed, lambda: self._completed, processed(), _EVENTS_WAIT_S, ended)

    def latest_checkpoint(self) -> CompletedCheckpoint | None:
        fs, root = checkpoint_fs(self._state_dir, self._config)
        completed, _ = read_checkpoints(fs, f"{root}/{self._job_id}/checkpoints")
        return completed[-1] if completed else None


def _wait(
    changed: threading.Condition,
    completed: Callable[[], int],
    count: int,
    timeout: float,
    ended: Callable[[], bool],
) -> bool:
    """Wait on ``changed`` until ``completed()`` reaches ``count``; ``False`` on timeout or ``ended()``."""
    deadline = time.monotonic() + timeout
    with changed:
        while completed() < count:
            remaining = deadline - time.monotonic()
            if ended() or remaining <= 0:
                return False
            changed.wait(min(remaining, 0.5))
    return True
