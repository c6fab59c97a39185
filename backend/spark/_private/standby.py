"""Standby copies: an executor keeps other instances' state near their latest checkpoint.

Kafka Streams' standby replicas, on Spark's executors (``dstl.spark.standby-replicas``).
The driver gives each instance a standby executor besides its home
(:class:`~.affinity.ExecutorHomes`) and names, in each task's plan, the standby copies
that task's executor keeps (:attr:`~.protocol.TaskPlan.standbys`). After its own
work, the task queues their refresh to a daemon thread of its worker: each copy is
brought to the instance's base checkpoint of the batch (one batch behind the
instance), the way a task brings up its own copy: a catch-up on the log and
incremental snapshots since its stamp, or a full restore the first time. When the
worker may be stopped as idle before the next batch (``InstancePlan.finish_in_task``),
the task waits for them before it ends (:func:`finish_refreshes`).

When the instance's home executor is lost, the driver moves it to its standby
executor, whose copy holds a committed checkpoint of its lineage: its task catches
up on a batch or two of changes instead of restoring the whole state. Before queuing
the refreshes, a task tells the driver which of its executor's copies can catch up
(:func:`keep_copies`): the driver moves a home onto an idle executor only where its
copy is warm (:meth:`~.affinity.ExecutorHomes.assign`).

A refresh never writes where the job keeps its state: its backend's own log is a
private in-memory one, and the handles are read through read-only storages. It
gives way to the worker's foreground work between copies, skips a copy another
task holds, and a failed refresh leaves the copy unstamped (the next one restores
it), with a warning.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterable
from contextlib import nullcontext

from dstl.spi import Config
from dstl.spi.memory import private_storage

from ...changelog import ChangelogKeyedStateBackend
from ...changelog.lineage import catch_up_delta
from ...changelog.settings import BackendSettings
from ...keygroups import key_group_range_for_instance
from ...pacing import give_way, in_background
from ..placement import instance_name
from .bring_up import bring_up, may_catch_up
from .protocol import FINISH_IN_TASK_WAIT_S, Restore, TaskPlan
from .task import working_copy_of
from .working_copy import held_checkpoint

log = logging.getLogger(__name__)

__all__ = ["copy_is_warm", "finish_refreshes", "keep_copies", "refresh_later", "refresh_standby"]

_QUEUE: queue.SimpleQueue[tuple[TaskPlan, int]] = queue.SimpleQueue()
_PENDING: set[tuple[str, str, int]] = set()  # (job, operator, instance) queued or refreshing
_LOCK = threading.Lock()
_REFRESHED = threading.Condition(_LOCK)  # notified as each queued refresh ends
_WORKER: threading.Thread | None = None


def keep_copies(plan: TaskPlan, instances: Iterable[int], warm: dict[int, bool]) -> None:
    """Note in ``warm`` whether this host's copy of each of ``instances`` can catch up, then refresh them."""
    instances = tuple(instances)
    for instance in instances:
        warm[instance] = copy_is_warm(plan, instance)
    refresh_later(plan, instances)


def copy_is_warm(plan: TaskPlan, instance: int) -> bool:
    """Whether this host's copy of ``instance`` holds its base in ``plan``, or a committed checkpoint before.

    Read from the copy's stamp alone: a copy being refreshed (unstamped meanwhile) is not warm.
    """
    own = plan.instance(instance)
    if own.base is None:
        return False
    return any(held_checkpoint(working_copy_of(plan, instance).stamp(), own.base, own.lineage))


def refresh_later(plan: TaskPlan, instances: Iterable[int]) -> None:
    """Queue the refresh of the standby copies of ``instances`` on this host (a daemon thread runs it)."""
    global _WORKER
    with _LOCK:
        for instance in instances:
            pending = (plan.job_id, plan.operator_id, instance)
            if pending not in _PENDING:
                _PENDING.add(pending)
                _QUEUE.put((plan, instance))
        if _WORKER is None or not _WORKER.is_alive():
            _WORKER = threading.Thread(target=_work, name="dstl-standby", daemon=True)
            _WORKER.start()


def _work() -> None:
    while True:
        plan, instance = _QUEUE.get()
        try:
            give_way()  # the worker's next task keeps the core
            refresh_standby(plan, instance)
        except Exception as exc:
            log.warning("dstl: standby copy of instance %d of %s: %s", instance, plan.operator_id, exc)
        finally:
            with _REFRESHED:
                _PENDING.discard((plan.job_id, plan.operator_id, instance))
                _REFRESHED.notify_all()


def finish_refreshes(plan: TaskPlan, instance: int) -> None:
    """Wait (bounded) for the refreshes ``instance``'s task queued, when its plan says to finish them.

    The plan says so when the worker may be stopped as idle before the next batch
    (``InstancePlan.finish_in_task``): a refresh running past the task ends with it.
    """
    if not plan.instance(instance).finish_in_task:
        return
    queued = {(plan.job_id, plan.operator_id, other) for other in plan.standbys.get(instance, ())}
    with _REFRESHED:
        done = _REFRESHED.wait_for(lambda: _PENDING.isdisjoint(queued), timeout=FINISH_IN_TASK_WAIT_S)
    if not done:
        log.warning(
            "dstl: standby copies of %s not refreshed within %g s of their task: left to the background",
            plan.operator_id,
            FINISH_IN_TASK_WAIT_S,
        )


def refresh_standby(plan: TaskPlan, instance: int) -> Restore | None:
    """Bring this host's copy of ``instance`` to its base checkpoint in ``plan``.

    :returns: how (``WARM``: it was there already), or ``None`` when there is nothing
        to do: the instance has no state yet, another task holds the copy, or the copy
        holds a later checkpoint of the lineage (the instance's own copy).
    """
    own = plan.instance(instance)
    target = own.base
    if target is None:
        return None
    cfg = Config.of(plan.config)
    copy = working_copy_of(plan, instance, cfg)
    with copy.exclusive(wait=False) as alone:
        if not alone:
            return None
        stamp = copy.stamp()
        warm, committed = held_checkpoint(stamp, target, own.lineage)
        if warm:
            return Restore.WARM
        held = stamp["snapshot"] if stamp is not None else None
        if held is not None and catch_up_delta(target, held) is not None:
            return None  # a later batch of the lineage: the instance's own copy, never moved back
        copy.invalidate()
        key_groups = key_group_range_for_instance(instance, plan.parallelism, plan.max_parallelism)
        with private_storage(plan.job_id, "standby") as storage:
            backend = ChangelogKeyedStateBackend(
                storage,
                f"{plan.operator_id}.{instance_name(key_groups)}",
                key_groups,
                delegate=copy.delegate,
                settings=BackendSettings.from_config(cfg, periodic_materialization=False),
            )
            # a full restore, whose work follows the state's size, gives way to the worker's next
            # task between its sections (a catch-up follows the batches' changes: it keeps pace)
            paced = nullcontext() if may_catch_up(stamp, target, committed=committed) else in_background()
            try:
                with paced:
                    mode, _ = bring_up(
                        backend,
                        copy,
                        stamp,
                        target,
                        warm=False,
                        committed=committed,
                        cfg=cfg,
                        run_id=plan.run_id,
                    )
                registrations = backend.registrations()
            finally:
                backend.close()
        copy.mark(target, registrations)
        return mode
