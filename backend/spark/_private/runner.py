"""The driver's ``foreachBatch`` function: plan each batch, run the instances, complete its checkpoint."""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from dstl.spi import Config, ConfigError, CorruptedError

from ...changelog import BackendSnapshot
from ...checkpoints import CheckpointCoordinator, CompletedCheckpoint, TimeProgress
from ...options import (
    BACKEND_MAX_PARALLELISM,
    CHECKPOINTS_DIR,
    CHECKPOINTS_NUM_RETAINED,
    CHECKPOINTS_ON_DAMAGED,
    SAVEPOINT_PATH,
)
from ..options import SPARK_PARALLELISM, SPARK_WORKING_DIR
from ..placement import (
    instance_name,
    instance_ranges,
    next_timer_for_range,
    snapshot_for_range,
)
from ..processor import BatchClock, StatefulProcessor, TimeMode
from ..progress import BatchProgress
from .adapters import cogroup_function, instance_function
from .affinity import ExecutorHomes, executors_to_pin, pinned_instances
from .arrow_pinning import CARRIER_SCHEMA, arrow_groups, pinned_arrow_function
from .arrow_shuffle import instance_shuffled, shuffled_arrow_function
from .columns import INSTANCE_COLUMN, REPORT_COLUMN
from .idle_batches import without_heartbeat
from .materialization_turns import MaterializationTurns
from .protocol import InstancePlan, InstanceReport, InstanceStats, TaskPlan
from .report_channel import ReportChannel
from .routing import RoutingColumns, routed, with_wake_rows
from .working_copy import snapshot_digest

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["RECENT_BATCHES", "BatchRunner", "Phases", "QuerySpec", "checked_layout"]

log = logging.getLogger(__name__)

Sink = Callable[["DataFrame", int], None]
#: The stateful step reading this one's output in the same query: ``(output, batch_id, clock)``.
NextStep = Callable[["DataFrame", int, BatchClock], None]
#: Completed checkpoints per instance a stale working copy may catch up from.
_LINEAGE_DEPTH = 64
#: Batch figures a query keeps (weeks of batches must not grow the driver).
RECENT_BATCHES = 1000


@dataclass(frozen=True)
class QuerySpec:
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
    heartbeat: bool = False  # the stream carries heartbeat rows (batches run on an idle stream)
    #: batches may run on an idle stream: one in which no instance ran writes nothing
    idle_batches: bool = False
    #: the next stateful step of the query: it gets the output (every batch: its timers may be
    #: due) and writes to the sink, instead of this step
    next_step: NextStep | None = None
    #: a processing-time trigger's interval, s (0: none): batches start at least that far apart
    trigger_interval_s: float = 0.0


def checked_layout(cfg: Config) -> tuple[int, int, str]:
    """The instances, the key groups and the state directory a query runs with.

    :raises ConfigError: when they cannot work together (checked at the call).
    """
    parallelism = cfg.get(SPARK_PARALLELISM)
    max_parallelism = cfg.get(BACKEND_MAX_PARALLELISM)
    if parallelism > max_parallelism:
        msg = (
            f"dstl.spark.parallelism={parallelism} exceeds state.backend.max-parallelism="
            f"{max_parallelism}: raise the latter (only possible before the first checkpoint)"
        )
        raise ConfigError(msg)
    directory = cfg.get(CHECKPOINTS_DIR)
    if directory is None:  # job_config defaults it under the checkpoint location
        msg = "state.checkpoints.dir is not set and the checkpoint location gives no default for it"
        raise ConfigError(msg)
    return parallelism, max_parallelism, directory


class BatchRunner:
    """The ``foreachBatch`` function and the driver-side state it keeps between batches."""

    def __init__(self, cfg: Config, spec: QuerySpec) -> None:
        self.cfg = cfg
        self.spec = spec
        job_id = spec.job_id
        self.parallelism, self.max_parallelism, directory = checked_layout(cfg)
        #: the routing expressions, built into Columns at first use and reused every batch
        self.routing = RoutingColumns(spec.key_columns, self.parallelism, self.max_parallelism)
        self.state_dir = directory
        # A replayed batch restarts from checkpoint batch_id - 1, which must therefore be retained.
        self.coordinator = CheckpointCoordinator(
            directory,
            job_id,
            num_retained=max(2, cfg.get(CHECKPOINTS_NUM_RETAINED)),
            config=cfg,
            on_damaged=cfg.get(CHECKPOINTS_ON_DAMAGED),
        )
        self.coordinator.recover()
        # Per instance, (checkpoint, digest) of its snapshot in recent completed checkpoints.
        self.lineage: dict[str, list[tuple[int, str]]] = {}
        for completed in self.coordinator.retained:
            self._remember(completed)
        # the driver lease's generation grows with every driver start: writer epochs of a new
        # run fence the old run's writers, as the lease fences its coordinator
        self.run_id = self.coordinator.generation or 1
        self.working_dir = cfg.get(SPARK_WORKING_DIR) or f"{tempfile.gettempdir()}/dstl-working"
        self.homes = ExecutorHomes.of(cfg)
        self._reports: ReportChannel | None = None  # set up by the first batch that can use one
        self.turns = MaterializationTurns(
            [instance_name(r) for r in self.ranges], cfg, spec.trigger_interval_s
        )
        #: per instance, ``(rows, bytes)`` of its working state as it reported last
        self.working_state: dict[str, tuple[int, int]] = {}
        self.progress: deque[BatchProgress] = deque(maxlen=RECENT_BATCHES)
        self.completed_batches = 0
        self.listeners: list[Callable[[BatchProgress], None]] = []
        self.completed = threading.Condition()
        self._advances_watermark = True  # set per batch by _clock

    def progress_of(self, batch_id: int) -> BatchProgress | None:
        """This run's figures of ``batch_id``, while it is among the recent ones."""
        with self.completed:
            return next((p for p in reversed(self.progress) if p.batch_id == batch_id), None)

    def _remember(self, completed: CompletedCheckpoint) -> None:
        """Record the instances' snapshots of a completed checkpoint (a working copy at one may catch up)."""
        for name, snapshot in completed.snapshots.items():
            history = self.lineage.setdefault(name, [])
            digest = snapshot_digest(snapshot)  # computed once per snapshot object
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
        savepoint = self.cfg.get(SAVEPOINT_PATH)
        if found is None and expected is None and savepoint:
            return self._from_savepoint(savepoint)
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
        from ...checkpoints import adopt_savepoint

        base = adopt_savepoint(path, self.state_dir, self.spec.job_id, self.max_parallelism, self.cfg)
        log.info("job %r starts from the savepoint at %s", self.spec.job_id, path)
        return base

    @property
    def _reports_first(self) -> bool:
        """Whether the reports are collected before the sink runs: it is called only if any instance ran."""
        return self.spec.next_step is None and self.spec.idle_batches

    def _pinned(self, rows: DataFrame, plan: TaskPlan, schema: Any) -> DataFrame | None:
        """The instances' results with sticky placement (one partition per instance, on its home).

        Rows reach each instance as Arrow and its results return as Arrow
        (:mod:`.arrow_pinning`); each partition's tasks also send their reports
        through :attr:`_reports`. ``None`` when placement is Spark's (by config, or
        the gateway cannot pin).
        """
        if self.homes is None:
            return None
        spark = rows.sparkSession
        timezone = str(spark.conf.get("spark.sql.session.timeZone"))
        executors = executors_to_pin(spark.sparkContext, self.homes)
        if executors is None:
            return None
        if self._reports is None:
            self._reports = ReportChannel(spark.sparkContext, self.homes.observed)
        sender = self._reports.sender(plan.batch_id)
        if not executors:  # only the driver runs tasks (local mode): nothing to pin, the JVM shuffles
            woken = with_wake_rows(rows, plan.wake)
            shuffled = instance_shuffled(woken, self.parallelism, self.routing.partition_key)
            work = shuffled_arrow_function(plan, self.spec.make_processor, timezone, sender)
            return shuffled.mapInArrow(work, schema)
        groups = arrow_groups(rows, self.parallelism, timezone)
        pairs = pinned_instances(spark.sparkContext, groups, self.homes, frozenset(plan.instances))
        if pairs is None:
            return None
        carriers = spark.createDataFrame(pairs, CARRIER_SCHEMA)
        plan = replace(plan, standbys=self.homes.standby_work)  # set by pinning: homes known now
        work = pinned_arrow_function(plan, self.spec.make_processor, tuple(rows.columns), timezone, sender)
        return carriers.mapInArrow(work, schema)

    def _clock(
        self, base: CompletedCheckpoint | None, upstream: BatchClock | None = None
    ) -> tuple[BatchClock, frozenset[int]]:
        """The batch's clocks, and the instances to wake.

        The watermark comes from the base checkpoint, or from ``upstream`` (the clock of
        the step whose output this one reads) when that has one: as Spark propagates a
        query's watermark from operator to operator, every step of a batch runs on it.
        """
        spec = self.spec
        # Spark's: a query with event time starts at watermark 0; late rows are judged by the
        # watermark of the batch before (checkpoints without it: by this batch's)
        start = 0 if spec.event_time_column is not None else None
        watermark = base.time.watermark_ms if base is not None else start
        late = base.time.late_watermark_ms if base is not None else start
        if watermark is None:
            watermark = start
        now = int(time.time() * 1000)
        if upstream is not None:
            now = upstream.processing_time_ms
            if upstream.watermark_ms is not None:
                watermark, late = upstream.watermark_ms, upstream.late_watermark_ms
        # the upstream step's watermark is the batch's: this step's own events do not move it
        self._advances_watermark = upstream is None or upstream.watermark_ms is None
        clock = BatchClock(now, watermark, spec.time_mode, late)
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
        self, base: CompletedCheckpoint | None, clock: BatchClock, stats: list[InstanceStats]
    ) -> TimeProgress:
        """The clocks the next batch continues from: Spark's watermark rule, each instance's next timer."""
        reported = {item.instance: item.next_timer for item in stats}
        before = base.time.next_timers if base is not None else {}
        next_timers = {}
        for key_groups in self.ranges:
            name = instance_name(key_groups)
            expiry = reported[name] if name in reported else next_timer_for_range(before, key_groups)
            if expiry is not None:
                next_timers[name] = expiry
        watermark = clock.watermark_ms
        seen = [item.max_event_ms for item in stats if item.max_event_ms is not None]
        # Spark's rule: the largest event time seen minus the delay, never moving back
        if seen and self._advances_watermark:
            advanced = max(seen) - self.spec.watermark_delay_ms
            watermark = advanced if watermark is None else max(watermark, advanced)
        return TimeProgress(watermark, next_timers, clock.watermark_ms)

    def _bases(self, base: CompletedCheckpoint | None) -> dict[str, BackendSnapshot | None]:
        """Each instance's own base snapshot (scoped to its key groups: after a rescale, parts)."""
        previous = dict(base.snapshots) if base else {}
        return {instance_name(kg): snapshot_for_range(previous, kg) for kg in self.ranges}

    def _plan(
        self,
        batch_id: int,
        base: CompletedCheckpoint | None,
        bases: Mapping[str, BackendSnapshot | None],
        clock: BatchClock,
        wake: frozenset[int],
    ) -> TaskPlan:
        """The batch's plan: each instance's own base, lineage and materialize decision, encoded once."""
        materializing = self.turns.due(dict(base.snapshots) if base else {})
        finish_in_task = self.turns.finish_in_task()
        instances = {}
        for index, key_groups in enumerate(self.ranges):
            name = instance_name(key_groups)
            own = InstancePlan(
                bases[name],
                tuple(digest for _, digest in self.lineage.get(name, ())),
                index == materializing,
                index in wake,
                finish_in_task,
            )
            if own != InstancePlan():
                instances[index] = own.to_json()
        return TaskPlan(
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
            instances=instances,
            output_schema=self.spec.output_schema.json(),
            wake=wake,
            clock=clock,
            keep_output=not self._reports_first,
        )

    def __call__(self, batch: DataFrame, batch_id: int, upstream: BatchClock | None = None) -> None:
        """Run batch ``batch_id`` over ``batch`` (``upstream``: the previous step's clock, in a chain)."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import StringType, StructField, StructType

        began = time.perf_counter()
        if self.spec.heartbeat:
            batch = without_heartbeat(batch)
        base = self._base(batch_id)
        bases = self._bases(base)
        clock, wake = self._clock(base, upstream)
        plan = self._plan(batch_id, base, bases, clock, wake)
        spec = self.spec
        schema = StructType([*self.spec.output_schema.fields, StructField(REPORT_COLUMN, StringType(), True)])
        rows = routed(batch, self.routing, self.spec.event_time_column)
        initial = self.spec.initial_state if base is None else None
        result = None if initial is not None else self._pinned(rows, plan, schema)
        channel = None if result is None else self._reports  # reports come with the sink's job
        if result is None:
            grouped = with_wake_rows(rows, wake).groupBy(INSTANCE_COLUMN)
            if initial is not None:  # first batch: the initial state's rows go with each instance's rows
                initial_rows = routed(initial, self.routing, None)
                result = grouped.cogroup(initial_rows.groupBy(INSTANCE_COLUMN)).applyInPandas(
                    cogroup_function(plan, self.spec.make_processor), schema
                )
            else:
                result = grouped.applyInPandas(instance_function(plan, self.spec.make_processor), schema)
        phases = Phases(began)
        phases.mark("plan")
        reports_first = channel is None or self._reports_first
        if reports_first:  # two actions read the very output, without running the instances twice
            result = result.localCheckpoint(eager=False)
        # (otherwise the sink's first action runs the instances and any later one replays their output)
        output = result.where(F.col(REPORT_COLUMN).isNull()).drop(REPORT_COLUMN)
        reports = None
        if reports_first:
            reports = _collected_reports(result)
            phases.mark("tasks")  # routing, shuffle, the instances' tasks, pinning the result, the reports
        if spec.next_step is not None:  # every batch: the next step's timers may be due
            spec.next_step(output, batch_id, clock)
        elif reports or not spec.idle_batches:  # an idle batch in which nothing ran has no output
            spec.sink(output, batch_id)
        phases.mark("sink")  # with reports to come: the instances' tasks ran in the sink's job
        if reports is None and channel is not None:
            reports = channel.received(batch_id, self.parallelism)
        if reports is None:  # the sink left partitions unread: they run now
            reports = _collected_reports(result)
            phases.mark("tasks")
        self.complete_batch(batch_id, base, bases, clock, reports, phases)

    def complete_batch(
        self,
        batch_id: int,
        base: CompletedCheckpoint | None,
        bases: Mapping[str, BackendSnapshot | None],
        clock: BatchClock,
        encoded_reports: list[str],
        phases: Phases,
    ) -> BatchProgress:
        """Complete checkpoint ``batch_id`` from the instances' reports (each decoded once); its progress."""
        reports = [InstanceReport.from_json(text) for text in encoded_reports]
        # instances without rows carry their state forward
        snapshots = {name: carried for name, carried in bases.items() if carried is not None}
        stats = [report.stats for report in reports]
        snapshots.update((report.name, report.snapshot) for report in reports)
        completed = self.coordinator.complete(batch_id, snapshots, self._time_progress(base, clock, stats))
        self._remember(completed)
        phases.mark("complete")
        self.turns.noticed(stats)
        for item in stats:
            self.working_state[item.instance] = (item.state_rows, item.memory_bytes)
        if self.homes is not None:
            self.homes.noticed(stats)
        full = sum(
            sum(h.size for h in s.all_handles) + sum(m.size for m in s.all_materialized)
            for s in completed.snapshots.values()
        )
        working = self.working_state.values()
        progress = BatchProgress.from_instances(
            batch_id,
            stats,
            full,
            (time.perf_counter() - phases.began) * 1000,
            phases.ms,
            clock.watermark_ms,
            (sum(rows for rows, _ in working), sum(size for _, size in working)),
        )
        log.info("dstl batch %s", progress.to_json())
        with self.completed:
            self.progress.append(progress)
            self.completed_batches += 1
            self.completed.notify_all()
        for listener in self.listeners:
            listener(progress)
        return progress


def _collected_reports(result: DataFrame) -> list[str]:
    """The instances' encoded reports among ``result``'s rows (a job: it runs what has not run)."""
    from pyspark.sql import functions as F

    reported = result.where(F.col(REPORT_COLUMN).isNotNull()).select(REPORT_COLUMN)
    return [row[REPORT_COLUMN] for row in reported.collect()]


class Phases:
    """Where a batch's time went on the driver: milliseconds per phase, in order."""

    def __init__(self, began: float) -> None:
        self.began = began
        self._last = began
        self.ms: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        """Phase ``phase`` ended now."""
        now = time.perf_counter()
        self.ms[phase] = round((now - self._last) * 1000, 3)
        self._last = now
