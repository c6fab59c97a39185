"""The changelog keyed-state backend (engine-agnostic) and ``dstl.backend.spark``.

Present so far: key → key-group hashing that matches Spark SQL's
``pmod(xxhash64(...), max_parallelism)`` exactly (:mod:`dstl.backend.keygroups`).
Keyed state, delegates, materialization, the checkpoint coordinator and the Spark
integration land with their issues.
"""

from __future__ import annotations

from .keygroups import (
    DEFAULT_MAX_PARALLELISM,
    key_group_for,
    key_group_range_for_instance,
    spark_key_group_expr,
    spark_xxhash64,
)

__all__ = [
    "DEFAULT_MAX_PARALLELISM",
    "key_group_for",
    "key_group_range_for_instance",
    "spark_key_group_expr",
    "spark_xxhash64",
]
