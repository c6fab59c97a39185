"""Configuration options of the Spark integration (``dstl.spark.*``; in Spark conf: ``spark.dstl.*``)."""

from __future__ import annotations

from dstl.spi import ConfigOption, OptionType

__all__ = [
    "SPARK_DROPPED_STATES",
    "SPARK_FINISH_IN_TASK_GAP",
    "SPARK_OPTIONS",
    "SPARK_PARALLELISM",
    "SPARK_PLACEMENT",
    "SPARK_STANDBY_REFRESH_INTERVAL",
    "SPARK_STANDBY_REPLICAS",
    "SPARK_WORKING_DIR",
]

SPARK_PARALLELISM: ConfigOption[int] = ConfigOption(
    "dstl.spark.parallelism",
    OptionType.INT,
    2,
    "Operator instances of a stateful Spark query (key-group ranges); change it to rescale.",
    minimum=1,
)

SPARK_WORKING_DIR: ConfigOption[str | None] = ConfigOption(
    "dstl.spark.working-dir",
    OptionType.STRING,
    None,
    "Local directory of the executors' working state (LMDB); default: the system temp dir.",
)

SPARK_PLACEMENT: ConfigOption[str] = ConfigOption(
    "dstl.spark.placement",
    OptionType.ENUM,
    "sticky",
    "sticky: each operator instance prefers the executor that ran it before (Spark's preferred "
    "locations; spark.locality.wait bounds the wait), so its working copy stays warm. spark: "
    "wherever Spark's scheduler puts it (applyInPandas).",
    choices=("sticky", "spark"),
)

SPARK_STANDBY_REPLICAS: ConfigOption[int] = ConfigOption(
    "dstl.spark.standby-replicas",
    OptionType.INT,
    0,
    "Standby working copies per operator instance (0 or 1; sticky placement on two or more executors): "
    "another executor keeps a copy of the instance's state within a batch of its latest checkpoint, "
    "in the background, and takes the instance over when its executor is lost, catching up instead of "
    "restoring in full (Kafka Streams' num.standby.replicas). Costs that executor the disk and the "
    "replay of the instance's changes.",
    minimum=0,
    maximum=1,
)

SPARK_STANDBY_REFRESH_INTERVAL: ConfigOption[float] = ConfigOption(
    "dstl.spark.standby-refresh-interval",
    OptionType.DURATION,
    10.0,
    "How often a standby copy (dstl.spark.standby-replicas) or a warm-up copy (balancing onto an idle "
    "executor) catches up on its instance's changes: shorter leaves less to catch up on when the instance "
    "moves there, and balances sooner; longer costs its executor less (changes to the same key in between "
    "are replayed once).",
    minimum=0,
)

SPARK_DROPPED_STATES: ConfigOption[str | None] = ConfigOption(
    "dstl.spark.dropped-states",
    OptionType.STRING,
    None,
    "Comma-separated states a PySpark processor no longer declares and whose data a restart may leave "
    "behind. Without it, a restart whose processor drops a state and declares a new one of the same kind "
    "is refused (a rename would silently start empty).",
)

SPARK_FINISH_IN_TASK_GAP: ConfigOption[float] = ConfigOption(
    "dstl.spark.finish-in-task-gap",
    OptionType.DURATION,
    40.0,
    "When the last batch's tasks ended at least this long before a batch (or the query's "
    "processing-time trigger is at least this long), that batch's tasks finish their background work "
    "before they end, waiting for it: a snapshot, and the refresh of the standby copies their executor "
    "keeps. Spark stops an executor's idle Python workers once none of its tasks ended for a minute, "
    "and background work ends with them, so with batches that far apart a long snapshot would never "
    "complete and the log would keep growing. 0: always.",
    minimum=0,
)

SPARK_OPTIONS = (
    SPARK_PARALLELISM,
    SPARK_WORKING_DIR,
    SPARK_PLACEMENT,
    SPARK_STANDBY_REPLICAS,
    SPARK_STANDBY_REFRESH_INTERVAL,
    SPARK_FINISH_IN_TASK_GAP,
    SPARK_DROPPED_STATES,
)
