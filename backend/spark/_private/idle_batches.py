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
location keeps, for good, whether it was started with one (``dstl-idle-batches``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dstl.spi import Config, ConfigError, DstlError

from ...documents import read_regular_file
from ...filesystems import checkpoint_fs
from ..processor import TimeMode
from .columns import HEARTBEAT_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["IDLE_BATCHES_FILE", "NO_DATA_BATCHES_CONF", "idle_batches", "with_heartbeat", "without_heartbeat"]

log = logging.getLogger(__name__)

#: Spark's switch for no-data batches, which dstl's idle batches follow.
NO_DATA_BATCHES_CONF = "spark.sql.streaming.noDataMicroBatches.enabled"
#: The location's record of whether its query has the heartbeat source (Spark ignores the file).
IDLE_BATCHES_FILE = "dstl-idle-batches"
_RECORDS = {b"on": True, b"off": False}
#: Triggers that end when the input does: an idle stream never happens, and Spark would
#: wrap every source (the heartbeat too) so that per-trigger limits such as
#: ``maxFilesPerTrigger`` stop applying.
_ENDING_TRIGGERS = frozenset({"availableNow", "once"})


def idle_batches(
    checkpoint_location: str,
    mode: TimeMode,
    trigger: Mapping[str, Any] | None,
    config: Config | Mapping[str, Any] | None = None,
    *,
    no_data_batches: bool = True,
) -> bool:
    """Whether this query gets the heartbeat: as recorded in the location, else chosen now and recorded.

    Chosen when timers can fire (processing or event time), the trigger does not end
    with the input, and the session runs no-data batches (Spark's
    ``spark.sql.streaming.noDataMicroBatches.enabled``, true by default). A location
    whose query ran without a record (a dstl before idle batches) has none, as Spark's
    recorded sources require.

    :raises ConfigError: when the record is damaged.
    """
    ending = any((trigger or {}).get(name) for name in _ENDING_TRIGGERS)
    wanted = no_data_batches and mode is not TimeMode.NONE and not ending
    fs, root = checkpoint_fs(checkpoint_location, config)
    path = f"{root}/{IDLE_BATCHES_FILE}"
    recorded = _read_record(fs, path)
    if recorded is None:
        if _spark_started(fs, root):
            recorded = False  # Spark's offset log holds the query's sources: without a heartbeat
        else:
            fs.makedirs(root, exist_ok=True)
            fs.pipe_file(path, b"on" if wanted else b"off")
            return wanted
    if recorded != wanted:
        log.warning(
            "the query at %s was started %s idle batches and keeps that (Spark's checkpoint records its "
            "sources): %s. A new checkpoint location (from a savepoint) chooses again",
            checkpoint_location,
            "with" if recorded else "without",
            "batches run at least every second, and an availableNow trigger takes all input in one batch"
            if recorded
            else "timers fire and the watermark takes effect only when rows arrive",
        )
    return recorded


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


def _spark_started(fs: Any, root: str) -> bool:
    """Whether Spark's offset log in the location has an entry (a query ran there)."""
    try:
        return any(
            not entry.rsplit("/", 1)[-1].startswith(".") for entry in fs.ls(f"{root}/offsets", detail=False)
        )
    except FileNotFoundError:
        return False


def _read_record(fs: Any, path: str) -> bool | None:
    """The recorded choice, ``None`` when there is none (the record is untrusted: checked)."""
    try:
        data = read_regular_file(fs, path, f"the idle-batches record {path}", max_bytes=16).strip()
    except FileNotFoundError:
        return None
    except (OSError, DstlError) as exc:
        data = repr(exc).encode()
    if data in _RECORDS:
        return _RECORDS[data]
    msg = (
        f"{path} is damaged ({data[:40]!r}; it records whether the query has the heartbeat source that "
        "runs batches on an idle stream): write 'on' or 'off' into it, as the query was first started "
        "(with a processing or event time mode and a trigger other than availableNow/once: on)"
    )
    raise ConfigError(msg)
