"""Executor side: process one operator instance's rows of a micro-batch and checkpoint its state.

Runs inside ``applyInPandas`` once per instance that has rows in the batch. The
previous checkpoint's snapshots come from the driver in the :class:`TaskPlan`;
the result is the processor's rows plus one row carrying the new snapshot and
the instance's figures.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dstl.spi import Config, StateChangelogStorage, StorageMetrics, load_storage

from ...changelog import BackendSnapshot, ChangelogKeyedStateBackend, rebase
from ...keygroups import key_group_range_for_instance
from ..placement import instance_name, snapshot_for_range
from ..processor import BatchClock, StateContext, StatefulProcessor
from .collected import Collected
from .working_copy import WorkingCopy, snapshot_digest

if TYPE_CHECKING:
    from ...changelog.materializer import Materializer

log = logging.getLogger(__name__)

__all__ = [
    "EVENT_TIME_COLUMN",
    "INSTANCE_COLUMN",
    "KEY_GROUP_COLUMN",
    "SNAPSHOT_COLUMN",
    "STATS_COLUMN",
    "WAKE_KEY_GROUP",
    "TaskPlan",
    "cogroup_function",
    "instance_function",
    "pinned_function",
    "run_instance",
    "storage_figures",
]

KEY_GROUP_COLUMN = "__dstl_key_group"
INSTANCE_COLUMN = "__dstl_instance"
SNAPSHOT_COLUMN = "__dstl_snapshot"
STATS_COLUMN = "__dstl_stats"
#: A row's event time in epoch ms (from the query's event-time column), added by the driver.
EVENT_TIME_COLUMN = "__dstl_event_ms"
#: The key group of a row that carries no data and only makes its instance run (a timer is due).
WAKE_KEY_GROUP = -1

# Storages are thread-safe and batch the persists of many writers: one per config and process.
_STORAGES: dict[str, StateChangelogStorage] = {}
_EPOCH_RUN = 10**12  # epoch = run * 10^12 + Spark's task attempt id (unique, increasing within a run)


@dataclass(frozen=True)
class TaskPlan:
    """What every task of one micro-batch needs (built on the driver, shipped to executors)."""

    config: dict[str, Any]
    job_id: str
    operator_id: str
    key_columns: tuple[str, ...]
    output_columns: tuple[str, ...]
    parallelism: int
    max_parallelism: int
    batch_id: int
    run_id: int
    working_dir: str
    previous: dict[str, str] = field(default_factory=dict)  # instance name -> snapshot JSON
    materialize: frozenset[int] = frozenset()  # instances whose state is materialized this batch
    # instance name -> digests of its snapshots in recently completed checkpoints: a working
    # copy stamped with one of them holds committed state and may catch up from it.
    lineage: dict[str, tuple[str, ...]] = field(default_factory=dict)
    clock: BatchClock = field(default_factory=lambda: BatchClock(int(time.time() * 1000)))
    # instances that run even without rows: one of their timers is due
    wake: frozenset[int] = frozenset()


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


def output_columns(result: Any, columns: tuple[str, ...]) -> dict[str, list[Any]]:
    """A processor's output as one list per output column (equal lengths), whatever form it came in.

    :raises TypeError: on a result that is no DataFrame, mapping, iterable of dicts or ``None``.
    :raises ValueError: on rows that lack an output column, or columns of different lengths.
    """
    import pandas as pd

    if result is None:
        return {name: [] for name in columns}
    if isinstance(result, pd.DataFrame):
        found = {name: result[name].tolist() for name in result.columns}
    elif isinstance(result, Mapping):
        found = {name: list(values) for name, values in result.items()}
    elif isinstance(result, Iterable):
        rows = list(result)
        if any(not isinstance(row, Mapping) for row in rows):
            msg = "a processor's output rows must be dicts (column -> value)"
            raise TypeError(msg)
        present = {name for row in rows for name in row}
        found = {name: [row.get(name) for row in rows] for name in columns if name in present}
    else:
        msg = f"a processor returns a DataFrame, a mapping of columns, row dicts or None, not {type(result)}"
        raise TypeError(msg)
    lengths = {len(values) for values in found.values()}
    if len(lengths) > 1:
        sizes = {name: len(values) for name, values in found.items()}
        msg = f"a processor returned output columns of different lengths: {sizes}"
        raise ValueError(msg)
    count = lengths.pop() if lengths else 0
    missing = [name for name in columns if name not in found]
    if missing and count:
        msg = f"a processor returned rows without the output columns {missing}"
        raise ValueError(msg)
    return {name: found.get(name, [None] * count) for name in columns}


def run_instance(
    plan: TaskPlan,
    make_processor: Callable[[], StatefulProcessor],
    rows: Any,
    initial: Any = None,
) -> Any:
    """Process ``rows`` (one instance's rows of the batch); returns output rows + the snapshot row."""
    import pandas as pd

    source = rows if len(rows) else initial
    instance = int(source[INSTANCE_COLUMN].iloc[0])
    output, meta = process_instance(plan, make_processor, rows, instance, initial)
    frame = pd.DataFrame(output)
    frame[SNAPSHOT_COLUMN] = pd.Series([None] * len(frame), dtype=object)
    frame[STATS_COLUMN] = pd.Series([None] * len(frame), dtype=object)
    meta_row = pd.DataFrame([meta], columns=[*plan.output_columns, SNAPSHOT_COLUMN, STATS_COLUMN])
    return pd.concat([frame, meta_row], ignore_index=True) if len(frame) else meta_row


def process_instance(
    plan: TaskPlan,
    make_processor: Callable[[], StatefulProcessor],
    rows: Any,
    instance: int,
    initial: Any = None,
) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    """Process instance ``instance``'s ``rows`` of the batch (maybe none: a timer is due).

    The initial state's rows (first batch only) go to ``handle_initial_state``
    first, then the batch's rows (late ones dropped) to the processor, then the
    timers due fire. Returns the output columns and the snapshot row.
    """
    began = time.perf_counter()
    key_groups = key_group_range_for_instance(instance, plan.parallelism, plan.max_parallelism)
    name = instance_name(key_groups)
    previous = snapshot_for_range(
        {n: BackendSnapshot.from_json(text) for n, text in plan.previous.items()}, key_groups
    )
    cfg = Config.of(plan.config)
    attempt_id, task_attempt = _attempt()
    storage = _storage(plan)
    copy = WorkingCopy(
        f"{plan.working_dir}/{plan.job_id}/{plan.operator_id}",
        name,
        map_size=int(cfg["state.backend.lmdb.map-size"]),
    )
    with copy.exclusive():
        stamp = copy.stamp()
        warm = stamp is not None and stamp["digest"] == snapshot_digest(previous)
        committed = stamp is not None and stamp["digest"] in plan.lineage.get(name, ())
        copy.invalidate()
        backend = ChangelogKeyedStateBackend.from_config(
            storage,
            f"{plan.operator_id}.{name}",
            key_groups,
            cfg,
            epoch=epoch_for(plan.run_id, attempt_id),
            delegate=copy.delegate,
            periodic_materialization=False,  # the driver plans materializations (plan.materialize)
        )
        counted = storage.metrics.counters()  # the worker runs one task at a time: the delta is ours
        try:
            restore_began = time.perf_counter()
            mode, restored_bytes = _bring_up(
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
            phases = {
                "open": round((restore_began - began) * 1000, 3),
                "bring_up": round(restore_seconds * 1000, 3),
            }
            process_began = time.perf_counter()
            processor = make_processor()
            context = StateContext(backend, plan.batch_id, task_attempt, plan.key_columns, plan.clock)
            processor.init(context)
            if initial is not None and len(initial):
                _load_initial_state(processor, context, initial)
            user_rows, event_stats = _on_time(rows, plan.clock, woken=instance in plan.wake)
            output = (
                output_columns(processor.handle_input_batch(user_rows, context), plan.output_columns)
                if len(user_rows)
                else output_columns(None, plan.output_columns)
            )
            fired, fired_count, next_timer = _fire_timers(processor, context, backend, plan.output_columns)
            for column in plan.output_columns:
                output[column].extend(fired[column])
            keys = len(context.keys_touched)
            processor.close()
            phases["process"] = round((time.perf_counter() - process_began) * 1000, 3)
            phases.update(context.phases_ms)  # e.g. group, inside process
            materialized = instance in plan.materialize and not _materializing(copy)
            rebased: Future[BackendSnapshot] | None = None
            materialize_began = time.perf_counter()
            if materialized:
                # The snapshot is written in the background, past this task: a later batch of the
                # instance moves its checkpoint onto it once it is complete (see _bring_up).
                snapshot, rebased = backend.checkpoint_materializing(plan.batch_id)
                _RUNNING[copy.path] = rebased
                materialization_ms = round((time.perf_counter() - materialize_began) * 1000, 3)
            else:
                materialization_ms = 0.0
                snapshot = backend.checkpoint(plan.batch_id).result()
            metrics = backend.metrics()
            registrations = backend.registrations()
            copy.keep_expired(backend.pending_expired())
            phases["checkpoint"] = round((time.perf_counter() - materialize_began) * 1000, 3)
        finally:
            backend.close(wait_for_materialization=False)
        mark_began = time.perf_counter()
        copy.mark(snapshot, registrations)
        phases["stamp"] = round((time.perf_counter() - mark_began) * 1000, 3)
    if rebased is not None:
        checkpoint, materializer = snapshot, backend.materializer
        rebased.add_done_callback(lambda done: _offer(copy, checkpoint, done, plan.run_id, materializer))
    stats = {
        "instance": name,
        "rows": event_stats.pop("rows"),
        "keys": keys,
        "warm": mode in ("warm", "rebased"),
        "restore": "warm" if mode == "rebased" else mode,
        "restored_bytes": restored_bytes,
        "materialized": materialized,
        "restore_ms": round(restore_seconds * 1000, 3),
        "checkpoint_ms": metrics["lastCheckpointDuration"],
        "materialization_ms": materialization_ms,  # what starting it cost this task
        "rebased": mode == "rebased",
        "expired_removed": metrics["numberOfExpiredEntriesRemoved"],
        "storage": storage_figures(counted, storage.metrics),
        "persisted_bytes": metrics["lastIncSizeOfNonMaterializedState"]
        + metrics["lastIncSizeOfMaterializedState"],
        "full_bytes": metrics["lastFullSizeOfNonMaterializedState"]
        + metrics["lastFullSizeOfMaterializedState"],
        "task_ms": round((time.perf_counter() - began) * 1000, 3),
        "phases_ms": phases,
        "attempt": task_attempt,
        "timers_fired": fired_count,
        "next_timer": next_timer,
        **event_stats,
    }
    meta: dict[str, Any] = {column: None for column in plan.output_columns}
    meta[SNAPSHOT_COLUMN] = json.dumps({"name": name, "snapshot": json.loads(snapshot.to_json())})
    meta[STATS_COLUMN] = json.dumps(stats)
    return output, meta


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


def _on_time(rows: Any, clock: BatchClock, *, woken: bool) -> tuple[Any, dict[str, Any]]:
    """The rows the processor gets: no wake rows, and in event time none at or below the watermark.

    Returns them (without dstl's columns) and the batch's figures: the data rows,
    the largest event time seen (late rows count, as in Spark) and how many were late.
    """
    data = rows[rows[KEY_GROUP_COLUMN] != WAKE_KEY_GROUP] if woken and len(rows) else rows
    stats: dict[str, Any] = {"rows": len(data)}
    if EVENT_TIME_COLUMN in data.columns:
        event = data[EVENT_TIME_COLUMN]
        stats["max_event_ms"] = int(event.max()) if event.notna().any() else None
        if clock.watermark_ms is not None:
            # Spark's rule: a row whose event time is at or below the watermark is late, and dropped
            on_time = event.isna() | (event > clock.watermark_ms)
            stats["late_rows"] = int(len(data) - int(on_time.sum()))
            data = data[on_time]
        data = data.drop(columns=[EVENT_TIME_COLUMN])
    return data.drop(columns=[KEY_GROUP_COLUMN, INSTANCE_COLUMN]), stats


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


def _bring_up(
    backend: ChangelogKeyedStateBackend,
    copy: WorkingCopy,
    stamp: dict[str, Any] | None,
    previous: BackendSnapshot | None,
    *,
    warm: bool,
    committed: bool,
    cfg: Config,
    run_id: int,
) -> tuple[str, int]:
    """Bring the working copy to ``previous``; returns how and the bytes read.

    How is ``warm``, ``rebased``, ``caught_up``, ``full`` or ``fresh``.

    Warm: the copy is at ``previous`` already; rebased: also, and a background
    materialization of an earlier batch completed, so the checkpoint moves onto it.
    Caught up: it holds an earlier committed checkpoint of the same lineage (the
    instance ran elsewhere since), and only the log and incremental snapshots after
    it are applied. Otherwise
    the copy is cleared and restored in full (``fresh`` when there is no state yet).
    """
    offer = copy.take_offer()
    # Expired keys a full snapshot found: the offer's (newest) or what the last task left.
    expired = copy.take_expired()
    rebased = None
    if offer is not None and warm and previous is not None and offer.run_id == run_id:
        rebased = rebase(previous, offer.checkpoint, offer.rebased)
    if offer is not None:
        expired = offer.expired or expired
        if rebased is None:
            # Never to be referenced (only this offer could have): remove what it wrote.
            referenced = {
                *offer.checkpoint.references,
                *(previous.references if previous is not None else ()),
            }
            backend.materializer.discard([ref for ref in offer.rebased.references if ref not in referenced])
    if expired:
        backend.expect_expired(expired)  # hints only: each key is checked again before removal
    if warm:
        if previous is None:
            return "warm", 0
        backend.resume(rebased or previous, stamp["registrations"], cfg)  # type: ignore[index]
        return ("rebased" if rebased else "warm"), 0
    if committed and previous is not None and stamp is not None and stamp["snapshot"] is not None:
        read = backend.catch_up(stamp["snapshot"], previous, stamp["registrations"], cfg)
        if read is not None:
            return "caught_up", read
    copy.delegate.clear()
    if previous is None:
        return "fresh", 0
    backend.restore(previous, cfg)
    return "full", sum(h.size for h in previous.all_handles) + sum(
        ref.size for ref in previous.all_materialized
    )


# Background materializations of this process, by working copy: one at a time per instance.
_RUNNING: dict[Path, Future[BackendSnapshot]] = {}


def _materializing(copy: WorkingCopy) -> bool:
    running = _RUNNING.get(copy.path)
    return running is not None and not running.done()


def _offer(
    copy: WorkingCopy,
    checkpoint: BackendSnapshot,
    rebased: Future[BackendSnapshot],
    run_id: int,
    materializer: Materializer,
) -> None:
    """Hand a completed background materialization (and what it found expired) to the next task."""
    try:
        copy.offer(checkpoint, rebased.result(), run_id, materializer.take_expired())
    except Exception as exc:
        log.warning("background materialization of %s failed: %s", copy.path.name, exc)


def pinned_function(
    plan: TaskPlan,
    make_processor: Callable[[], StatefulProcessor],
    columns: tuple[str, ...],
    float_columns: frozenset[str],
) -> Callable[[Iterable[tuple[int, list[Any]]]], Iterable[tuple[Any, ...]]]:
    """The ``mapPartitions`` function of sticky placement: ``(instance, rows)`` in, result tuples out.

    :param columns: the names of the rows' fields (the routed batch's columns).
    :param float_columns: output columns of a floating type, where NaN is a value; in
        the others it marks a missing value (pandas' way), which becomes null.
    """
    names = (*plan.output_columns, SNAPSHOT_COLUMN, STATS_COLUMN)

    def cell(name: str, value: Any) -> Any:
        if isinstance(value, float) and math.isnan(value) and name not in float_columns:
            return None
        return value.item() if hasattr(value, "item") and not isinstance(value, str) else value

    def process(pairs: Iterable[tuple[int, list[Any]]]) -> Iterable[tuple[Any, ...]]:
        import pandas as pd

        outputs = plan.output_columns
        for instance, rows in pairs:
            # an instance without rows or due timers carries its snapshot forward (driver side)
            if rows or instance in plan.wake:
                began = time.perf_counter()
                frame = pd.DataFrame.from_records(rows, columns=list(columns))
                decoded = time.perf_counter()
                output, meta = process_instance(plan, make_processor, frame, instance)
                encoding = time.perf_counter()
                cleaned = [[cell(name, value) for value in output[name]] for name in outputs]
                yield from ((*row, None, None) for row in zip(*cleaned, strict=True))
                stats = json.loads(meta[STATS_COLUMN])
                stats["phases_ms"] = {
                    "decode": round((decoded - began) * 1000, 3),
                    **stats["phases_ms"],
                    "encode": round((time.perf_counter() - encoding) * 1000, 3),
                }
                meta[STATS_COLUMN] = json.dumps(stats)
                yield tuple(cell(name, meta.get(name)) for name in names)

    return process


def instance_function(
    plan: TaskPlan, make_processor: Callable[[], StatefulProcessor]
) -> Callable[[Any], Any]:
    """The ``applyInPandas`` function of one batch (a plain function: Spark inspects its signature)."""

    def process(rows):  # noqa: ANN001, ANN202 - no hints: Spark would try to infer an eval type
        return run_instance(plan, make_processor, rows)

    return process


def cogroup_function(
    plan: TaskPlan, make_processor: Callable[[], StatefulProcessor]
) -> Callable[[Any, Any], Any]:
    """The ``cogroup(...).applyInPandas`` function of a first batch with an initial state."""

    def process(rows, initial):  # noqa: ANN001, ANN202 - no hints: Spark would try to infer an eval type
        return run_instance(plan, make_processor, rows, initial)

    return process
