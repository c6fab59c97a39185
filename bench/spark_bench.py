"""Warm path on PySpark: per-batch state cost with 100k vs 1M keys of state, same keys touched per batch.

For each state size the job first loads ``keys`` keys (one batch), then runs
``--batches`` batches that each update the same number of existing keys
(``--touched``). Per batch it reports the state cost the tasks measured —
restore (0 on the warm path) plus checkpoint (persist) — and the batch's wall
time. The claim: the state cost does not grow with the state size.

    python -m bench.spark_bench                    # 100k and 1M keys, 2,000 touched, 10 batches
    python -m bench.spark_bench --quick            # 5k and 50k keys (smoke test)
    python -m bench.spark_bench --cluster          # on local-cluster[2,1,1024]: two executor JVMs,
                                                   # each with its own working copies

On the cluster the DSTL is the filesystem storage (shared, as on a real
cluster) and the working dir is relative, so each executor keeps its own
copies; full restores per batch show whether instances stayed where their
copies are.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
from pathlib import Path

from rich.console import Console

from bench.dstl_bench import _markdown, _table, percentile
from bench.spark_cluster import remove_executor_dirs
from dstl.backend.spark import StatefulProcessor, transform_with_state
from dstl.backend.spark.demo.run import spark_session

FILE_TIME = 1_750_000_000


class Counter(StatefulProcessor):
    """One ValueState per key, updated row by row in one pass over the instance's rows."""

    def init(self, context) -> None:
        """Register the counter."""
        self.count = context.get_value_state("count")

    def handle_input_rows(self, key, rows):
        """Not used (see handle_input_batch)."""
        raise NotImplementedError

    def handle_input_batch(self, rows, context):
        """Count every row of its key; emits nothing (the state cost is what is measured)."""
        for key in rows["k"].tolist():
            context.set_current_key(key)
            self.count.update((self.count.value() or 0) + 1)
        return []


def _write(directory: Path, index: int, keys: list[str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".f{index:05d}.tmp"
    temporary.write_text("".join(json.dumps({"k": k}) + "\n" for k in keys))
    os.utime(temporary, (FILE_TIME + index, FILE_TIME + index))  # processed in index order
    temporary.replace(directory / f"f{index:05d}.json")


CLUSTER = "local-cluster[2,1,1024]"


def measure(spark, keys: int, touched: int, batches: int, workdir: Path, *, cluster: bool = False) -> list:
    """Load ``keys`` keys, then ``batches`` batches touching ``touched`` of them; the progress per batch."""
    rng = random.Random(7)
    inputs = workdir / "input"
    _write(inputs, 0, [f"key-{i}" for i in range(keys)])
    for index in range(1, batches + 1):
        _write(inputs, index, [f"key-{i}" for i in rng.sample(range(keys), touched)])
    source = spark.readStream.schema("k string").option("maxFilesPerTrigger", 1).json(str(inputs))
    query = transform_with_state(
        source,
        key_columns=["k"],
        processor=Counter,
        output_schema="k string",
        sink=lambda frame, batch_id: None,
        checkpoint_location=str(workdir / "checkpoint"),
        config={
            **(
                {"dstl.storage": "filesystem", "dstl.dfs.base-path": (workdir / "dfs").as_uri()}
                if cluster
                else {"dstl.storage": "local"}
            ),
            # On the cluster: relative, i.e. in each executor's own directory (as on two hosts).
            "dstl.spark.working-dir": f"working-{workdir.name}" if cluster else str(workdir / "working"),
            "state.backend.lmdb.map-size": "4gb",
            # The warm path alone: materialization (a separate, periodic cost) stays out of the batches.
            "state.changelog.materialization.interval": "1h",
        },
        trigger={"availableNow": True},
        job_id=f"bench-{keys}",
    )
    query.await_termination()
    if query.exception() is not None:
        raise query.exception()
    return query.progress


def main(argv: list[str] | None = None) -> int:
    """Run both state sizes and print the comparison."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--touched", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cluster", action="store_true", help=f"run on {CLUSTER}")
    parser.add_argument("--results", default="bench/results")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.touched, args.batches = "5000,50000", 500, 4
    sizes = [int(s) for s in args.sizes.split(",")]
    console = Console()
    if args.cluster:
        os.environ["DSTL_SPARK_MASTER"] = CLUSTER
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    master = os.environ.get("DSTL_SPARK_MASTER", "local[2]")
    spark = spark_session("dstl-spark-bench")
    spark.sparkContext.setLogLevel("ERROR")
    rows = []
    costs = {}
    records = []
    try:
        for size in sizes:
            with tempfile.TemporaryDirectory(prefix="dstl-spark-bench-") as tmp:
                console.print(
                    f"state of {size:,} keys: loading, then {args.batches} batches of {args.touched:,}"
                )
                progress = measure(spark, size, args.touched, args.batches, Path(tmp), cluster=args.cluster)
            load, measured = progress[0], progress[1:]
            cost = [p.restore_ms + p.checkpoint_ms for p in measured]
            costs[size] = statistics.median(cost)
            batch_ms = [p.batch_ms for p in measured]
            full_restores = sum(p.full_restores for p in measured)
            records.append(
                {
                    "keys": size,
                    "load_batch_ms": load.batch_ms,
                    "state_cost_ms": cost,
                    "batch_ms": batch_ms,
                    "full_restores": [p.full_restores for p in measured],
                    "caught_up": [p.caught_up for p in measured],
                    "warm": [p.warm_instances for p in measured],
                    "instances": [p.instances for p in measured],
                }
            )
            rows.append(
                [
                    f"{size:,}",
                    f"{load.batch_ms / 1000:.1f} s",
                    f"{statistics.median(p.restore_ms for p in measured):.2f}",
                    f"{statistics.median(p.checkpoint_ms for p in measured):.2f}",
                    f"{percentile(cost, 50):.2f}",
                    f"{max(cost):.2f}",
                    f"{percentile(batch_ms, 50):.0f}",
                    f"{percentile(batch_ms, 99):.0f}",
                    f"{min(p.warm_instances for p in measured)}/{measured[0].instances}",
                    f"{full_restores / len(measured):.2f}",
                    f"{statistics.median(p.persisted_bytes for p in measured) / 1024:.1f}",
                ]
            )
    finally:
        app_id = spark.sparkContext.applicationId
        spark.stop()
        remove_executor_dirs(app_id)
    columns = [
        "state keys",
        "load batch",
        "restore ms (median)",
        "checkpoint ms (median)",
        "state cost p50 ms",
        "state cost max ms",
        "batch p50 ms",
        "batch p99 ms",
        "warm instances (min)",
        "full restores / batch",
        "persisted KB (median)",
    ]
    title = f"PySpark {master}, {args.touched:,} keys touched per batch, {args.batches} batches"
    console.print(_table(title, columns, rows))
    ratio = costs[sizes[-1]] / costs[sizes[0]]
    summary = f"state cost median at {sizes[-1]:,} keys / at {sizes[0]:,} keys: {ratio:.2f}x"
    console.print(summary)
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    stem = "spark-bench-cluster" if args.cluster else "spark-bench"
    (out / f"{stem}.md").write_text("\n".join([f"# {title}", "", *_markdown(columns, rows), "", summary, ""]))
    document = {"master": master, "touched": args.touched, "batches": args.batches, "ratio": ratio}
    (out / f"{stem}.json").write_text(json.dumps({**document, "sizes": records}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
