"""The demo pipeline: generated events → per-user state → a Parquet sink; and its batch recomputation.

Input is a directory of JSON-lines files, file ``i`` holding event ids
``[i * rows, (i + 1) * rows)``; everything else about an event derives from its
id, so the input is the same on every run and a batch job over the same files
recomputes exactly what the stream must end with.

Per user the processor keeps a running total (ValueState), an event count
(ReducingState), the five latest event ids (ListState), counts per page
(MapState) and counts per 10 s sliding window with a 5 s slide (MapState;
windows ending 30 s before the user's latest event are purged).
"""

from __future__ import annotations

import json
import operator
import os
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..processor import StateContext, StatefulProcessor
from ..query import StatefulQuery, transform_with_state

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

    from ..batch import KeyedBatch

__all__ = ["DemoProcessor", "expected_state", "start_pipeline", "write_input_file"]

USERS = 500
PAGES = 17
EVENTS_PER_SECOND = 40  # of event time
WINDOW, SLIDE, RETENTION = 10, 5, 30
RECENT = 5
_FIRST_FILE_TIME = 1_750_000_000  # modification time of input file 0 (file i: + i seconds)
OUTPUT_SCHEMA = (
    "user string, total long, events long, recent string, pages string, windows string, last_event long"
)
# The same columns in Spark SQL (stream and batch recomputation) and in Python (tests, docs).
EVENT_COLUMNS = {
    "user": f"concat('u', cast(pmod(id * 7919, {USERS}) as string))",
    "page": f"concat('p', cast(pmod(id * 31, {PAGES}) as string))",
    "amount": "pmod(id * 13, 100) + 1",
    "event_time": f"div(id, {EVENTS_PER_SECOND})",
}


def write_input_file(directory: Path, index: int, rows: int) -> Path:
    """Write input file ``index`` atomically (Spark ignores names starting with a dot)."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"events-{index:06d}.json"
    temporary = directory / f".events-{index:06d}.tmp"
    temporary.write_text(
        "".join(json.dumps({"id": i}) + "\n" for i in range(index * rows, (index + 1) * rows))
    )
    # Spark's file source takes files oldest first: one second apart, the order is the index order.
    os.utime(temporary, (_FIRST_FILE_TIME + index, _FIRST_FILE_TIME + index))
    os.replace(temporary, final)
    return final


def events(frame: DataFrame) -> DataFrame:
    """Derive the event columns from ``id``."""
    from pyspark.sql import functions as F  # noqa: N812

    return frame.select("id", *(F.expr(sql).alias(name) for name, sql in EVENT_COLUMNS.items()))


def _windows_of(event_time: int) -> list[int]:
    first = event_time - event_time % SLIDE
    return [start for start in range(first - WINDOW + SLIDE, first + 1, SLIDE) if start >= 0]


class DemoProcessor(StatefulProcessor):
    """Running totals, counts, recent events, per-page and sliding-window counts per user."""

    def init(self, context: StateContext) -> None:
        """Register the five states."""
        self.total = context.get_value_state("total")
        self.events = context.get_reducing_state("events", operator.add)
        self.recent = context.get_list_state("recent")
        self.pages = context.get_map_state("pages")
        self.windows = context.get_map_state("windows")
        self.last_event = context.get_value_state("last_event")

    def handle_input_rows(self, key: Any, rows: pd.DataFrame) -> Iterable[dict]:  # noqa: ANN401
        """Fold the user's events of this batch into the state; emit the user's figures (per-key API)."""
        total = (self.total.value() or 0) + int(rows["amount"].sum())
        self.total.update(total)
        self.events.add(len(rows))
        latest = max(self.last_event.value() or 0, int(rows["event_time"].max()))
        self.last_event.update(latest)
        yield {
            "user": key,
            "total": total,
            "events": self.events.get(),
            "last_event": latest,
            **self._collections(rows, latest),
        }

    def handle_batch(self, batch: KeyedBatch, context: StateContext) -> dict[str, list[Any]]:
        """The batch API: value and reducing state in bulk, the collections key by key."""
        import numpy as np

        keys, starts = batch.key_set, batch.offsets[:-1]
        amounts = np.add.reduceat(batch.column("amount"), starts).tolist()
        newest = np.maximum.reduceat(batch.column("event_time"), starts).tolist()
        totals = [(t or 0) + int(a) for t, a in zip(self.total.get_many(keys), amounts, strict=True)]
        self.total.update_many(keys, totals)
        self.events.add_many(keys, batch.counts().tolist())
        latest = [max(e or 0, int(n)) for e, n in zip(self.last_event.get_many(keys), newest, strict=True)]
        self.last_event.update_many(keys, latest)
        output: dict[str, list[Any]] = {
            "user": list(batch.keys),
            "total": totals,
            "events": self.events.get_many(keys),
            "last_event": latest,
            "recent": [],
            "pages": [],
            "windows": [],
        }
        for (key, rows), last in zip(batch.per_key(), latest, strict=True):
            context.set_current_key(key)
            for name, value in self._collections(rows, last).items():
                output[name].append(value)
        return output

    def _collections(self, rows: pd.DataFrame, latest: int) -> dict[str, str]:
        """The current key's list and maps: recent events, pages, sliding windows (purged by age)."""
        self.recent.update(sorted({*self.recent.get(), *(int(i) for i in rows["id"])})[-RECENT:])
        for page, count in rows["page"].value_counts().items():
            self.pages.put(page, (self.pages.get(page) or 0) + int(count))
        for event_time in rows["event_time"]:
            for start in _windows_of(int(event_time)):
                self.windows.put(start, (self.windows.get(start) or 0) + 1)
        for start, _ in list(self.windows.items()):
            if start + WINDOW <= latest - RETENTION:
                self.windows.remove(start)
        return {
            "recent": ",".join(map(str, self.recent.get())),
            "pages": json.dumps(dict(sorted(self.pages.items()))),
            "windows": json.dumps({str(k): v for k, v in sorted(self.windows.items())}),
        }


def start_pipeline(
    spark: SparkSession,
    workdir: Path,
    config: dict[str, Any],
    *,
    files_per_batch: int = 1,
    trigger: dict[str, Any] | None = None,
    processor: Any = None,  # noqa: ANN401 - a StatefulProcessor factory (tests inject failures)
) -> StatefulQuery:
    """Start the streaming query over ``workdir/input`` writing to ``workdir/output``."""
    source = (
        spark.readStream.schema("id long")
        .option("maxFilesPerTrigger", files_per_batch)
        .json(str(workdir / "input"))
    )
    return transform_with_state(
        events(source),
        key_columns=["user"],
        processor=processor or DemoProcessor,
        output_schema=OUTPUT_SCHEMA,
        sink=str(workdir / "output"),
        checkpoint_location=str(workdir / "checkpoint"),
        config=config,
        job_id="demo",
        operator_id="users",
        trigger=trigger,
    )


def expected_state(spark: SparkSession, input_dir: Path) -> dict[str, dict[str, Any]]:
    """The per-user figures recomputed by a batch job over every input file."""
    from pyspark.sql import functions as F  # noqa: N812

    frame = events(spark.read.schema("id long").json(str(input_dir)))
    totals = frame.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
    expected: dict[str, dict[str, Any]] = {
        row["user"]: {"total": row["total"], "events": row["events"]} for row in totals.collect()
    }
    pages: dict[str, dict[str, int]] = defaultdict(dict)
    for row in frame.groupBy("user", "page").count().collect():
        pages[row["user"]][row["page"]] = row["count"]
    rows = frame.select("user", "id", "event_time").toPandas().sort_values("id")
    for user, group in rows.groupby("user"):
        latest = int(group["event_time"].max())
        windows: dict[int, int] = defaultdict(int)
        for event_time in group["event_time"]:
            for start in _windows_of(int(event_time)):
                if start + WINDOW > latest - RETENTION:
                    windows[start] += 1
        expected[user].update(
            recent=",".join(str(int(i)) for i in group["id"].tolist()[-RECENT:]),
            pages=json.dumps(dict(sorted(pages[user].items()))),
            windows=json.dumps({str(k): v for k, v in sorted(windows.items())}),
            last_event=latest,
        )
    return expected


def final_state(output_dir: Path) -> dict[str, dict[str, Any]]:
    """Each user's figures from the latest batch that emitted them (what the sink ends with)."""
    import pyarrow.dataset as ds

    table = ds.dataset(str(output_dir), format="parquet", partitioning="hive").to_table().to_pandas()
    table = table.sort_values("batch_id").drop_duplicates("user", keep="last")
    columns = ["total", "events", "recent", "pages", "windows", "last_event"]
    return {
        row["user"]: {c: (int(row[c]) if c in ("total", "events", "last_event") else row[c]) for c in columns}
        for row in table.to_dict("records")
    }
