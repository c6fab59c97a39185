"""An instance's rows grouped once for its processor: the batch, its keys bound, the step timed."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..batch import KeyedBatch
from .instance_rows import ArrowRows

if TYPE_CHECKING:
    import pandas as pd

    from ..processor import StateContext

__all__ = ["keyed_batch"]


def keyed_batch(rows: pd.DataFrame | ArrowRows, context: StateContext) -> KeyedBatch:
    """``rows`` grouped by the context's key columns, their keys bound for bulk state access.

    The keys are bound with their key groups as Spark's routing computed them, when
    the rows came with them, and counted as touched; the time taken is the
    ``group`` phase; any later conversion of Arrow rows to pandas is ``to_pandas``.
    """
    began = time.perf_counter()
    routed = context.routed_key_groups
    if routed is not None and len(routed) != len(rows):
        routed = None
    batch = KeyedBatch.of(rows, context.key_columns, key_groups=routed)
    batch.decode_phases = context.phases_ms
    if routed is not None and batch.first_rows is not None:
        groups = routed[batch.first_rows].tolist()
        batch.key_set = context.key_set(batch.keys, key_groups=groups, distinct=True)  # grouped: distinct
    else:
        batch.key_set = context.key_set(batch.keys, distinct=True)
    context.keys_touched.add_distinct(batch.keys)
    context.phases_ms["group"] = round((time.perf_counter() - began) * 1000, 3)
    return batch
