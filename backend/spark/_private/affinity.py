"""Sticky placement: each operator instance runs on the executor that holds its working copy.

Spark places the tasks of a shuffle's reduce side wherever a core is free, so
an instance's working copy would go cold on most batches of a multi-executor
job. Spark's own state stores avoid that with preferred locations. Here, the
instances' rows are shuffled into one partition per instance and zipped with a
one-element-per-partition RDD whose partitions carry the home executor of the
instance (``executor_<host>_<id>``, an executor-level task location); the
zipped partitions inherit that preference, and Spark's delay scheduling
(``spark.locality.wait``) keeps each instance on its executor while it lives.

Everything that reaches into the JVM through the session's gateway lives in
this module; when it is not available (Spark Connect, a changed internal API),
:func:`pinned_instances` returns ``None`` once, says why, and the caller falls
back to ``applyInPandas`` placement.
"""

from __future__ import annotations

import logging
import os
import pickle
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from dstl.spi import Config

from ..options import (
    SPARK_PLACEMENT,
    SPARK_STANDBY_REFRESH_INTERVAL,
    SPARK_STANDBY_REPLICAS,
    SPARK_WORKING_DIR,
)
from .protocol import InstanceStats, Restore
from .report_channel import TaskStatus

__all__ = ["ExecutorHomes", "executors_to_pin", "pinned_instances"]

log = logging.getLogger(__name__)

#: Restores that say the instance's task ran where its copy was not at the base.
_MOVED = frozenset({Restore.CAUGHT_UP, Restore.FULL})

#: ``(executor id, host)``
Executor = tuple[str, str]

#: The most tasks of one stage read back to find where a batch's tasks ran.
_MOST_TASKS = 100_000


class ExecutorHomes:
    """Driver side: the home executor of every instance, kept while that executor lives.

    Instances whose executor is gone (or that have none yet) move to their standby
    executor when it lives, else to the live executor with the fewest instances; the
    others never move, so a new or a lost executor moves only the instances it must.

    Homes are balanced again without a full restore in the batch (Kafka Streams'
    warm-up replicas): while one executor has two instances more than another (a lost
    executor's replacement has none), one instance of the fullest keeps a copy on the
    emptiest, refreshed as a standby copy is, and moves there once a task there reports
    that copy warm (:mod:`.standby`). An instance without state moves at once.

    With ``standby_replicas`` (:mod:`.standby`), each instance also has a standby
    executor other than its home, kept while both live: the tasks that run there keep
    a copy of the instance's state near its latest checkpoint. It is on another host,
    or on any other executor when each has its own working directory.
    """

    #: Seconds the live executors are known without asking the scheduler again (a batch's planning
    #: otherwise pays a status-store round trip per executor); a task preferring an executor that
    #: died meanwhile runs anywhere at once (Spark drops locality levels with no live executor).
    EXECUTORS_TTL = 5.0

    def __init__(
        self, standby_replicas: int = 0, *, own_directories: bool = False, refresh_interval: float = 0.0
    ) -> None:
        self._homes: dict[int, Executor] = {}  # instance -> (executor id, host)
        self._standbys: dict[int, Executor] = {}  # instance -> its standby executor
        self.standby_replicas = standby_replicas
        #: seconds between two refreshes of an instance's standby copy
        self.refresh_interval = refresh_interval
        self._refreshed_at: dict[tuple[int, Executor], float] = {}  # when a copy was last asked to refresh
        #: each executor has its own working directory (a relative one: under the executor's own
        #: directory); else a host's executors share one, and a standby must be on another host
        self.own_directories = own_directories
        #: per instance, the instances whose standby copies its task keeps (on its home executor);
        #: past the instances, per executor of :attr:`standby_only`, the copies its task keeps
        self.standby_work: dict[int, tuple[int, ...]] = {}
        #: partitions past the instances, each a task on an executor home to no instance
        self.standby_only: dict[int, tuple[str, str]] = {}
        #: Why pinning is not available to this query (then it is not tried again).
        self.unavailable: str | None = None
        self._executors: list[tuple[str, str]] = []
        self._executors_at = -float("inf")
        self.jvm: Any = None  # the JVM classes pinning uses, once looked up
        self._warmups: dict[int, Executor] = {}  # instance -> the emptier executor it is to move to
        self._warm: dict[int, set[Executor]] = {}  # instance -> executors a task said hold a warm copy
        self._tasks: list[TaskStatus] = []  # the last batch's tasks, until noticed
        self._tasks_ran_on: dict[int, Executor] | None = None  # where they ran, once looked up

    @classmethod
    def of(cls, cfg: Config) -> ExecutorHomes | None:
        """The homes of a query configured by ``cfg``: ``None`` unless its placement is sticky."""
        if cfg.get(SPARK_PLACEMENT) != "sticky":
            return None
        working_dir = cfg.get(SPARK_WORKING_DIR)
        own = working_dir is not None and not os.path.isabs(working_dir)
        return cls(
            cfg.get(SPARK_STANDBY_REPLICAS),
            own_directories=own,
            refresh_interval=cfg.get(SPARK_STANDBY_REFRESH_INTERVAL),
        )

    def live_executors(self, sc: Any) -> list[tuple[str, str]]:
        """The live executors, asked of the scheduler at most every :attr:`EXECUTORS_TTL` seconds."""
        now = time.monotonic()
        if now - self._executors_at >= self.EXECUTORS_TTL:
            self._executors, self._executors_at = live_executors(sc), now
        return self._executors

    def noticed(self, stats: Iterable[InstanceStats]) -> None:
        """A batch's instances: where one found no warm copy it ran off its home.

        Then the scheduler is asked for the executors again (an executor lost within
        :attr:`EXECUTORS_TTL` would otherwise stay a home until the list expires), and
        an instance whose task ran on another live executor makes that one its home:
        its copy there is now the latest (Spark ran the task elsewhere once the home's
        core stayed busy past ``spark.locality.wait``, or retried it elsewhere).
        """
        tasks, ran_on = self._tasks, self._tasks_ran_on
        self._tasks, self._tasks_ran_on = [], None
        if not any(item.restore in _MOVED for item in stats):
            return
        self._executors_at = -float("inf")
        for partition, executor in (ran_on if ran_on is not None else self._ran_on(tasks)).items():
            if self._homes.get(partition, executor) != executor:
                log.info("dstl: instance %d ran on executor %s: its home now", partition, executor[0])
                self._homes[partition] = executor

    def observed(self, tasks: list[TaskStatus]) -> None:
        """A batch's tasks (their partitions and attempts), and their word on the standby copies they keep.

        Kept for :meth:`noticed`; copies reported warm or cold are noted where their task ran.
        """
        self._tasks, self._tasks_ran_on = tasks, None
        if any(copies for *_, copies in tasks):
            ran_on = self._ran_on(tasks)
            self._tasks_ran_on = ran_on or None  # noticed() needs no second look-up (unless none was found)
            for partition, _, _, copies in tasks:
                if partition in ran_on:
                    self.copies_at(ran_on[partition], copies)

    def _ran_on(self, tasks: list[TaskStatus]) -> dict[int, Executor]:
        """Partition -> the live executor its task ran on, from Spark's status store (a task cannot tell).

        Advice only: a task the store does not know yet, or an executor not in the list, is left out.
        """
        if self.jvm is None or not tasks:
            return {}
        try:
            executor_of = _task_executors(self.jvm.context, {stage for _, _, stage, _ in tasks})
        except Exception as exc:  # the store may not know the stage yet; the next batch tells again
            log.debug("dstl: where the batch's tasks ran is not known: %s", exc)
            return {}
        hosts = dict(self._executors)
        ran_on = {}
        for partition, task, _, _ in tasks:
            executor_id = executor_of.get(task)
            if executor_id is not None and executor_id in hosts:
                ran_on[partition] = (executor_id, hosts[executor_id])
        return ran_on

    def copies_at(self, executor: Executor, copies: Iterable[tuple[int, bool]]) -> None:
        """``executor``'s copies of instances: ``(instance, warm)``, as a task that ran there found them."""
        for instance, warm in copies:
            held = self._warm.setdefault(instance, set())
            if warm:
                held.add(executor)
            else:
                held.discard(executor)

    def assign(
        self, parallelism: int, executors: list[tuple[str, str]], with_state: frozenset[int] | None = None
    ) -> dict[int, str]:
        """Task locations (``executor_<host>_<id>``) of instances ``0..parallelism-1`` on ``executors``.

        Also sets :attr:`standby_work`; the locations go on past the instances for
        :attr:`standby_only` (the caller adds a partition for each).

        :param executors: ``(id, host)`` of the live executors (the driver excluded).
        :param with_state: the instances that have state (``None``: all): a standby of one without
            is not refreshed (nor counted as refreshed) yet.
        :returns: nothing when there is no executor yet (no preference).
        """
        if not executors:
            self.standby_work, self.standby_only = {}, {}
            return {}
        live = set(executors)
        homes = {i: home for i, home in self._homes.items() if i < parallelism and home in live}
        load = Counter(homes.values())
        for executor in executors:
            load.setdefault(executor, 0)
        moved = False
        for instance in range(parallelism):
            if instance not in homes:
                copy = self._standbys.get(instance) or self._warmups.get(instance)
                home = copy if copy in live else min(sorted(live), key=lambda e: load[e])
                homes[instance] = home
                load[home] += 1
                moved = True
        self._warm = {i: {e for e in held if e in live} for i, held in self._warm.items() if i < parallelism}
        if not moved:  # one change of homes a batch: a loss's moves first, balancing after
            self._balance(homes, load, with_state)
        self._homes = homes
        self._assign_standbys(parallelism, live, with_state)
        return {
            i: f"executor_{host}_{executor}" for i, (executor, host) in {**homes, **self.standby_only}.items()
        }

    def _balance(
        self, homes: dict[int, Executor], load: Counter[Executor], with_state: frozenset[int] | None
    ) -> None:
        """Move an instance from the fullest executor to the emptiest (two apart) once its copy there is warm.

        Until then the instance keeps a warm-up copy on the emptiest (:attr:`_warmups`).
        """
        fullest = max(sorted(load), key=lambda e: load[e])
        emptiest = min(sorted(load), key=lambda e: load[e])
        if load[fullest] - load[emptiest] < 2:
            self._warmups.clear()
            return
        on_fullest = [i for i in sorted(homes) if homes[i] == fullest]
        ready = [
            i
            for i in on_fullest
            if emptiest in self._warm.get(i, ()) or (with_state is not None and i not in with_state)
        ]
        if ready:
            instance = ready[0]
            log.info(
                "dstl: instance %d moves from executor %s to %s (balancing)",
                instance,
                fullest[0],
                emptiest[0],
            )
            homes[instance] = emptiest
            load[fullest] -= 1
            load[emptiest] += 1
            self._warmups.pop(instance, None)
            if self.standby_replicas:
                self._standbys[instance] = fullest  # its former home: the warmest copy after this one
            return
        self._warmups = {i: e for i, e in self._warmups.items() if homes.get(i) == fullest and e == emptiest}
        if not self._warmups and on_fullest:
            self._warmups[on_fullest[0]] = emptiest

    def _assign_standbys(
        self, parallelism: int, live: set[tuple[str, str]], with_state: frozenset[int] | None
    ) -> None:
        """A live standby executor per instance besides its home (kept while it may be); the work."""
        homes = self._homes
        candidates = {  # another executor with a directory of its own: another host's, or each has its own
            i: sorted(e for e in live - {homes[i]} if self.own_directories or e[1] != homes[i][1])
            for i in range(parallelism)
        }
        standbys = {
            i: executor
            for i, executor in self._standbys.items()
            if self.standby_replicas and i < parallelism and executor in candidates[i]
        }
        load = Counter(standbys.values())
        for instance, others in candidates.items():
            if self.standby_replicas and instance not in standbys and others:
                home_host = homes[instance][1]  # other hosts first, then the least loaded
                standbys[instance] = min(others, key=lambda e: (e[1] == home_host, load[e]))
                load[standbys[instance]] += 1
        now = time.monotonic()
        kept_on: dict[Executor, list[int]] = {}
        copies = sorted({*standbys.items(), *((i, e) for i, e in self._warmups.items() if e != homes[i])})
        for instance, executor in copies:
            if with_state is not None and instance not in with_state:
                continue  # nothing to copy yet
            if now - self._refreshed_at.get((instance, executor), -float("inf")) >= self.refresh_interval:
                self._refreshed_at[(instance, executor)] = now  # a new copy starts at once
                kept_on.setdefault(executor, []).append(instance)
        kept = set(copies)
        self._refreshed_at = {key: at for key, at in self._refreshed_at.items() if key in kept}
        self._standbys = standbys
        self.standby_work = {i: tuple(kept_on[homes[i]]) for i in range(parallelism) if homes[i] in kept_on}
        # an executor home to no instance (a lost one's replacement) gets a task of its own for them
        idle = sorted(set(kept_on) - set(homes.values()))
        self.standby_only = {parallelism + k: executor for k, executor in enumerate(idle)}
        self.standby_work.update({i: tuple(kept_on[e]) for i, e in self.standby_only.items()})


def live_executors(sc: Any) -> list[tuple[str, str]]:
    """``(id, host)`` of the live executors, from the driver's status store (the driver excluded)."""
    jvm = sc._jvm
    summaries = jvm.scala.jdk.javaapi.CollectionConverters.asJava(
        sc._jsc.sc().statusStore().executorList(True)
    )
    found = []
    for summary in _java_list_items(summaries):
        executor = str(summary.id())
        if executor != "driver":
            found.append((executor, str(summary.hostPort()).rsplit(":", 1)[0]))
    return sorted(found)


def _java_list_items(items: Any) -> Iterator[Any]:
    """The elements of a ``java.util.List`` through the gateway, by index.

    Iterating one through py4j ends on the JVM's ``NoSuchElementException``, which
    PySpark converts through dozens of round trips: 35-50 ms a list, on a batch's
    plan, against 3 ms by index.
    """
    return (items.get(index) for index in range(items.size()))


def _task_executors(sc: Any, stages: set[int]) -> dict[int, str]:
    """Task attempt id -> the executor that ran it, for the tasks of ``stages`` (every attempt of each)."""
    store = sc._jsc.sc().statusStore()
    as_java = sc._jvm.scala.jdk.javaapi.CollectionConverters.asJava
    found: dict[int, str] = {}
    for stage in stages:
        for attempt in range(store.lastStageAttempt(stage).attemptId() + 1):
            for task in _java_list_items(as_java(store.taskList(stage, attempt, _MOST_TASKS))):
                found[int(task.taskId())] = str(task.executorId())
    return found


class _Jvm:
    """The JVM classes pinning uses, looked up once per query (each lookup is a gateway round trip)."""

    def __init__(self, sc: Any) -> None:
        jvm = sc._jvm
        self.context = sc
        self.converters = jvm.scala.jdk.javaapi.CollectionConverters
        self.tuple2 = jvm.scala.Tuple2
        self.byte_array = jvm.scala.reflect.ClassTag.apply(jvm.java.lang.Class.forName("[B"))


def pinned_instances(
    sc: Any, groups: Any, homes: ExecutorHomes, with_state: frozenset[int] | None = None
) -> Any:
    """``(instance, rows)`` per partition of ``groups``, each partition preferring its instance's home.

    :param groups: a Python RDD with one partition per instance, each holding one
        element (the instance's rows, e.g. from ``glom()``).
    :param homes: the driver's home executors, updated with the live executors.
    :param with_state: the instances that have state (``None``: all): only theirs have standbys to refresh.
    :returns: the zipped RDD, or ``None`` when the gateway cannot build it (the
        caller falls back; the reason is logged once).
    """
    if homes.unavailable is not None:
        return None
    try:
        instances = groups.getNumPartitions()
        locations = homes.assign(instances, homes.live_executors(sc), with_state)
        partitions = max(locations, default=instances - 1) + 1
        if partitions > instances:  # standby-only tasks: a partition each, without rows
            groups = groups.union(sc.parallelize([[]] * (partitions - instances), partitions - instances))
        from pyspark.rdd import RDD
        from pyspark.serializers import CPickleSerializer, PairDeserializer

        if homes.jvm is None or homes.jvm.context is not sc:
            homes.jvm = _Jvm(sc)
        jvm = homes.jvm
        elements = []
        for instance in range(partitions):
            preferred = [locations[instance]] if instance in locations else []
            elements.append(
                jvm.tuple2(bytearray(pickle.dumps(instance)), jvm.converters.asScala(preferred).toSeq())
            )
        preferring = sc._jsc.sc().makeRDD(jvm.converters.asScala(elements).toSeq(), jvm.byte_array)
        zipped = preferring.toJavaRDD().zip(groups._jrdd)
        return RDD(zipped, sc, PairDeserializer(CPickleSerializer(), groups._jrdd_deserializer))
    except Exception as exc:
        _unavailable(homes, exc)
        return None


def executors_to_pin(sc: Any, homes: ExecutorHomes) -> list[tuple[str, str]] | None:
    """The live executors instances may be pinned to (none in local mode: only the driver runs tasks).

    ``None`` when the gateway cannot tell (the caller falls back; the reason is logged once).
    """
    if homes.unavailable is not None:
        return None
    try:
        return homes.live_executors(sc)
    except Exception as exc:
        _unavailable(homes, exc)
        return None


def _unavailable(homes: ExecutorHomes, exc: Exception) -> None:
    homes.unavailable = str(exc)
    log.warning(
        "dstl: sticky placement is not available (%s); instances run where Spark places them "
        "(set dstl.spark.placement=spark to silence this)",
        exc,
    )


def arrow_batches(frame: Any) -> Any:
    """``frame``'s rows as a Python RDD of Arrow record batch messages (the JVM converts them).

    Each element is one IPC message without its schema (``pyarrow.ipc.read_record_batch``
    reads it with the schema of ``frame``).
    """
    from pyspark.rdd import RDD
    from pyspark.serializers import NoOpSerializer

    return RDD(frame._jdf.toArrowBatchRdd().toJavaRDD(), frame.sparkSession.sparkContext, NoOpSerializer())
