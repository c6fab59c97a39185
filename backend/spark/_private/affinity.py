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
import pickle
import time
from collections import Counter
from typing import Any

__all__ = ["ExecutorHomes", "executors_to_pin", "pinned_instances"]

log = logging.getLogger(__name__)


class ExecutorHomes:
    """Driver side: the home executor of every instance, kept while that executor lives.

    Instances whose executor is gone (or that have none yet) move to the live
    executor with the fewest instances; the others never move, so a new or a lost
    executor moves only the instances it must.
    """

    #: Seconds the live executors are known without asking the scheduler again (a batch's planning
    #: otherwise pays a status-store round trip per executor); a task preferring an executor that
    #: died meanwhile runs anywhere at once (Spark drops locality levels with no live executor).
    EXECUTORS_TTL = 5.0

    def __init__(self) -> None:
        self._homes: dict[int, tuple[str, str]] = {}  # instance -> (executor id, host)
        #: Why pinning is not available to this query (then it is not tried again).
        self.unavailable: str | None = None
        self._executors: list[tuple[str, str]] = []
        self._executors_at = -float("inf")
        self.jvm: Any = None  # the JVM classes pinning uses, once looked up

    def live_executors(self, sc: Any) -> list[tuple[str, str]]:
        """The live executors, asked of the scheduler at most every :attr:`EXECUTORS_TTL` seconds."""
        now = time.monotonic()
        if now - self._executors_at >= self.EXECUTORS_TTL:
            self._executors, self._executors_at = live_executors(sc), now
        return self._executors

    def assign(self, parallelism: int, executors: list[tuple[str, str]]) -> dict[int, str]:
        """Task locations (``executor_<host>_<id>``) of instances ``0..parallelism-1`` on ``executors``.

        :param executors: ``(id, host)`` of the live executors (the driver excluded).
        :returns: nothing when there is no executor yet (no preference).
        """
        if not executors:
            return {}
        live = set(executors)
        homes = {i: home for i, home in self._homes.items() if i < parallelism and home in live}
        load = Counter(homes.values())
        for executor in executors:
            load.setdefault(executor, 0)
        for instance in range(parallelism):
            if instance not in homes:
                home = min(sorted(live), key=lambda e: load[e])
                homes[instance] = home
                load[home] += 1
        self._homes = homes
        return {i: f"executor_{host}_{executor}" for i, (executor, host) in homes.items()}


def live_executors(sc: Any) -> list[tuple[str, str]]:
    """``(id, host)`` of the live executors, from the driver's status store (the driver excluded)."""
    jvm = sc._jvm
    summaries = jvm.scala.jdk.javaapi.CollectionConverters.asJava(
        sc._jsc.sc().statusStore().executorList(True)
    )
    found = []
    for summary in summaries:
        executor = str(summary.id())
        if executor != "driver":
            found.append((executor, str(summary.hostPort()).rsplit(":", 1)[0]))
    return sorted(found)


class _Jvm:
    """The JVM classes pinning uses, looked up once per query (each lookup is a gateway round trip)."""

    def __init__(self, sc: Any) -> None:
        jvm = sc._jvm
        self.context = sc
        self.converters = jvm.scala.jdk.javaapi.CollectionConverters
        self.tuple2 = jvm.scala.Tuple2
        self.byte_array = jvm.scala.reflect.ClassTag.apply(jvm.java.lang.Class.forName("[B"))


def pinned_instances(sc: Any, groups: Any, homes: ExecutorHomes) -> Any:
    """``(instance, rows)`` per partition of ``groups``, each partition preferring its instance's home.

    :param groups: a Python RDD with one partition per instance, each holding one
        element (the instance's rows, e.g. from ``glom()``).
    :param homes: the driver's home executors, updated with the live executors.
    :returns: the zipped RDD, or ``None`` when the gateway cannot build it (the
        caller falls back; the reason is logged once).
    """
    if homes.unavailable is not None:
        return None
    try:
        partitions = groups.getNumPartitions()
        locations = homes.assign(partitions, homes.live_executors(sc))
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
