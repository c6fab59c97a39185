"""How an instance's task plugs into ``applyInPandas`` (and cogroup); sticky: :mod:`.arrow_pinning`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..processor import StatefulProcessor
from .columns import INSTANCE_COLUMN, REPORT_COLUMN
from .instance_rows import PandasRows
from .protocol import TaskPlan
from .task import process_instance

__all__ = ["cogroup_function", "instance_function", "run_instance"]


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
    output, report = process_instance(plan, make_processor, PandasRows(rows), instance, initial)
    frame = pd.DataFrame(output)
    frame[REPORT_COLUMN] = pd.Series([None] * len(frame), dtype=object)
    meta = {**dict.fromkeys(plan.output_columns), REPORT_COLUMN: report.to_json()}
    meta_row = pd.DataFrame([meta], columns=[*plan.output_columns, REPORT_COLUMN])
    return pd.concat([frame, meta_row], ignore_index=True) if len(frame) else meta_row


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
