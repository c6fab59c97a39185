"""Spark's own progress of a batch joined with dstl's state figures of the same batch.

Spark reports every micro-batch as a ``StreamingQueryProgress`` on its listener
bus; the state figures of a ``foreachBatch`` query are computed after the rows
went through the plan, so ``DataFrame.observe`` cannot carry them. A listener
on Spark's bus (:class:`ProgressBridge`) waits for Spark's progress of each
batch of the query and joins it with the batch's :class:`BatchProgress`: one
document, Spark's progress with a ``dstl`` section, as ``stateOperators`` is
for Spark's own stores.

.. code-block:: python

    query.last_progress.to_json()      # {"id": ..., "batchId": 7, "numInputRows": ..., "dstl": {...}}
    query.add_progress_listener(print) # every joined batch, from Spark's listener bus
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

from .progress import BatchProgress

__all__ = ["ProgressBridge", "QueryProgress"]

log = logging.getLogger(__name__)

#: Spark keeps this many progress updates per query (spark.sql.streaming.numRecentProgressUpdates)
RECENT_PROGRESS = 100


@dataclass(frozen=True)
class QueryProgress:
    """One batch as Spark reported it (``spark``: its progress document) and as dstl did (``state``)."""

    batch_id: int
    spark: dict[str, Any]
    state: BatchProgress

    def to_json(self) -> str:
        """Spark's progress document with dstl's figures under ``dstl``."""
        return json.dumps({**self.spark, "dstl": asdict(self.state)})


class ProgressBridge(StreamingQueryListener):
    """A listener on Spark's bus that joins each progress of one query with its :class:`BatchProgress`.

    ``state_of(batch_id)`` gives dstl's figures of a batch (``None`` if the batch
    ran no state work, e.g. a batch Spark replayed before this run). Spark posts a
    batch's progress after ``foreachBatch`` returned, so the figures are there.
    Progress of other queries is ignored; progress posted before the query id is
    known (:meth:`bind`) waits for it.
    """

    def __init__(self, state_of: Callable[[int], BatchProgress | None]) -> None:
        self._state_of = state_of
        self._lock = threading.Lock()
        self._query_id: str | None = None
        self._streams: Any = None
        self._early: list[Any] = []
        self.recent: deque[QueryProgress] = deque(maxlen=RECENT_PROGRESS)
        self.listeners: list[Callable[[QueryProgress], None]] = []

    def bind(self, query_id: str, streams: Any = None) -> None:
        """The Spark query (``StreamingQuery.id``) whose progress to join.

        With ``streams`` (the session's ``StreamingQueryManager``) the bridge leaves
        the bus by itself when the query terminates.
        """
        with self._lock:
            self._query_id = query_id
            self._streams = streams
            early, self._early = self._early, []
        for progress in early:
            self._join(progress)

    def onQueryStarted(self, event: Any) -> None:
        """Nothing to join yet."""

    def onQueryProgress(self, event: Any) -> None:
        """Join Spark's progress of one batch with the batch's state figures."""
        progress = event.progress
        with self._lock:
            if self._query_id is None:
                self._early.append(progress)
                return
        self._join(progress)

    def onQueryIdle(self, event: Any) -> None:
        """No batch ran."""

    def onQueryTerminated(self, event: Any) -> None:
        """Leave Spark's bus once the query ended (not from the bus's own thread)."""
        with self._lock:
            ours = self._query_id is not None and str(event.id) == self._query_id
            streams = self._streams
        if ours and streams is not None:
            leave = threading.Thread(target=self._leave, args=(streams,), name="dstl-bridge", daemon=True)
            leave.start()

    def _leave(self, streams: Any) -> None:
        try:
            streams.removeListener(self)
        except Exception:
            log.debug("dstl progress bridge could not leave the listener bus", exc_info=True)

    def _join(self, progress: Any) -> None:
        if str(progress.id) != self._query_id:  # another query's (also among the early ones)
            return
        state = self._state_of(int(progress.batchId))
        if state is None:
            return
        joined = QueryProgress(int(progress.batchId), json.loads(progress.json), state)
        self.recent.append(joined)
        for listener in list(self.listeners):
            try:
                listener(joined)
            except Exception:  # a failing listener must not stop Spark's bus for the others
                log.exception("dstl progress listener %r failed on batch %s", listener, joined.batch_id)
