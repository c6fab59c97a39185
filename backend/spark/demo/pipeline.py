"""The demo pipeline: generated events → per-user state → a Parquet sink; and its batch recomputation.

Input is a directory of JSON-lines files, file ``i`` holding event ids
``[i * rows, (i + 1) * rows)``; everything else about an event derives from its
id, so the input is the same on every run and a batch job over the same files
recomputes exactly what the stream must end with.

Per user the processor keeps a running total (ValueState), an event count
(ReducingState), the five latest event ids (ListState) and counts per page
(MapState), and emits the user's figures. Driven by event-time timers (the
watermark trails the largest event time by 30 s), it also counts 10 s sliding
windows with a 5 s slide (MapState), each emitted once and dropped when the
watermark passes its end, and sessions of the user's visits to the first six
pages, which end after a gap of more than 30 s (by the next visit, or by a gap
timer once the watermark passes).
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

__all__ = [
    "DemoProcessor",
    "compare_with_recomputation",
    "expected_state",
    "final_state",
    "start_pipeline",
    "write_input_file",
]

USERS = 500
PAGES = 17
EVENTS_PER_SECOND = 40  # of event time
WINDOW, SLIDE = 10, 5  # seconds of event time
WATERMARK_DELAY = 30  # seconds the watermark trails the largest event time seen
SESSION_GAP = 30  # seconds without a visit after which a session ends
SESSION_PAGES = 6  # visits to pages p0..p5 make sessions
RECENT = 5
_FIRST_FILE_TIME = 1_750_000_000  # modification time of input file 0 (file i: + i seconds)
#: ``kind`` is ``user`` (the user's figures), ``window`` or ``session`` (start, end, count);
#: every row carries the watermark of its batch.
OUTPUT_SCHEMA = (
    "kind string, user string, total long, events long, recent string, pages string, last_event long, "
    "start long, end long, count long, watermark long"
)
# The same columns in Spark SQL (stream and batch recomputation) and in Python (tests, docs).
#: the first event's time (epoch s): after Spark's initial watermark 0, so no event is late at the start
FIRST_EVENT_S = 1_700_000_000
EVENT_COLUMNS = {
    "user": f"concat('u', cast(pmod(id * 7919, {USERS}) as string))",
    "page": f"concat('p', cast(pmod(id * 31, {PAGES}) as string))",
    "amount": "pmod(id * 13, 100) + 1",
    "event_time": f"{FIRST_EVENT_S} + div(id, {EVENTS_PER_SECOND})",
    "event_ms": f"({FIRST_EVENT_S} + div(id, {EVENTS_PER_SECOND})) * 1000",
}
_FIGURES = ("total", "events", "recent", "pages", "last_event")
_EMPTY_ROW = dict.fromkeys(column.split()[0] for column in OUTPUT_SCHEMA.split(","))


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
    from pyspark.sql import functions as F

    return frame.select("id", *(F.expr(sql).alias(name) for name, sql in EVENT_COLUMNS.items()))


def _windows_of(event_time: int) -> list[int]:
    first = event_time - event_time % SLIDE
    return [start for start in range(first - WINDOW + SLIDE, first + 1, SLIDE) if start >= 0]


def _passed(expiry_ms: int, watermark_ms: int | None) -> bool:
    """Whether a timer at ``expiry_ms`` fired by ``watermark_ms`` (none before there is a watermark)."""
    return watermark_ms is not None and expiry_ms <= watermark_ms


def _in_session(page: str) -> bool:
    return int(page[1:]) < SESSION_PAGES


def _session_timer(last_event: int) -> int:
    """The gap timer of a session whose latest visit was at ``last_event`` (s): just past the gap."""
    return (last_event + SESSION_GAP) * 1000 + 1


class DemoProcessor(StatefulProcessor):
    """Per-user figures; sliding windows and sessions closed by event-time timers."""

    def init(self, context: StateContext) -> None:
        """Register the states."""
        self.context = context
        self.total = context.get_value_state("total")
        self.events = context.get_reducing_state("events", operator.add)
        self.recent = context.get_list_state("recent")
        self.pages = context.get_map_state("pages")
        self.windows = context.get_map_state("windows")
        self.session = context.get_value_state("session")  # [start, latest visit, visits]
        self.last_event = context.get_value_state("last_event")

    def handle_input_rows(self, key: Any, rows: pd.DataFrame) -> Iterable[dict]:
        """Fold the user's events of this batch into the state; emit the user's figures (per-key API)."""
        total = (self.total.value() or 0) + int(rows["amount"].sum())
        self.total.update(total)
        self.events.add(len(rows))
        latest = max(self.last_event.value() or 0, int(rows["event_time"].max()))
        self.last_event.update(latest)
        figures, closed = self._collections(key, rows)
        yield self._row("user", key, total=total, events=self.events.get(), last_event=latest, **figures)
        yield from closed

    def handle_batch(self, batch: KeyedBatch, context: StateContext) -> dict[str, list[Any]]:
        """The batch API: value and reducing state in bulk, the collections key by key."""
        import numpy as np

        keys = batch.key_set if batch.key_set is not None else batch.keys  # bound keys: no re-hashing
        starts = batch.offsets[:-1]
        amounts = np.add.reduceat(batch.column("amount"), starts).tolist()
        newest = np.maximum.reduceat(batch.column("event_time"), starts).tolist()
        totals = [(t or 0) + int(a) for t, a in zip(self.total.get_many(keys), amounts, strict=True)]
        self.total.update_many(keys, totals)
        self.events.add_many(keys, batch.counts().tolist())
        latest = [max(e or 0, int(n)) for e, n in zip(self.last_event.get_many(keys), newest, strict=True)]
        self.last_event.update_many(keys, latest)
        count = len(batch.keys)
        output: dict[str, list[Any]] = {
            "kind": ["user"] * count,
            "user": list(batch.keys),
            "total": totals,
            "events": self.events.get_many(keys),
            "last_event": latest,
            "recent": [],
            "pages": [],
            **{name: [None] * count for name in ("start", "end", "count")},
            "watermark": [context.watermark_ms()] * count,
        }
        closed: list[dict[str, Any]] = []
        for key, rows in batch.per_key():
            context.set_current_key(key)
            figures, ended = self._collections(key, rows)
            for name, value in figures.items():
                output[name].append(value)
            closed.extend(ended)
        for row in closed:
            for name, column in output.items():
                column.append(row.get(name))
        return output

    def handle_expired_timer(self, key: Any, expiry_ms: int, context: StateContext) -> list[dict]:
        """A window's end or a session's gap passed the watermark: emit it, once, and drop it."""
        closed = []
        start = expiry_ms // 1000 - WINDOW
        if expiry_ms % 1000 == 0 and self.windows.contains(start):
            closed.append(
                self._row("window", key, start=start, end=start + WINDOW, count=self.windows.get(start))
            )
            self.windows.remove(start)
        session = self.session.value()
        if session is not None and _session_timer(session[1]) == expiry_ms:
            closed.append(self._session_row(key, session))
            self.session.clear()
        return closed

    def _row(self, kind: str, key: Any, **values: Any) -> dict[str, Any]:
        return {**_EMPTY_ROW, "kind": kind, "user": key, "watermark": self.context.watermark_ms(), **values}

    def _session_row(self, key: Any, session: list[int]) -> dict[str, Any]:
        return self._row("session", key, start=session[0], end=session[1], count=session[2])

    def _collections(self, key: Any, rows: pd.DataFrame) -> tuple[dict[str, str], list[dict[str, Any]]]:
        """The current key's list, maps and timers; returns its figures and the sessions that ended."""
        self.recent.update(sorted({*self.recent.get(), *(int(i) for i in rows["id"])})[-RECENT:])
        for page, count in rows["page"].value_counts().items():
            self.pages.put(page, (self.pages.get(page) or 0) + int(count))
        context = self.context
        for event_time in rows["event_time"]:
            for start in _windows_of(int(event_time)):
                if not self.windows.contains(start):
                    context.register_timer((start + WINDOW) * 1000)
                self.windows.put(start, (self.windows.get(start) or 0) + 1)
        ended = []
        session = self.session.value()
        visits = sorted(
            int(t) for t, page in zip(rows["event_time"], rows["page"], strict=True) if _in_session(page)
        )
        for visit in visits:
            if session is not None and visit - session[1] <= SESSION_GAP:
                context.delete_timer(_session_timer(session[1]))
                session = [session[0], visit, session[2] + 1]
            else:
                if session is not None:  # the gap ended it before its timer fired
                    context.delete_timer(_session_timer(session[1]))
                    ended.append(self._session_row(key, session))
                session = [visit, visit, 1]
            context.register_timer(_session_timer(session[1]))
        if visits:
            self.session.update(session)
        return {
            "recent": ",".join(map(str, self.recent.get())),
            "pages": json.dumps(dict(sorted(self.pages.items()))),
        }, ended


def start_pipeline(
    spark: SparkSession,
    workdir: Path,
    config: dict[str, Any],
    *,
    files_per_batch: int = 1,
    trigger: dict[str, Any] | None = None,
    processor: Any = None,
    job_id: str | None = "demo",
) -> StatefulQuery:
    """Start the streaming query over ``workdir/input`` writing to ``workdir/output``.

    :param job_id: ``None`` lets the job id derive from the checkpoint location.
    """
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
        job_id=job_id,
        operator_id="users",
        trigger=trigger,
        event_time_column="event_ms",
        watermark_delay=f"{WATERMARK_DELAY} seconds",
    )


def expected_state(
    spark: SparkSession, input_dir: Path, watermark_ms: int | None
) -> dict[str, dict[str, Any]]:
    """The per-user figures, closed windows and sessions, recomputed by a batch job over every input file.

    :param watermark_ms: the watermark of the stream's last batch: the windows and
        sessions whose timers it passed are closed (and so are sessions a later
        visit ended).
    """
    from pyspark.sql import functions as F

    frame = events(spark.read.schema("id long").json(str(input_dir)))
    totals = frame.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
    expected: dict[str, dict[str, Any]] = {
        row["user"]: {"total": row["total"], "events": row["events"]} for row in totals.collect()
    }
    pages: dict[str, dict[str, int]] = defaultdict(dict)
    for row in frame.groupBy("user", "page").count().collect():
        pages[row["user"]][row["page"]] = row["count"]
    rows: Any = frame.select("user", "id", "event_time", "page").toPandas()
    rows = rows.sort_values("id")
    for user, group in rows.groupby("user"):
        windows: dict[int, int] = defaultdict(int)
        for event_time in group["event_time"]:
            for start in _windows_of(int(event_time)):
                windows[start] += 1
        visits = [
            int(t) for t, page in zip(group["event_time"], group["page"], strict=True) if _in_session(page)
        ]
        sessions: list[list[int]] = []
        for visit in visits:
            if sessions and visit - sessions[-1][1] <= SESSION_GAP:
                sessions[-1][1:] = [visit, sessions[-1][2] + 1]
            else:
                sessions.append([visit, visit, 1])
        closed_sessions = sessions[:-1] + [
            s for s in sessions[-1:] if _passed(_session_timer(s[1]), watermark_ms)
        ]
        expected[user].update(
            recent=",".join(str(int(i)) for i in group["id"].tolist()[-RECENT:]),
            pages=json.dumps(dict(sorted(pages[user].items()))),
            last_event=int(group["event_time"].max()),
            windows=json.dumps(
                [[k, v] for k, v in sorted(windows.items()) if _passed((k + WINDOW) * 1000, watermark_ms)]
            ),
            sessions=json.dumps(closed_sessions),
        )
    return expected


def final_state(output_dir: Path) -> tuple[dict[str, dict[str, Any]], int | None]:
    """What the sink ends with: each user's latest figures and every closed window and session.

    Returns them and the watermark of the last batch.
    """
    import pyarrow.dataset as ds

    table = ds.dataset(str(output_dir), format="parquet", partitioning="hive").to_table().to_pandas()
    newest = table["watermark"].max()  # null until the stream saw event time
    watermark = int(newest) if newest == newest else None
    users = table[table["kind"] == "user"].sort_values("batch_id").drop_duplicates("user", keep="last")
    found: dict[str, dict[str, Any]] = {
        row["user"]: {c: (row[c] if c in ("recent", "pages") else int(row[c])) for c in _FIGURES}
        for row in users.to_dict("records")
    }
    for kind, name in (("window", "windows"), ("session", "sessions")):
        closed: dict[str, list[list[int]]] = defaultdict(list)
        for row in table[table["kind"] == kind].sort_values("start").to_dict("records"):
            closed[row["user"]].append([int(row["start"]), int(row["end"]), int(row["count"])])
        for user, figures in found.items():
            items = closed.get(user, [])
            # lists, not maps: a window or session emitted twice shows
            figures[name] = json.dumps(
                [[start, count] for start, _, count in items] if kind == "window" else items
            )
    return found, watermark


def compare_with_recomputation(spark: SparkSession, workdir: Path) -> dict[str, Any]:
    """The sink's output (``workdir/output``) against the batch recomputation of ``workdir/input``."""
    actual, watermark = final_state(workdir / "output")
    expected = expected_state(spark, workdir / "input", watermark)
    wrong = sorted(u for u in expected if actual.get(u) != expected[u])
    return {
        "users": len(expected),
        "events": sum(v["events"] for v in expected.values()),
        "windows": sum(len(json.loads(v["windows"])) for v in expected.values()),
        "sessions": sum(len(json.loads(v["sessions"])) for v in expected.values()),
        "watermark_ms": watermark,
        "wrong": [{"user": u, "expected": expected[u], "actual": actual.get(u)} for u in wrong[:5]],
        "wrong_count": len(wrong),
        "unexpected": sorted(set(actual) - set(expected))[:5],
    }
