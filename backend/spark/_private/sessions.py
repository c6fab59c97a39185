"""Classic and Spark Connect sessions: where dstl reads the conf, and what a Connect session changes.

A Connect client has no JVM gateway and no ``SparkContext``; its ``foreachBatch``
function is pickled and runs in a Python process of the Connect server, whose
DataFrames are Connect DataFrames too. dstl therefore builds its driver-side
state there (:mod:`.server_runner`) and places instances where Spark's scheduler
puts them: sticky placement pins partitions through the gateway.
"""

from __future__ import annotations

import logging
from typing import Any

from dstl.spi import Config, ConfigError

from ..options import SPARK_PLACEMENT

__all__ = ["connect_config", "is_connect", "require_classic", "session_conf", "spark_conf"]

log = logging.getLogger(__name__)

#: The conf prefixes dstl reads from a session (``spark.dstl.*``, ``spark.state.*``).
_DSTL_PREFIXES = ("spark.dstl.", "spark.state.")


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (PySpark's ``pyspark.sql.connect``)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def session_conf(spark: Any) -> dict[str, str]:
    """``spark.dstl.*``/``spark.state.*`` keys set on the session (``spark.conf.set``)."""
    try:
        everything = spark.conf.getAll
        items = everything() if callable(everything) else everything
        return {k: v for k, v in dict(items).items() if k.startswith(_DSTL_PREFIXES)}
    except Exception:
        return {}


def spark_conf(spark: Any) -> dict[str, str]:
    """The application's conf and the session's, as dstl reads its keys from them.

    A Connect session's conf holds both (the client sees no ``SparkContext``).
    """
    if is_connect(spark):
        return session_conf(spark)
    return dict(spark.sparkContext.getConf().getAll()) | session_conf(spark)


def require_classic(spark: Any, what: str) -> None:
    """Refuse a Connect session for ``what``, which runs Spark jobs of its own from the driver.

    :raises ConfigError: naming what to use instead.
    """
    if is_connect(spark):
        msg = (
            f"{what} needs a classic SparkSession (SparkSession.builder.getOrCreate()), not a Spark "
            "Connect session: run it where the driver runs, or read the location with `dstl inspect`"
        )
        raise ConfigError(msg)


def connect_config(cfg: Config, initial_state: Any) -> Config:
    """What a query on a Connect session runs with; refuse what cannot run there.

    Sticky placement falls back to Spark's (logged): it pins partitions through the
    driver's JVM gateway, which a Connect server's Python process does not have.

    :raises ConfigError: for an ``initial_state`` (a Connect DataFrame belongs to the
        client's session and cannot reach the server's ``foreachBatch`` process).
    """
    if initial_state is not None:
        msg = (
            "initial_state is not supported on a Spark Connect session yet: start the query once on a "
            "classic session with the initial state, or load it with a savepoint "
            "(state.savepoint.path), then continue on Connect"
        )
        raise ConfigError(msg)
    if cfg.get(SPARK_PLACEMENT) == "sticky":
        log.warning(
            "Spark Connect: dstl.spark.placement=sticky needs the driver's JVM gateway, which a Connect "
            "server's foreachBatch process has not; instances run where Spark's scheduler places them "
            "(dstl.spark.placement=spark), so a batch may restore an instance's state on another executor"
        )
        return cfg.with_values({SPARK_PLACEMENT.name: "spark"})
    return cfg
