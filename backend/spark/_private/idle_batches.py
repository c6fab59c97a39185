"""Batches on an idle stream, so that due timers fire and a moved watermark takes effect.

Spark runs a no-data batch for a stateful operator whose timers may be due
(processing time: every trigger) or whose watermark moved (event time). The
``foreachBatch`` plan dstl runs in has no stateful operator, so Spark would call
it only when rows arrive: a session that ends with the last event would never
close. A heartbeat source (Spark's ``rate`` source, one row a second) joins the
stream, so a batch runs at least every second (or every trigger interval, if
longer); the runner drops its rows before routing, and a batch in which no
instance ran writes nothing to the sink.

The heartbeat changes the query's sources, which Spark's checkpoint records: a
location keeps, for good, whether it was started with one (``query_record``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..processor import TimeMode
from .columns import HEARTBEAT_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["NO_DATA_BATCHES_CONF", "wants_idle_batches", "with_heartbeat", "without_heartbeat"]

#: Spark's switch for no-data batches, which dstl's idle batches follow.
NO_DATA_BATCHES_CONF = "spark.sql.streaming.noDataMicroBatches.enabled"
#: Triggers that end when the input does: an idle stream never happens, and Spark would
#: wrap every source (the heartbeat too) so that per-trigger limits such as
#: ``maxFilesPerTrigger`` stop applying.
_ENDING_TRIGGERS = frozenset({"availableNow", "once"})


def wants_idle_batches(mode: TimeMode, trigger: Mapping[str, Any] | None, *, no_data_batches: bool) -> bool:
    """Whether a query started now gets the heartbeat.

    When timers can fire (processing or event time), the trigger does not end with
    the input, and the session runs no-data batches (Spark's
    ``spark.sql.streaming.noDataMicroBatches.enabled``, true by default). A location
    keeps what its query was first started with (see ``query_record``).
    """
    ending = any((trigger or {}).get(name) for name in _ENDING_TRIGGERS)
    return no_data_batches and mode is not TimeMode.NONE and not ending


def with_heartbeat(frame: DataFrame) -> DataFrame:
    """``frame`` and one heartbeat row a second (non-null only in :data:`HEARTBEAT_COLUMN`)."""
    from pyspark.sql import functions as F

    beats = (
        frame.sparkSession.readStream.format("rate")
        .option("rowsPerSecond", 1)
        .option("numPartitions", 1)
        .load()
        .select(F.col("value").alias(HEARTBEAT_COLUMN))
    )
    return frame.unionByName(beats, allowMissingColumns=True)


def without_heartbeat(batch: DataFrame) -> DataFrame:
    """The stream's own rows of a batch of :func:`with_heartbeat`'s frame."""
    from pyspark.sql import functions as F

    return batch.where(F.col(HEARTBEAT_COLUMN).isNull()).drop(HEARTBEAT_COLUMN)
