"""Spark's own progress of a batch joined with dstl's state figures of the same batch.

Spark reports every micro-batch as a ``StreamingQueryProgress`` on its listener
bus; the state figures of a ``foreachBatch`` query are computed after the rows
went through the plan, so ``DataFrame.observe`` cannot carry them. A listener
on Spark's bus (:class:`ProgressBridge`) waits for Spark's progress of each
batch of the query and joins it with the batch's :class:`BatchProgress`: one
document: Spark's progress with dstl's operator in ``stateOperators`` (Spark's
fields, dstl's own figures in its ``customMetrics``), the rows written in
``sink.numOutputRows``, and every figure of the batch under ``dstl``.

.. code-block:: python

    query.last_progress["stateOperators"][0]["numRowsTotal"]  # as on Spark's own operators
    query.last_progress.json                                   # the document as text
    query.add_progress_listener(print)  # every joined batch, from Spark's listener bus
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

from .progress import BatchProgress

__all__ = ["OPERATOR_NAME", "ProgressBridge", "QueryProgress", "state_operator"]

log = logging.getLogger(__name__)

#: Spark keeps this many progress updates per query (spark.sql.streaming.numRecentProgressUpdates)
RECENT_PROGRESS = 100


#: dstl's operator as ``stateOperators`` names it
OPERATOR_NAME = "dstlTransformWithState"


@dataclass(frozen=True)
class QueryProgress(Mapping[str, Any]):
    """One batch as Spark reported it (``spark``: its progress document) and as dstl did (``state``).

    Reads like PySpark's ``StreamingQueryProgress`` (``progress["batchId"]``,
    ``.json``, ``.prettyJson``): Spark's document with dstl's operator in
    ``stateOperators``, its output rows in ``sink.numOutputRows`` and the batch's
    figures under ``dstl``.
    """

    batch_id: int
    spark: dict[str, Any]
    state: BatchProgress
    #: operator instances (Spark's ``numShufflePartitions`` and ``numStateStoreInstances``)
    parallelism: int = 0
    #: figures known at the call (the processor's state-variable counts), added to ``customMetrics``
    declared: Mapping[str, int] = field(default_factory=dict)
    #: the query's later stateful steps' figures of the batch, in order, with their parallelism
    later: tuple[tuple[BatchProgress, int], ...] = ()

    @functools.cached_property
    def document(self) -> dict[str, Any]:
        """The joined document (built once)."""
        document = dict(self.spark)
        spark_operators = [
            op for op in document.get("stateOperators") or () if op.get("operatorName") != OPERATOR_NAME
        ]
        operator = state_operator(self.state, self.parallelism)
        operator["customMetrics"] = {**self.declared, **operator["customMetrics"]}
        later = [state_operator(state, parallelism) for state, parallelism in self.later]
        document["stateOperators"] = [*spark_operators, operator, *later]
        written = self.later[-1][0] if self.later else self.state  # the last step writes to the sink
        document["sink"] = {**(document.get("sink") or {}), "numOutputRows": written.output_rows}
        document["dstl"] = asdict(self.state)
        return document

    @functools.cached_property
    def as_spark(self) -> Any:
        """The document as PySpark's own ``StreamingQueryProgress`` (``.stateOperators[0].customMetrics``)."""
        from pyspark.sql.streaming.listener import StreamingQueryProgress

        return StreamingQueryProgress.fromJson(self.document)

    def __getattr__(self, name: str) -> Any:
        # Spark's attribute names (batchId, stateOperators, sink...) read as on Spark's progress
        if name.startswith("_") or name in {"batch_id", "spark", "state", "parallelism", "declared", "later"}:
            raise AttributeError(name)
        return getattr(self.as_spark, name)

    def __getitem__(self, name: str) -> Any:
        return self.document[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.document)

    def __len__(self) -> int:
        return len(self.document)

    @property
    def json(self) -> str:
        """The document as compact JSON (PySpark's ``StreamingQueryProgress.json``)."""
        return json.dumps(self.document)

    @property
    def prettyJson(self) -> str:
        """The document as indented JSON."""
        return json.dumps(self.document, indent=4)

    def to_json(self) -> str:
        """:attr:`json`."""
        return self.json


def state_operator(state: BatchProgress, parallelism: int) -> dict[str, Any]:
    """The operator's figures in Spark's ``StateOperatorProgress`` shape.

    Rows are the working state's (a key's entry in one state is a row); updates and
    removals count the changes logged; commit time is the slowest instance's persist.
    """
    return {
        "operatorName": OPERATOR_NAME,
        "numRowsTotal": state.state_rows,
        "numRowsUpdated": state.rows_updated,
        "allUpdatesTimeMs": round(state.task_phases_ms.get("process", 0.0)),
        "numRowsRemoved": state.rows_removed,
        "allRemovalsTimeMs": 0,  # removals are part of the process phase (allUpdatesTimeMs)
        "commitTimeMs": round(state.checkpoint_ms),
        "memoryUsedBytes": state.memory_bytes,
        "numRowsDroppedByWatermark": state.late_rows,
        "numShufflePartitions": parallelism,
        "numStateStoreInstances": parallelism,
        "customMetrics": {
            "persistedBytes": state.persisted_bytes,
            "fullCheckpointBytes": state.full_checkpoint_bytes,
            "warmInstances": state.warm_instances,
            "caughtUpInstances": state.caught_up,
            "fullRestores": state.full_restores,
            "restoredBytes": state.restored_bytes,
            "restoreTimeMs": round(state.restore_ms),
            "materializedInstances": len(state.materialized),
            "timersFired": state.timers_fired,
            "numExpiredTimers": state.timers_fired,  # Spark's name of the same figure
            "wokenInstances": state.woken_instances,
            "expiredRemoved": state.expired_removed,
        },
    }


class ProgressBridge(StreamingQueryListener):
    """A listener on Spark's bus that joins each progress of one query with its :class:`BatchProgress`.

    ``state_of(batch_id)`` gives dstl's figures of a batch (``None`` if the batch
    ran no state work, e.g. a batch Spark replayed before this run); ``later`` gives
    those of the query's later stateful steps, each with its parallelism. Spark posts a
    batch's progress after ``foreachBatch`` returned, so the figures are there.
    Progress of other queries is ignored; progress posted before the query id is
    known (:meth:`bind`) waits for it.
    """

    def __init__(
        self,
        state_of: Callable[[int], BatchProgress | None],
        parallelism: int = 0,
        declared: Mapping[str, int] | None = None,
        later: Sequence[tuple[Callable[[int], BatchProgress | None], int]] = (),
    ) -> None:
        self._state_of = state_of
        self._parallelism = parallelism
        self._declared = dict(declared or {})
        self._later = tuple(later)
        self._lock = threading.Lock()
        self._query_id: str | None = None
        self._leave: Callable[[], None] | None = None
        self._early: list[Any] = []
        self.recent: deque[QueryProgress] = deque(maxlen=RECENT_PROGRESS)
        self.listeners: list[Callable[[QueryProgress], None]] = []

    def bind(self, query_id: str, leave: Callable[[], None] | None = None) -> None:
        """The Spark query (``StreamingQuery.id``) whose progress to join.

        ``leave`` is called once the query terminated (the bridge leaves the
        session's listener hub by itself).
        """
        with self._lock:
            self._query_id = query_id
            self._leave = leave
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
        """Leave once the query ended."""
        with self._lock:
            leave = self._leave if self._query_id is not None and str(event.id) == self._query_id else None
        if leave is not None:
            leave()

    def joined(self, progress: Any) -> QueryProgress | None:
        """Spark's progress of a batch joined with its figures (``None``: the batch ran no state work)."""
        state = self._state_of(int(progress.batchId))
        if state is None:
            return None
        batch_id = int(progress.batchId)
        later = tuple(
            (figures, parallelism)
            for state_of, parallelism in self._later
            if (figures := state_of(batch_id)) is not None
        )
        return QueryProgress(
            batch_id, json.loads(progress.json), state, self._parallelism, self._declared, later
        )

    def _join(self, progress: Any) -> None:
        if str(progress.id) != self._query_id:  # another query's (also among the early ones)
            return
        joined = self.joined(progress)
        if joined is None:
            return
        self.recent.append(joined)
        for listener in list(self.listeners):
            try:
                listener(joined)
            except Exception:  # a failing listener must not stop Spark's bus for the others
                log.exception("dstl progress listener %r failed on batch %s", listener, joined.batch_id)
