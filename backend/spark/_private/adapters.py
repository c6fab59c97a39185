"""How an instance's task plugs into Spark: ``applyInPandas`` (and cogroup) or sticky ``mapPartitions``."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from ..processor import StatefulProcessor
from .columns import INSTANCE_COLUMN, REPORT_COLUMN
from .protocol import TaskPlan
from .task import process_instance

__all__ = ["cogroup_function", "instance_function", "pinned_function", "run_instance"]


def run_instance(
    plan: TaskPlan,
    make_processor: Callable[[], StatefulProcessor],
    rows: Any,
    initial: Any = None,
) -> Any:
    """Process ``rows`` (one instance's rows of the batch); returns output rows + the report row."""
    import pandas as pd

    source = rows if len(rows) else initial
    instance = int(source[INSTANCE_COLUMN].iloc[0])
    output, report = process_instance(plan, make_processor, rows, instance, initial)
    frame = pd.DataFrame(output)
    frame[REPORT_COLUMN] = pd.Series([None] * len(frame), dtype=object)
    meta = {**dict.fromkeys(plan.output_columns), REPORT_COLUMN: report.to_json()}
    meta_row = pd.DataFrame([meta], columns=[*plan.output_columns, REPORT_COLUMN])
    return pd.concat([frame, meta_row], ignore_index=True) if len(frame) else meta_row


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
                output, report = process_instance(plan, make_processor, frame, instance)
                encoding = time.perf_counter()
                cleaned = [[cell(name, value) for value in output[name]] for name in outputs]
                yield from ((*row, None) for row in zip(*cleaned, strict=True))
                phases = {
                    "decode": round((decoded - began) * 1000, 3),
                    **report.stats.phases_ms,
                    "encode": round((time.perf_counter() - encoding) * 1000, 3),
                }
                report = replace(report, stats=replace(report.stats, phases_ms=phases))
                yield (*(None for _ in outputs), report.to_json())

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
