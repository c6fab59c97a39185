"""A running stateful query: the Spark query plus per-batch progress, listeners and waiting."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

    from ..checkpoints import CompletedCheckpoint
    from ._private.ledgers import BatchLedger
    from .progress import BatchProgress
    from .query_progress import ProgressBridge, QueryProgress

__all__ = ["StatefulQuery"]


class StatefulQuery:
    """A running stateful query: the Spark query plus per-batch progress and listeners."""

    def __init__(
        self,
        ledger: BatchLedger,
        query: StreamingQuery,
        bridge: ProgressBridge,
        leave: Callable[[], None],
    ) -> None:
        self._ledger = ledger
        self._bridge = bridge
        self._leave = leave  # the bridge leaves the session's listener hub
        self.query = query

    @property
    def progress(self) -> list[BatchProgress]:
        """Figures of the batches completed by this run, oldest first.

        The latest 1000; on Spark Connect the latest 100 (as Spark's ``recentProgress``).
        """
        return self._ledger.recent()

    @property
    def completed_batches(self) -> int:
        """How many batches this run completed."""
        return self._ledger.completed_batches()

    @property
    def recent_progress(self) -> list[QueryProgress]:
        """Spark's ``recentProgress`` (up to 100 batches) joined with the batches' state figures.

        Current as Spark's: read from the query, not from the listener bus, so the batch
        ``process_all_available`` waited for is there when it returns. Spark's progress
        of a trigger that ran no batch, and of batches before this run, is left out.
        """
        joined = (self._bridge.joined(progress) for progress in self.query.recentProgress)
        return [progress for progress in joined if progress is not None]

    @property
    def last_progress(self) -> QueryProgress | None:
        """The newest of :attr:`recent_progress` (``None`` before the first batch)."""
        for progress in reversed(self.query.recentProgress):  # joins only the one it returns
            joined = self._bridge.joined(progress)
            if joined is not None:
                return joined
        return None

    def add_listener(self, listener: Callable[[BatchProgress], None]) -> None:
        """Call ``listener`` after every completed batch (on the query's thread; keep it short)."""
        self._ledger.add_listener(listener)

    def add_progress_listener(self, listener: Callable[[QueryProgress], None]) -> None:
        """Call ``listener`` with Spark's progress of every batch joined with its state figures.

        Runs on Spark's listener bus, after Spark reported the batch.
        """
        self._bridge.listeners.append(listener)

    def wait_for_batches(self, count: int, timeout: float) -> bool:
        """Wait until this run completed ``count`` batches; ``False`` on timeout or query failure."""
        return self._ledger.wait_for(
            count, timeout, lambda: self.query.exception() is not None or not self.query.isActive
        )

    def process_all_available(self) -> None:
        """Block until every input available now is processed (then :meth:`stop` ends between batches).

        Then :attr:`completed_batches` and the listeners have seen those batches too: on
        Spark Connect they learn of a batch from Spark's progress event, which can come
        after ``processAllAvailable`` returned (a query's figures read right after it
        missed its last batch).
        """
        self.query.processAllAvailable()
        self._ledger.catch_up(self._batches_processed, lambda: not self.query.isActive)

    def _batches_processed(self) -> int:
        """How many of this run's batches Spark's ``recentProgress`` shows processed."""
        return sum(self._bridge.joined(progress) is not None for progress in self.query.recentProgress)

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait for the query to end (e.g. an ``availableNow`` trigger ran out of input)."""
        # PySpark takes seconds as an int in its hints, any number at run time
        seconds: Any = timeout
        ended = self.query.awaitTermination(seconds) if timeout is not None else self.query.awaitTermination()
        return bool(ended)

    def stop(self) -> None:
        """Stop the Spark query (its progress bridge stops listening)."""
        try:
            self.query.stop()
        finally:
            self._leave()

    def exception(self) -> Exception | None:
        """The query's failure, if any."""
        return self.query.exception()

    # Spark's StreamingQuery names, so that code written for Spark's query runs unchanged

    @property
    def id(self) -> str:
        """Spark's query id (stable across restarts of one checkpoint location)."""
        return str(self.query.id)

    @property
    def runId(self) -> str:
        """Spark's id of this run."""
        return str(self.query.runId)

    @property
    def name(self) -> str | None:
        """The query's name (``queryName``)."""
        return self.query.name

    @property
    def isActive(self) -> bool:
        """Whether the query runs."""
        return bool(self.query.isActive)

    @property
    def status(self) -> dict[str, Any]:
        """Spark's ``status``."""
        return dict(self.query.status)

    @property
    def lastProgress(self) -> QueryProgress | None:
        """:attr:`last_progress`, by Spark's name."""
        return self.last_progress

    @property
    def recentProgress(self) -> list[QueryProgress]:
        """:attr:`recent_progress`, by Spark's name."""
        return self.recent_progress

    def processAllAvailable(self) -> None:
        """:meth:`process_all_available`, by Spark's name."""
        self.process_all_available()

    def awaitTermination(self, timeout: float | None = None) -> bool | None:
        """Spark's ``awaitTermination``: ``None`` without a timeout, else whether the query ended."""
        ended = self.await_termination(timeout)
        return ended if timeout is not None else None

    def explain(self, extended: bool = False) -> None:
        """Spark's plan of the query's latest batch."""
        self.query.explain(extended)

    def latest_checkpoint(self) -> CompletedCheckpoint | None:
        """The newest completed state checkpoint."""
        return self._ledger.latest_checkpoint()
