"""A streaming aggregation's fold, on a real backend: Spark's null rules, running across batches."""

import numpy as np
import pandas as pd

from dstl.backend.spark._private.aggregation import Aggregate, Aggregation, AggregationProcessor
from dstl.backend.spark._private.output import output_columns

AGGREGATES = (
    Aggregate("count", None, "count"),
    Aggregate("count", "s", "count(s)"),
    Aggregate("min", "s", "min(s)"),
    Aggregate("max", "s", "max(s)"),
    Aggregate("sum", "x", "sum(x)", integral=True),
    Aggregate("avg", "x", "avg(x)"),
)
NAMES = ("g", *(a.name for a in AGGREGATES))


def test_aggregates_skip_nulls_and_run_on_across_batches_in_update_mode(memory_config):
    from dstl.backend.changelog import ChangelogKeyedStateBackend
    from dstl.backend.spark import StateContext
    from dstl.spi import KeyGroupRange, load_storage

    processor = AggregationProcessor(Aggregation(("g",), AGGREGATES, None, "update"))
    # an int column with nulls reaches pandas as floats; a string column keeps None
    first = pd.DataFrame({"g": ["a", "a", "b"], "s": ["q", None, None], "x": [1.0, np.nan, np.nan]})
    second = pd.DataFrame({"g": ["b", "a", "a"], "s": ["z", "c", None], "x": [3.0, 4.0, np.nan]})
    with load_storage(memory_config, job_id="job") as storage:
        backend = ChangelogKeyedStateBackend(storage, "op", KeyGroupRange(0, 128))
        context = StateContext(backend, 0, 0, ("g",))
        processor.init(context)
        rows = output_columns(processor.handle_input_batch(first, context), NAMES)
        assert list(zip(*rows.values(), strict=True)) == [
            ("a", 2, 1, "q", "q", 1, 1.0),
            ("b", 1, 0, None, None, None, None),  # only nulls: null, as Spark's sum, min and avg
        ]
        rows = output_columns(processor.handle_input_batch(second, context), NAMES)
        assert list(zip(*rows.values(), strict=True)) == [
            ("b", 2, 1, "z", "z", 3, 3.0),
            ("a", 4, 2, "c", "q", 5, 2.5),
        ]
        backend.close()
