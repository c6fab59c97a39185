"""Executor side: process one operator instance's rows of a micro-batch and checkpoint its state.

Runs once per instance that has rows in the batch (or a due timer). The instance's
base checkpoint comes from the driver in its :class:`~.protocol.InstancePlan`; the
result is the processor's rows plus the instance's :class:`~.protocol.InstanceReport`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, BinaryIO

from dstl.spi import Config, StateChangelogStorage, StorageMetrics, load_storage

from ...changelog import BackendSnapshot, ChangelogKeyedStateBackend
from ...keygroups import key_group_range_for_instance
from ...options import BACKEND_LMDB_MAP_SIZE
from ...pacing import foreground, yielding
from ..placement import instance_name
from ..processor import BatchClock, StateContext, StatefulProcessor
from .bring_up import bring_up, offer_when_done
from .collected import Collected
from .columns import EVENT_TIME_COLUMN, INSTANCE_COLUMN, KEY_GROUP_COLUMN, WAKE_KEY_GROUP
from .grouping import keyed_batch
from .instance_rows import ArrowRows, InstanceRows
from .output import check_output_types, output_columns
from .protocol import FINISH_IN_TASK_WAIT_S, InstanceReport, InstanceStats, TaskPlan
from .working_copy import WorkingCopy, held_checkpoint

log = logging.getLogger(__name__)

__all__ = ["epoch_for", "process_instance", "storage_figures", "working_copy_of"]

# Storages are thread-safe and batch the persists of many writers: one per config and process.
_STORAGES: dict[str, StateChangelogStorage] = {}
_EPOCH_RUN = 10**12  # epoch = run * 10^12 + Spark's task attempt id (unique, increasing within a run)


def epoch_for(run_id: int, task_attempt_id: int) -> int:
    """Writer epoch of a task: later runs, batches, retries and speculative attempts fence earlier ones.

    Spark numbers task attempts across the application in the order it launches
    them, so within a driver run a later attempt always has a higher id; the run
    counter orders runs.
    """
    return run_id * _EPOCH_RUN + task_attempt_id


def _storage(plan: TaskPlan) -> StateChangelogStorage:
    key = json.dumps([plan.job_id, plan.config], sort_keys=True, default=str)
    if key not in _STORAGES:
        _STORAGES[key] = load_storage(plan.config, job_id=plan.job_id)
    return _STORAGES[key]


def _attempt() -> tuple[int, int]:
    """``(task attempt id, attempt number)`` of the running Spark task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        msg = "run_instance runs inside a Spark task (applyInPandas)"
        raise RuntimeError(msg)
    return context.taskAttemptId(), context.attemptNumber()


def working_copy_of(plan: TaskPlan, instance: int, cfg: Config | None = None) -> WorkingCopy:
    """The working copy of the plan's instance ``instance`` on this host."""
    cfg = Config.of(plan.config) if cfg is None else cfg
    key_groups = key_group_range_for_instance(instance, plan.parallelism, plan.max_parallelism)
    return WorkingCopy(
        f"{plan.working_dir}/{plan.job_id}/{plan.operator_id}",
        instance_name(key_groups),
        map_size=cfg.get(BACKEND_LMDB_MAP_SIZE),
    )


@foreground()  # the worker's materializations pause meanwhile (they would take the GIL)
def process_instance(
    plan: TaskPlan,
    make_processor: Callable[[], StatefulProcessor],
    rows: InstanceRows,
    instance: int,
    initial: Any = None,
) -> tuple[dict[str, list[Any]], InstanceReport]:
    """Process instance ``instance``'s ``rows`` of the batch (maybe none: a timer is due).

    The initial state's rows (first batch only) go to ``handle_initial_state``
    first, then the batch's rows (late ones dropped) to the processor, then the
    timers due fire. Returns the output columns and the instance's report.
    """
    began = time.perf_counter()
    key_groups = key_group_range_for_instance(instance, plan.parallelism, plan.max_parallelism)
    name = instance_name(key_groups)
    own = plan.instance(instance)
    previous = own.base
    cfg = Config.of(plan.config)
    attempt_id, task_attempt = _attempt()
    storage = _storage(plan)
    copy = working_copy_of(plan, instance, cfg)
    with copy.exclusive():
        stamp = copy.stamp()
        warm, committed = held_checkpoint(stamp, previous, own.lineage)
        copy.invalidate()
        backend = ChangelogKeyedStateBackend.from_config(
            storage,
            f"{plan.operator_id}.{name}",
            key_groups,
            cfg,
            epoch=epoch_for(plan.run_id, attempt_id),
            delegate=copy.delegate,
            periodic_materialization=False,  # the driver plans materializations (own.materialize)
        )
        counted = storage.metrics.counters()  # the worker runs one task at a time: the delta is ours
        claim: BinaryIO | None = None
        rebased: Future[BackendSnapshot] | None = None
        try:
            restore_began = time.perf_counter()
            mode, restored_bytes = bring_up(
                backend,
                copy,
                stamp,
                previous,
                warm=warm,
                committed=committed,
                cfg=cfg,
                run_id=plan.run_id,
            )
            restore_seconds = time.perf_counter() - restore_began
            if not own.materialize:  # no snapshot here: a later one reads this batch's keys from the log
                backend.materializer.forgo_tracking()
            phases = {
                "open": round((restore_began - began) * 1000, 3),
                "bring_up": round(restore_seconds * 1000, 3),
            }
            process_began = time.perf_counter()
            processor = make_processor()
            user_rows, routed_key_groups, event_stats = _on_time(rows, plan.clock, woken=own.wake)
            context = StateContext(
                backend,
                plan.batch_id,
                task_attempt,
                plan.key_columns,
                plan.clock,
                routed_key_groups=routed_key_groups,
            )
            processor.init(context)
            if initial is not None and len(initial):
                _load_initial_state(processor, context, initial)
            output = (
                output_columns(_handled(processor, user_rows, context), plan.output_columns)
                if len(user_rows)
                else output_columns(None, plan.output_columns)
            )
            fired, fired_count, next_timer = _fire_timers(processor, context, backend, plan.output_columns)
            for column in plan.output_columns:
                output[column].extend(fired[column])
            if plan.output_schema:  # both placements fail alike, naming the column (not a NULL)
                check_output_types(output, plan.output_schema)
            keys = len(context.keys_touched)
            processor.close()
            phases["process"] = round((time.perf_counter() - process_began) * 1000, 3)
            phases.update(context.phases_ms)  # e.g. group, inside process
            claim = copy.claim_materialization() if own.materialize else None  # one at a time per host
            materialized = claim is not None
            materialize_began = time.perf_counter()
            if materialized:
                # The snapshot is written in the background, past this task: a later batch of the
                # instance moves its checkpoint onto it once it is complete (see _bring_up).
                snapshot, rebased = backend.checkpoint_materializing(plan.batch_id)
                materialization_ms = round((time.perf_counter() - materialize_began) * 1000, 3)
            else:
                materialization_ms = 0.0
                snapshot = backend.checkpoint(plan.batch_id).result()
            metrics = backend.metrics()
            state_rows = copy.delegate.stored_rows()
            memory_bytes = copy.delegate.stored_bytes() or _anonymous_rss()
            registrations = backend.registrations()
            copy.keep_expired(backend.pending_expired())
            phases["checkpoint"] = round((time.perf_counter() - materialize_began) * 1000, 3)
        finally:
            backend.close(wait_for_materialization=False)
            if claim is not None and rebased is None:  # no materialization runs on it
                claim.close()
        mark_began = time.perf_counter()
        copy.mark(snapshot, registrations)
        phases["stamp"] = round((time.perf_counter() - mark_began) * 1000, 3)
    if rebased is not None and claim is not None:
        offered = offer_when_done(copy, snapshot, rebased, plan.run_id, backend.materializer, claim)
        if own.finish_in_task:  # the worker may be stopped as idle before the snapshot would end
            phases["snapshot"] = _waited_ms(offered, name)
    stats = InstanceStats(
        instance=name,
        rows=event_stats.pop("rows"),
        keys=keys,
        restore=mode,
        restored_bytes=restored_bytes,
        materialized=materialized,
        restore_ms=round(restore_seconds * 1000, 3),
        checkpoint_ms=metrics["lastCheckpointDuration"],
        materialization_ms=materialization_ms,
        expired_removed=int(metrics["numberOfExpiredEntriesRemoved"]),
        persisted_bytes=int(
            metrics["lastIncSizeOfNonMaterializedState"] + metrics["lastIncSizeOfMaterializedState"]
        ),
        phases_ms=phases,
        timers_fired=fired_count,
        next_timer=next_timer,
        output_rows=len(output[plan.output_columns[0]]) if plan.output_columns else 0,
        state_rows=state_rows,
        rows_updated=int(metrics["lastNumRowsUpdated"]),
        rows_removed=int(metrics["lastNumRowsRemoved"]),
        memory_bytes=memory_bytes,
        storage=storage_figures(counted, storage.metrics),
        **event_stats,
    )
    return output, InstanceReport(snapshot, stats)


def _waited_ms(offered: threading.Event, name: str) -> float:
    """Wait (bounded) until a materialization is offered to the instance's next task; the ms waited.

    The wait lifts the pause the task's foreground puts on background work: a snapshot
    encoded in this process would otherwise advance a paced step at a time.
    """
    began = time.perf_counter()
    with yielding():
        done = offered.wait(FINISH_IN_TASK_WAIT_S)
    if not done:
        log.warning(
            "the snapshot of %s did not complete within %g s of its task: it goes on in the background",
            name,
            FINISH_IN_TASK_WAIT_S,
        )
    return round((time.perf_counter() - began) * 1000, 3)


def storage_figures(before: Mapping[str, int], metrics: StorageMetrics) -> dict[str, float]:
    """The storage's work during a task: counter deltas, upload latency p99, queue gauges now.

    Executors' storage metrics never reach the driver otherwise; the driver sums
    them per batch (:class:`~..progress.BatchProgress.storage`).
    """
    figures: dict[str, float] = {
        name: value - before.get(name, 0)
        for name, value in metrics.counters().items()
        if value != before.get(name, 0)
    }
    latency = metrics.percentiles("upload_latency_s", (99,))
    if latency:
        figures["upload_latency_p99_s"] = round(latency[99], 6)
    for name, value in metrics.gauges().items():
        figures[f"gauge.{name}"] = value
    return figures


def _load_initial_state(processor: StatefulProcessor, context: StateContext, initial: Any) -> None:
    """Hand each key's rows of the initial state to ``handle_initial_state``, key by key."""
    from ..batch import KeyedBatch

    batch = KeyedBatch.of(initial.drop(columns=[KEY_GROUP_COLUMN, INSTANCE_COLUMN]), context.key_columns)
    for key, key_rows in batch.per_key():
        context.set_current_key(key)
        processor.handle_initial_state(key, key_rows, context)


def _on_time(rows: InstanceRows, clock: BatchClock, *, woken: bool) -> tuple[Any, Any, dict[str, Any]]:
    """The rows the processor gets: no wake rows, and in event time none at or below the late watermark.

    Returns them (without dstl's columns), each one's key group as the routing computed
    it, and the batch's figures: the data rows, the largest event time seen (late rows
    count, as in Spark) and how many were late.
    """
    import numpy as np

    data = rows.where(rows.numbers(KEY_GROUP_COLUMN) != WAKE_KEY_GROUP) if woken and len(rows) else rows
    stats: dict[str, Any] = {"rows": len(data)}
    if EVENT_TIME_COLUMN in data.columns:
        event = np.asarray(data.numbers(EVENT_TIME_COLUMN), dtype=np.float64)  # a null is NaN
        known = ~np.isnan(event)
        stats["max_event_ms"] = int(event[known].max()) if known.any() else None
        late_before = clock.late_before()
        if late_before is not None:
            # Spark's rule: a row whose event time is at or below the watermark is late, and dropped
            on_time = ~known | (event > late_before)
            stats["late_rows"] = int(len(data) - int(on_time.sum()))
            data = data.where(on_time)
        data = data.without([EVENT_TIME_COLUMN])
    routed = np.asarray(data.numbers(KEY_GROUP_COLUMN), dtype=np.int64)
    return data.without([KEY_GROUP_COLUMN, INSTANCE_COLUMN]), routed, stats


def _handled(processor: StatefulProcessor, rows: InstanceRows, context: StateContext) -> Any:
    """The processor's output for the batch's rows: Arrow rows go to its batch API as they are.

    A processor that overrides ``handle_input_batch`` gets the pandas frame it declares.
    """
    if (
        isinstance(rows, ArrowRows)
        and type(processor).handle_input_batch is StatefulProcessor.handle_input_batch
    ):
        return processor.handle_batch(keyed_batch(rows, context), context)
    return processor.handle_input_batch(rows.frame(), context)


def _fire_timers(
    processor: StatefulProcessor,
    context: StateContext,
    backend: ChangelogKeyedStateBackend,
    columns: tuple[str, ...],
) -> tuple[dict[str, list[Any]], int, int | None]:
    """Fire the batch's due timers through ``handle_expired_timer``: its rows, how many fired, the next."""
    clock = context.clock
    up_to, domain = clock.fire_up_to(), clock.timer_domain()
    if domain is None:
        return output_columns(None, columns), 0, None
    timers = backend.timers()
    collected, fired = Collected(), 0
    if up_to is not None:  # None: event time before any watermark
        for key, expiry in timers.fire(up_to, domain):
            context.keys_touched.add(key)
            collected.add(processor.handle_expired_timer(key, expiry, context))
            fired += 1
    return output_columns(collected.columns(), columns), fired, timers.next_expiry(domain)


def _anonymous_rss() -> int:
    """This worker's anonymous resident memory in bytes (Linux), 0 where the system does not tell."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0
