"""Driver side: run a stateful processor over a streaming DataFrame with the changelog backend.

Each micro-batch (``foreachBatch``):

1. checkpoint ``batch_id - 1`` is the base (a replayed batch drops anything newer);
2. rows are routed by key group to their operator instance (stable placement) and
   every instance with rows runs as one ``applyInPandas`` group: warm working copy
   or restore, the processor, persist → its snapshot;
3. the result is pinned with ``localCheckpoint`` so the processor never runs twice
   for one attempt, the rows go to the sink, and only then checkpoint ``batch_id``
   is completed (instances without rows carry their snapshot forward).

Spark's own checkpoint location tracks the source offsets; a batch replayed after
a crash restarts from checkpoint ``batch_id - 1``, so state and sink are exactly once
as long as the sink overwrites a replayed batch (:class:`ParquetBatchSink` does).
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dstl.spi import Config, ConfigError, CorruptedError

from ..changelog import BackendSnapshot
from ..coordinator import CheckpointCoordinator, CompletedCheckpoint, TimeProgress
from ._private.affinity import ExecutorHomes, pinned_instances
from ._private.durations import duration_ms
from ._private.task import (
    EVENT_TIME_COLUMN,
    INSTANCE_COLUMN,
    KEY_GROUP_COLUMN,
    SNAPSHOT_COLUMN,
    STATS_COLUMN,
    WAKE_KEY_GROUP,
    TaskPlan,
    cogroup_function,
    instance_function,
    pinned_function,
)
from ._private.working_copy import snapshot_digest
from .job_identity import resolve_job_id
from .placement import (
    instance_name,
    instance_ranges,
    next_timer_for_range,
    routing_exprs,
    snapshot_for_range,
)
from .processor import BatchClock, StatefulProcessor, TimeMode
from .progress import BatchProgress
from .query_progress import ProgressBridge, QueryProgress
from .sinks import ParquetBatchSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import StreamingQuery

__all__ = ["StatefulQuery", "check_storage_for_spark", "transform_with_state"]

log = logging.getLogger(__name__)

Sink = Callable[["DataFrame", int], None]
#: Completed checkpoints per instance a stale working copy may catch up from.
_LINEAGE_DEPTH = 64
#: Batch figures a query keeps (weeks of batches must not grow the driver).
RECENT_BATCHES = 1000


def _job_config(spark_conf: Any, config: Mapping[str, Any] | None, checkpoint_location: str) -> Config:
    """The Spark conf's ``spark.dstl.*``/``spark.state.*``, then ``config``; defaults under the checkpoint."""
    cfg = Config.from_spark_conf(spark_conf, extra=dict(config or {}))
    check_storage_for_spark(cfg)
    return cfg.under_checkpoint(checkpoint_location)


def check_storage_for_spark(cfg: Config) -> None:
    """Refuse storages that live in one process: Spark tasks run in separate Python workers.

    :raises UnknownStorageError: when the storage is not installed.
    :raises ConfigError: when it lacks the ``multi_process`` capability.
    """
    from dstl.spi.plugins import get_registry

    storage = cfg["dstl.storage"]
    if "multi_process" not in get_registry().get(storage).capabilities:
        msg = (
            f"storage {storage!r} lives in one process, but Spark runs tasks in separate Python workers "
            "and a restarted driver is a new process: use local, filesystem, kafka or another storage "
            "with the 'multi_process' capability (dstl storages lists them)"
        )
        raise ConfigError(msg)


class StatefulQuery:
    """A running stateful query: the Spark query plus per-batch progress and listeners."""

    def __init__(
        self,
        runner: _BatchRunner,
        query: StreamingQuery,
        bridge: ProgressBridge,
        streams: Any,
    ) -> None:
        self._runner = runner
        self._bridge = bridge
        self._streams = streams  # the session's StreamingQueryManager, where the bridge listens
        self.query = query

    @property
    def progress(self) -> list[BatchProgress]:
        """Figures of the batches completed by this run (the latest 1000), oldest first."""
        with self._runner.completed:
            return list(self._runner.progress)

    @property
    def completed_batches(self) -> int:
        """How many batches this run completed."""
        return self._runner.completed_batches

    @property
    def recent_progress(self) -> list[QueryProgress]:
        """Spark's progress of the latest batches (up to 100) joined with their state figures."""
        return list(self._bridge.recent)

    @property
    def last_progress(self) -> QueryProgress | None:
        """Spark's ``lastProgress`` with this batch's state figures (``None`` before the first)."""
        recent = self._bridge.recent
        return recent[-1] if recent else None

    def add_listener(self, listener: Callable[[BatchProgress], None]) -> None:
        """Call ``listener`` after every completed batch (on the query's thread; keep it short)."""
        self._runner.listeners.append(listener)

    def add_progress_listener(self, listener: Callable[[QueryProgress], None]) -> None:
        """Call ``listener`` with Spark's progress of every batch joined with its state figures.

        Runs on Spark's listener bus, after Spark reported the batch.
        """
        self._bridge.listeners.append(listener)

    def wait_for_batches(self, count: int, timeout: float) -> bool:
        """Wait until this run completed ``count`` batches; ``False`` on timeout or query failure."""
        deadline = time.monotonic() + timeout
        with self._runner.completed:
            while self._runner.completed_batches < count:
                if self.query.exception() is not None or not self.query.isActive:
                    return False
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._runner.completed.wait(min(remaining, 0.5))
        return True

    def process_all_available(self) -> None:
        """Block until every input available now is processed (then :meth:`stop` ends between batches)."""
        self.query.processAllAvailable()

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait for the query to end (e.g. an ``availableNow`` trigger ran out of input)."""
        # PySpark takes seconds as an int in its hints, any number at run time
        seconds: Any = timeout
        ended = self.query.awaitTermination(seconds) if timeout is not None else self.query.awaitTermination()
        return bool(ended)

    def stop(self) -> None:
        """Stop the Spark query (its progress bridge leaves Spark's listener bus)."""
        try:
            self.query.stop()
        finally:
            self._streams.removeListener(self._bridge)

    def exception(self) -> Exception | None:
        """The query's failure, if any."""
        return self.query.exception()

    def latest_checkpoint(self) -> CompletedCheckpoint | None:
        """The newest completed state checkpoint."""
        return self._runner.coordinator.latest()


@dataclass(frozen=True)
class _QuerySpec:
    """What the caller asked for: the operator, its keys, processor, output, sink and clocks."""

    job_id: str
    operator_id: str
    key_columns: tuple[str, ...]
    output_schema: Any  # StructType
    make_processor: Callable[[], StatefulProcessor]
    sink: Sink
    time_mode: TimeMode = TimeMode.NONE
    event_time_column: str | None = None
    watermark_delay_ms: int = 0
    initial_state: Any = None  # DataFrame: handed to handle_initial_state in the first batch


class _BatchRunner:
    """The ``foreachBatch`` function and the driver-side state it keeps between batches."""

    def __init__(self, cfg: Config, spec: _QuerySpec) -> None:
        self.cfg = cfg
        self.spec = spec
        job_id = spec.job_id
        self.parallelism = int(cfg["dstl.spark.parallelism"])
        self.max_parallelism = int(cfg["state.backend.max-parallelism"])
        if self.parallelism > self.max_parallelism:
            msg = (
                f"dstl.spark.parallelism={self.parallelism} exceeds state.backend.max-parallelism="
                f"{self.max_parallelism}: raise the latter (only possible before the first checkpoint)"
            )
            raise ConfigError(msg)
        directory = cfg["state.checkpoints.dir"]
        # A replayed batch restarts from checkpoint batch_id - 1, which must therefore be retained.
        self.coordinator = CheckpointCoordinator(
            directory,
            job_id,
            num_retained=max(2, int(cfg["state.checkpoints.num-retained"])),
            config=cfg,
            on_damaged=str(cfg["state.checkpoints.on-damaged"]),
        )
        self.coordinator.recover()
        # Per instance, (checkpoint, digest) of its snapshot in recent completed checkpoints.
        self.lineage: dict[str, list[tuple[int, str]]] = {}
        for completed in self.coordinator.retained:
            self._remember(completed)
        # the driver lease's generation grows with every driver start: writer epochs of a new
        # run fence the old run's writers, as the lease fences its coordinator
        self.run_id = self.coordinator.generation or 1
        self.working_dir = cfg.get("dstl.spark.working-dir") or f"{tempfile.gettempdir()}/dstl-working"
        self.homes = ExecutorHomes() if cfg["dstl.spark.placement"] == "sticky" else None
        self.interval = float(cfg["state.changelog.materialization.interval"])
        started = time.monotonic()
        self.materialized_at = {instance_name(r): started for r in self.ranges}
        self.progress: deque[BatchProgress] = deque(maxlen=RECENT_BATCHES)
        self.completed_batches = 0
        self.listeners: list[Callable[[BatchProgress], None]] = []
        self.completed = threading.Condition()

    def progress_of(self, batch_id: int) -> BatchProgress | None:
        """This run's figures of ``batch_id``, while it is among the recent ones."""
        with self.completed:
            return next((p for p in reversed(self.progress) if p.batch_id == batch_id), None)

    def _remember(self, completed: CompletedCheckpoint) -> None:
        """Record the instances' snapshots of a completed checkpoint (a working copy at one may catch up)."""
        for name, snapshot in completed.snapshots.items():
            history = self.lineage.setdefault(name, [])
            digest = snapshot_digest(snapshot)
            if not history or history[-1][1] != digest:
                history.append((completed.checkpoint_id, digest))
            del history[:-_LINEAGE_DEPTH]

    def _forget_from(self, batch_id: int) -> None:
        """Checkpoints from ``batch_id`` on were dropped (a replay): no copy may continue from them."""
        for history in self.lineage.values():
            history[:] = [(checkpoint, digest) for checkpoint, digest in history if checkpoint < batch_id]

    @property
    def ranges(self) -> list:
        return instance_ranges(self.parallelism, self.max_parallelism)

    def _base(self, batch_id: int) -> CompletedCheckpoint | None:
        """Checkpoint ``batch_id - 1``, the only state batch ``batch_id`` may continue from.

        :raises CorruptedError: when the newest retained checkpoint is another one (the
            state directory lost or never had it), unless recovery rolled back by
            ``state.checkpoints.on-damaged=previous``: that first batch continues from
            the older checkpoint, logged.
        """
        latest = self.coordinator.latest()
        if latest is not None and latest.checkpoint_id >= batch_id:
            log.info("batch %d is replayed: dropping checkpoints from %d on", batch_id, batch_id)
            self.coordinator.abort_from(batch_id)
            self._forget_from(batch_id)
            latest = self.coordinator.latest()
        found = latest.checkpoint_id if latest is not None else None
        expected = batch_id - 1 if batch_id > 0 else None
        if found is None and expected is None and self.cfg.get("state.savepoint.path"):
            return self._from_savepoint(str(self.cfg["state.savepoint.path"]))
        if found == expected:
            return latest
        rolled_back = self.coordinator.rolled_back_from
        if rolled_back is not None:
            self.coordinator.rolled_back_from = None
            log.error(
                "ROLLBACK: batch %d continues from %s instead of checkpoint %d (checkpoint %d was damaged "
                "and state.checkpoints.on-damaged=previous)",
                batch_id,
                "empty state" if found is None else f"checkpoint {found}",
                batch_id - 1,
                rolled_back,
            )
            return latest
        have = "no checkpoint" if found is None else f"checkpoint {found}"
        msg = (
            f"batch {batch_id} must continue from checkpoint {batch_id - 1}, but state.checkpoints.dir "
            f"holds {have} for job {self.spec.job_id!r}: the state and Spark's checkpoint location disagree "
            "(was one of them deleted or copied from another job?). The batch is refused rather than "
            "continue from older or empty state; restore the matching directories or start with a fresh "
            "checkpoint location"
        )
        raise CorruptedError(msg, location=self.coordinator.directory)

    def _from_savepoint(self, path: str) -> CompletedCheckpoint:
        """The job's first state: the savepoint's snapshots, copied under its own checkpoint directory.

        Copied again if the first batch is replayed (a replay drops what the failed
        attempt completed, copies included).
        """
        from ..savepoints import adopt_savepoint

        base = adopt_savepoint(
            path, self.cfg["state.checkpoints.dir"], self.spec.job_id, self.max_parallelism, self.cfg
        )
        log.info("job %r starts from the savepoint at %s", self.spec.job_id, path)
        return base

    def _due_for_materialization(self, previous: Mapping[str, BackendSnapshot]) -> frozenset[int]:
        """At most one instance per batch (spreads the cost over batches).

        First an instance whose log outgrew ``max-log-ratio`` times its materialized
        state, else the one past the interval that waited longest.
        """
        ratio = float(self.cfg["state.changelog.materialization.max-log-ratio"])
        names = [instance_name(r) for r in self.ranges]
        for index, name in enumerate(names):
            snapshot = previous.get(name)
            if ratio > 0 and snapshot is not None:
                log_bytes = sum(h.size for h in snapshot.all_handles)
                if log_bytes > ratio * max(sum(m.size for m in snapshot.all_materialized), 1 << 20):
                    return frozenset({index})
        now = time.monotonic()
        oldest = min(names, key=lambda name: self.materialized_at.get(name, now))
        if now - self.materialized_at.get(oldest, now) < self.interval:
            return frozenset()
        return frozenset({names.index(oldest)})

    def _pinned(self, routed: DataFrame, plan: TaskPlan, schema: Any) -> DataFrame | None:
        """The instances' results with sticky placement (one partition per instance, on its home).

        ``None`` when placement is Spark's (by config, or the gateway cannot pin).
        """
        if self.homes is None:
            return None
        columns = tuple(routed.columns)
        index = columns.index(INSTANCE_COLUMN)
        groups = (
            routed.rdd.map(lambda row: (row[index], row))
            .partitionBy(self.parallelism, _instance_partition)
            .values()
            .glom()
        )
        spark = routed.sparkSession
        pairs = pinned_instances(spark.sparkContext, groups, self.homes)
        if pairs is None:
            return None
        from pyspark.sql.types import DoubleType, FloatType

        floats = frozenset(
            f.name for f in self.spec.output_schema.fields if isinstance(f.dataType, DoubleType | FloatType)
        )
        results = pairs.mapPartitions(pinned_function(plan, self.spec.make_processor, columns, floats))
        return spark.createDataFrame(results, schema, verifySchema=False)

    def _clock(self, base: CompletedCheckpoint | None) -> tuple[BatchClock, frozenset[int]]:
        """The batch's clocks (the watermark comes from the base checkpoint), and the instances to wake."""
        spec = self.spec
        # none until an event time was seen: nothing is late, no event-time timer fires yet
        watermark = base.time.watermark_ms if base is not None else None
        clock = BatchClock(int(time.time() * 1000), watermark, spec.time_mode)
        up_to = clock.fire_up_to()
        if up_to is None or base is None:
            return clock, frozenset()
        due = frozenset(
            index
            for index, key_groups in enumerate(self.ranges)
            if (expiry := next_timer_for_range(base.time.next_timers, key_groups)) is not None
            and expiry <= up_to
        )
        return clock, due

    def _time_progress(
        self, base: CompletedCheckpoint | None, clock: BatchClock, stats: list[dict[str, Any]]
    ) -> TimeProgress:
        """The clocks the next batch continues from: Spark's watermark rule, each instance's next timer."""
        reported = {item["instance"]: item.get("next_timer") for item in stats}
        before = base.time.next_timers if base is not None else {}
        next_timers = {}
        for key_groups in self.ranges:
            name = instance_name(key_groups)
            expiry = reported[name] if name in reported else next_timer_for_range(before, key_groups)
            if expiry is not None:
                next_timers[name] = expiry
        watermark = clock.watermark_ms
        seen = [item["max_event_ms"] for item in stats if item.get("max_event_ms") is not None]
        if seen:  # Spark's rule: the largest event time seen minus the delay, never moving back
            advanced = max(seen) - self.spec.watermark_delay_ms
            watermark = advanced if watermark is None else max(watermark, advanced)
        return TimeProgress(watermark, next_timers)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F
        from pyspark.sql.types import StringType, StructField, StructType

        began = time.perf_counter()
        base = self._base(batch_id)
        previous = dict(base.snapshots) if base else {}
        clock, wake = self._clock(base)
        plan = TaskPlan(
            config=self.cfg.raw(),
            job_id=self.spec.job_id,
            operator_id=self.spec.operator_id,
            key_columns=self.spec.key_columns,
            output_columns=tuple(self.spec.output_schema.fieldNames()),
            parallelism=self.parallelism,
            max_parallelism=self.max_parallelism,
            batch_id=batch_id,
            run_id=self.run_id,
            working_dir=self.working_dir,
            previous={name: snapshot.to_json() for name, snapshot in previous.items()},
            materialize=self._due_for_materialization(previous),
            lineage={name: tuple(digest for _, digest in history) for name, history in self.lineage.items()},
            clock=clock,
            wake=wake,
        )
        key_group, instance = routing_exprs(
            list(self.spec.key_columns), self.parallelism, self.max_parallelism
        )
        schema = StructType(
            [
                *self.spec.output_schema.fields,
                StructField(SNAPSHOT_COLUMN, StringType(), True),
                StructField(STATS_COLUMN, StringType(), True),
            ]
        )
        routed = _routed(batch, self.spec.key_columns, key_group, instance, self.spec.event_time_column)
        initial = self.spec.initial_state if base is None else None
        result = None if initial is not None else self._pinned(routed, plan, schema)
        if result is None:
            routed = _with_wake_rows(routed, wake)
            grouped = routed.groupBy(INSTANCE_COLUMN)
            if initial is not None:  # first batch: the initial state's rows go with each instance's rows
                initial_routed = _routed(initial, self.spec.key_columns, key_group, instance, None)
                result = grouped.cogroup(initial_routed.groupBy(INSTANCE_COLUMN)).applyInPandas(
                    cogroup_function(plan, self.spec.make_processor), schema
                )
            else:
                result = grouped.applyInPandas(instance_function(plan, self.spec.make_processor), schema)
        phases = _Phases(began)
        phases.mark("plan")
        result = result.localCheckpoint(eager=True)
        phases.mark("tasks")  # routing, shuffle, the instances' tasks, pinning the result
        reports = (
            result.where(F.col(SNAPSHOT_COLUMN).isNotNull()).select(SNAPSHOT_COLUMN, STATS_COLUMN).collect()
        )
        phases.mark("collect")
        self.spec.sink(
            result.where(F.col(SNAPSHOT_COLUMN).isNull()).drop(SNAPSHOT_COLUMN, STATS_COLUMN), batch_id
        )
        phases.mark("sink")
        snapshots: dict[str, BackendSnapshot] = {}
        for key_groups in self.ranges:  # instances without rows carry their state forward
            carried = snapshot_for_range(previous, key_groups)
            if carried is not None:
                snapshots[instance_name(key_groups)] = carried
        stats = []
        for row in reports:
            doc = json.loads(row[SNAPSHOT_COLUMN])
            snapshots[doc["name"]] = BackendSnapshot.from_json(json.dumps(doc["snapshot"]))
            stats.append(json.loads(row[STATS_COLUMN]))
        completed = self.coordinator.complete(batch_id, snapshots, self._time_progress(base, clock, stats))
        self._remember(completed)
        phases.mark("complete")
        now = time.monotonic()
        for item in stats:
            if item["materialized"]:
                self.materialized_at[item["instance"]] = now
        full = sum(
            sum(h.size for h in s.all_handles) + sum(m.size for m in s.all_materialized)
            for s in completed.snapshots.values()
        )
        progress = BatchProgress.from_instances(
            batch_id, stats, full, (time.perf_counter() - began) * 1000, phases.ms, clock.watermark_ms
        )
        log.info("dstl batch %s", progress.to_json())
        with self.completed:
            self.progress.append(progress)
            self.completed_batches += 1
            self.completed.notify_all()
        for listener in self.listeners:
            listener(progress)


class _Phases:
    """Where a batch's time went on the driver: milliseconds per phase, in order."""

    def __init__(self, began: float) -> None:
        self._last = began
        self.ms: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        self.ms[phase] = round((now - self._last) * 1000, 3)
        self._last = now


def _instance_partition(instance: int) -> int:
    return instance


def _routed(
    frame: DataFrame,
    key_columns: tuple[str, ...],
    key_group: str,
    instance: str,
    event_time_column: str | None,
) -> DataFrame:
    """``frame`` with its key group and instance columns (and event time in ms), in one projection.

    Key columns are widened first to the types the Python key hash mirrors (bigint, double).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import ByteType, FloatType, IntegerType, ShortType, TimestampNTZType, TimestampType

    fields = frame.schema.fields
    names = {field.name for field in fields}
    missing = [c for c in key_columns if c not in names]
    if missing:
        msg = f"key columns {missing} are not in the stream's columns {sorted(names)}"
        raise ConfigError(msg)
    widened = {}
    for field in fields:
        if field.name in key_columns:
            if isinstance(field.dataType, ByteType | ShortType | IntegerType):
                widened[field.name] = F.col(field.name).cast("bigint")
            elif isinstance(field.dataType, FloatType):
                widened[field.name] = F.col(field.name).cast("double")
    if widened:
        frame = frame.withColumns(widened)
    added = {KEY_GROUP_COLUMN: F.expr(key_group), INSTANCE_COLUMN: F.expr(instance)}
    if event_time_column is not None:
        types = {field.name: field.dataType for field in fields}
        if event_time_column not in types:
            msg = f"event_time_column {event_time_column!r} is not in the stream's columns {sorted(names)}"
            raise ConfigError(msg)
        if isinstance(types[event_time_column], TimestampType | TimestampNTZType):
            # in Spark, not pandas: pandas would see local wall-clock times without their zone
            event_ms = F.floor(F.unix_micros(F.col(event_time_column).cast("timestamp")) / 1000)
        else:  # a number of epoch milliseconds
            event_ms = F.col(event_time_column).cast("bigint")
        added[EVENT_TIME_COLUMN] = event_ms.cast("bigint")
    return frame.withColumns(added)


def _with_wake_rows(routed: DataFrame, wake: frozenset[int]) -> DataFrame:
    """``routed`` plus one data-less row per instance in ``wake``, so that its task runs (timers are due)."""
    if not wake:
        return routed
    from pyspark.sql import functions as F

    spark = routed.sparkSession
    marks = spark.createDataFrame([(index,) for index in sorted(wake)], f"{INSTANCE_COLUMN} int")
    columns = []
    for field in routed.schema.fields:
        if field.name == INSTANCE_COLUMN:
            columns.append(F.col(INSTANCE_COLUMN))
        elif field.name == KEY_GROUP_COLUMN:
            columns.append(F.lit(WAKE_KEY_GROUP).cast(field.dataType).alias(field.name))
        else:
            columns.append(F.lit(None).cast(field.dataType).alias(field.name))
    return routed.unionByName(marks.select(columns))


def transform_with_state(
    frame: DataFrame,
    *,
    key_columns: list[str],
    processor: Callable[[], StatefulProcessor],
    output_schema: Any,
    sink: Sink | str,
    checkpoint_location: str,
    config: Mapping[str, Any] | None = None,
    job_id: str | None = None,
    operator_id: str = "stateful",
    trigger: Mapping[str, Any] | None = None,
    query_name: str | None = None,
    time_mode: str | TimeMode | None = None,
    event_time_column: str | None = None,
    watermark_delay: str | float | None = None,
    initial_state: DataFrame | None = None,
) -> StatefulQuery:
    """Start a streaming query whose per-key state lives in the changelog backend.

    :param processor: a :class:`StatefulProcessor` (or PySpark ``StatefulProcessor``)
        subclass, an instance of one (each task runs its own copy, as in Spark) or a
        zero-argument factory; one is created per operator instance and batch on the
        executors. Anything else, and key or event-time columns the stream lacks, is a
        :class:`ConfigError` at the call, before anything is written.
    :param output_schema: the rows ``handle_input_rows`` returns (columns nullable).
    :param sink: ``(DataFrame, batch_id) -> None`` that overwrites a replayed batch,
        or a path for :class:`ParquetBatchSink`.
    :param checkpoint_location: Spark's checkpoint (source offsets); state checkpoints
        and the ``local`` storage default to directories under it.
    :param job_id: names the job's logs and working copies on the storage. By default
        derived from ``checkpoint_location``; whatever id a location starts with is
        recorded in it and kept (another id later is refused), and another location
        claiming the same id on the same storage is refused at start.
    :param config: ``dstl.*``/``state.*`` keys on top of the Spark conf's ``spark.dstl.*``/``spark.state.*``.
    :param trigger: keyword arguments of ``DataStreamWriter.trigger``
        (e.g. ``{"availableNow": True}``).
    :param time_mode: the clock of the processor's timers: ``processing``, ``event``
        or ``none`` (PySpark's spellings too); by default ``event`` with an
        ``event_time_column``, else ``none``.
    :param event_time_column: a timestamp column, or one of epoch milliseconds: the
        watermark follows it, and rows at or below the watermark are dropped as late.
    :param watermark_delay: how far the watermark trails the largest event time seen
        (milliseconds, or a duration such as ``"10 seconds"``). By default the delay the
        stream declares with ``withWatermark`` on the event-time column (whose column is
        then the default ``event_time_column``), else 0; a different one is refused. As in Spark, a batch
        uses the watermark of the batches before it; the watermark is checkpointed.
    :param initial_state: a DataFrame with the key columns, handed key by key to
        :meth:`StatefulProcessor.handle_initial_state` in the query's first batch.
    """
    from pyspark.sql.types import StructType

    event_time_column, delay_ms = stream_watermark(frame, event_time_column, watermark_delay)
    _check_columns(frame, key_columns, event_time_column)  # before anything is written
    processor = _adapted(processor)
    spark = frame.sparkSession
    cfg = _job_config(
        dict(spark.sparkContext.getConf().getAll()) | _session_conf(spark), config, checkpoint_location
    )
    job_id = resolve_job_id(
        checkpoint_location, job_id, cfg, legacy_state_dir=cfg.get("state.checkpoints.dir")
    )
    schema = output_schema if isinstance(output_schema, StructType) else StructType.fromDDL(output_schema)
    mode = TimeMode.parse(time_mode if time_mode is not None else ("event" if event_time_column else "none"))
    if mode is TimeMode.EVENT and event_time_column is None:
        msg = "time_mode='event' needs an event_time_column (the watermark follows it)"
        raise ConfigError(msg)
    runner = _BatchRunner(
        cfg,
        _QuerySpec(
            job_id,
            operator_id,
            tuple(key_columns),
            schema,
            processor,
            ParquetBatchSink(sink) if isinstance(sink, str) else sink,
            mode,
            event_time_column,
            delay_ms,
            initial_state,
        ),
    )
    writer = frame.writeStream.foreachBatch(runner).option("checkpointLocation", checkpoint_location)
    if trigger:
        writer = writer.trigger(**trigger)
    if query_name:
        writer = writer.queryName(query_name)
    bridge = ProgressBridge(runner.progress_of)
    spark.streams.addListener(bridge)
    try:
        query = writer.start()
    except BaseException:
        spark.streams.removeListener(bridge)
        raise
    bridge.bind(str(query.id), spark.streams)
    return StatefulQuery(runner, query, bridge, spark.streams)


def _session_conf(spark: Any) -> dict[str, str]:
    """``spark.dstl.*``/``spark.state.*`` keys set on the session (``spark.conf.set``)."""
    try:
        everything = spark.conf.getAll
        items = everything() if callable(everything) else everything
        return {k: v for k, v in dict(items).items() if k.startswith(("spark.dstl.", "spark.state."))}
    except Exception:
        return {}


def _adapted(processor: Any) -> Callable[[], StatefulProcessor]:
    """``processor`` as a factory of dstl processors, however the user gave it.

    A PySpark ``StatefulProcessor`` (class or instance) is wrapped; a dstl processor
    instance is copied for each task (Spark's idiom: each task runs its own copy);
    a dstl class or a zero-argument factory is used as it is.

    :raises ConfigError: at the call, for anything else (or a factory that makes no processor).
    """
    from .pyspark_compat import is_pyspark_processor, pyspark_processor

    if is_pyspark_processor(processor):
        return pyspark_processor(processor)
    if isinstance(processor, StatefulProcessor):
        return functools.partial(copy.deepcopy, processor)
    if isinstance(processor, type) and issubclass(processor, StatefulProcessor):
        return processor
    if callable(processor):
        made = processor()  # once, on the driver: a factory of something else fails here, not in a task
        if isinstance(made, StatefulProcessor) or is_pyspark_processor(made):
            return pyspark_processor(made) if is_pyspark_processor(made) else processor
    msg = (
        f"processor {processor!r:.80} is not a StatefulProcessor: pass a dstl or PySpark StatefulProcessor "
        "subclass, an instance of one, or a zero-argument factory returning one"
    )
    raise ConfigError(msg)


#: The column metadata Spark's ``withWatermark`` sets on the event-time column.
_WATERMARK_DELAY_KEY = "spark.watermarkDelayMs"


def stream_watermark(
    frame: Any,
    event_time_column: str | None,
    watermark_delay: str | float | None,
) -> tuple[str | None, int]:
    """The event-time column and watermark delay (ms): the caller's, else what the stream declares.

    ``frame.withWatermark("ts", "10 seconds")`` marks ``ts`` with its delay, as Spark's own
    operators read it: that column and delay are the defaults.

    :raises ConfigError: when the caller's delay or column contradicts the stream's
        watermark, or the stream declares several.
    """
    declared = {
        field.name: int(field.metadata[_WATERMARK_DELAY_KEY])
        for field in frame.schema.fields
        if _WATERMARK_DELAY_KEY in (field.metadata or {})
    }
    if len(declared) > 1:
        msg = f"the stream declares watermarks on several columns {sorted(declared)}: dstl follows one"
        raise ConfigError(msg)
    if event_time_column is None and declared:
        event_time_column = next(iter(declared))
    asked = None if watermark_delay is None else duration_ms(watermark_delay)
    if event_time_column is not None and declared and event_time_column not in declared:
        (column,) = declared
        msg = (
            f"event_time_column={event_time_column!r}, but the stream's watermark is on {column!r} "
            f"(withWatermark): use {column!r}, or drop withWatermark"
        )
        raise ConfigError(msg)
    stream_delay = declared.get(event_time_column) if event_time_column is not None else None
    if asked is not None and stream_delay is not None and asked != stream_delay:
        msg = (
            f"watermark_delay={watermark_delay!r} ({asked} ms) contradicts the stream's withWatermark "
            f"delay of {stream_delay} ms on {event_time_column!r}: leave watermark_delay unset (the "
            "stream's is used) or change withWatermark"
        )
        raise ConfigError(msg)
    return event_time_column, asked if asked is not None else (stream_delay or 0)


def _check_columns(frame: Any, key_columns: list[str], event_time_column: str | None) -> None:
    """Refuse at the call what the first batch would fail on: columns the stream does not have."""
    columns = list(frame.columns)
    wanted = [*key_columns, *([event_time_column] if event_time_column else [])]
    missing = [column for column in wanted if column not in columns]
    if not key_columns or missing:
        msg = (
            f"the stream has no column {missing[0]!r} (its columns: {columns})"
            if missing
            else "key_columns is empty: name the columns that key the state"
        )
        raise ConfigError(msg)
