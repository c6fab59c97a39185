"""Recovery and rescale on the cluster, over a large state: how soon the instances are back.

``local-cluster[2,1,MEM]``, each executor with its own working directory (as on two
hosts), runs the running-count job of :mod:`bench.spark_stores` (batch API,
filesystem storage). It loads ``--state-keys`` keys (``--rows`` new keys a batch),
runs ``--steady`` batches of updates, then:

- ``kill``: one executor is killed (its JVM and Python workers, SIGKILL) while a
  batch runs, and ``--after`` batches follow; once per ``--standby`` setting
  (``dstl.spark.standby-replicas``). *Back* is the seconds from the kill to the end
  of the first batch in which the lost executor's instances ran again; *steady
  again*, to the end of the first batch from then on within :data:`STEADY_AGAIN_FACTOR`
  times the steady batches' median (goal 5's "back at its steady-state batch time");
- ``kill-between``: the same, the executor killed while the job idles between two
  batches; the next batch's input comes once Spark knows the executor lost (and its
  replacement registered): *back* counts from then. With ``--settle S`` the job
  first idles ``S`` seconds after its steady batches (its snapshots complete, as in a
  job up for longer than a materialization takes) and runs one more batch (its
  checkpoint moves onto them) before the kill;
- ``rescale``: the query stops and restarts with twice the instances, and runs
  ``--after`` batches; its first batch restores every new instance's key groups.

Per batch: Spark's duration, the restores (caught up, full), the slowest instance's
bring-up and bytes read.

    python -m bench.recovery_bench [--state-keys N] [--rows R] [--scenarios kill,rescale] [--json PATH]
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.spark_cluster import executor_processes, kill_all, remove_executor_dirs, two_executors
from bench.spark_stores import count_processors, dstl_phases, file_source, write_inputs
from dstl.backend.options import CHANGELOG_MATERIALIZATION_ENCODER_NICENESS

__all__ = ["main", "run_query"]


def _config(base: Path, parallelism: int, standby: int, niceness: int) -> dict[str, Any]:
    return {
        "state.changelog.materialization.encoder-niceness": niceness,
        "dstl.storage": "filesystem",
        "dstl.dfs.base-path": (base / "dfs").as_uri(),
        "dstl.spark.working-dir": "dstl-wc",  # relative: each executor's own directory
        "dstl.spark.parallelism": parallelism,
        "dstl.spark.standby-replicas": standby,
        "state.changelog.materialization.interval": "10s",
    }


def _batches(query: Any) -> list[dict[str, Any]]:
    """Per batch with rows: dstl's figures and Spark's duration and end (epoch seconds)."""
    spark_side = {}
    for progress in query.query.recentProgress:
        began = datetime.fromisoformat(progress.timestamp.replace("Z", "+00:00")).timestamp()
        spark_side[progress.batchId] = (float(progress.batchDuration), began + progress.batchDuration / 1000)
    rows = []
    for progress in query.progress:
        duration, ended = spark_side.get(progress.batch_id, (progress.batch_ms, 0.0))
        rows.append(
            {
                "batch_id": progress.batch_id,
                "rows": progress.rows,
                "batch_ms": duration,
                "ended_s": ended,
                "instances": progress.instances,
                "caught_up": progress.caught_up,
                "full_restores": progress.full_restores,
                "restore_ms": progress.restore_ms,
                "restored_bytes": progress.restored_bytes,
                "state_rows": progress.state_rows,
                "materialized": list(progress.materialized),  # instances that began a snapshot
                "rebased": list(progress.rebased),  # instances whose checkpoint moved onto one
                "phases": dstl_phases(progress),
            }
        )
    return rows


def run_query(
    spark: Any,
    inputs: Path,
    base: Path,
    config: dict[str, Any],
    *,
    kill_after: int | None = None,
    withheld: tuple[Path, ...] = (),
    settle: float = 0.0,
) -> dict[str, Any]:
    """Run the job over ``inputs``; kill an executor once ``kill_after`` batches completed.

    Without ``withheld`` files the kill hits the batch then running (the job runs back to
    back). With them the job idles once ``inputs`` are processed: the kill comes between
    batches, and the files are released once Spark knows the executor lost and its
    replacement registered. ``settle``: seconds the job idles before its last batch ahead
    of the kill (the first withheld file), so that its snapshots complete first.
    """
    from dstl.backend.spark import transform_with_state
    from dstl.backend.spark._private.affinity import live_executors

    _, batch_api = count_processors()
    query = transform_with_state(
        file_source(spark, inputs),
        key_columns=["k"],
        processor=batch_api,
        output_schema="k string, n long",
        sink=lambda frame, batch_id: frame.write.format("noop").mode("overwrite").save(),
        checkpoint_location=str(base / "checkpoint"),
        config=config,
        trigger={"processingTime": "500 milliseconds"} if withheld else {"availableNow": True},
        job_id="recovery",
    )
    killed: dict[str, Any] = {}

    def wait_for(batches: int) -> None:
        while len(query.progress) < batches and query.query.isActive:
            time.sleep(0.05)

    def kill() -> None:
        wait_for(int(kill_after or 0))
        victims = executor_processes(spark.sparkContext.applicationId, victim)
        killed["at_s"] = time.time()
        kill_all(victims)
        killed["victims"] = len(victims)

    if kill_after is not None:
        victim = two_executors(spark.sparkContext)[-1]  # an earlier kill's replacement registered
        if not withheld:
            threading.Thread(target=kill, daemon=True).start()
            query.await_termination()
        else:
            try:
                if settle:
                    wait_for(int(kill_after) - 1)
                    time.sleep(settle)
                    withheld[0].rename(inputs / withheld[0].name)
                    withheld = withheld[1:]
                kill()
                while victim in {e for e, _ in live_executors(spark.sparkContext)}:
                    time.sleep(0.2)
                two_executors(spark.sparkContext)
                killed["from_s"] = (
                    time.time()
                )  # the next batch may start: its instances are back when it ends
                for path in withheld:
                    path.rename(inputs / path.name)
                wait_for(kill_after + len(withheld))
            finally:
                query.stop()
    else:
        query.await_termination()
    if query.exception() is not None:
        raise query.exception()
    return {"batches": _batches(query), **killed}


def _withhold(inputs: Path, aside: Path, first: int) -> tuple[Path, ...]:
    """Move the input files from the ``first``-th on aside; returns where they are."""
    aside.mkdir(exist_ok=True)
    moved = []
    for path in sorted(inputs.glob("f*.json"))[first:]:
        moved.append(path.rename(aside / path.name))
    return tuple(moved)


def _summary(name: str, run: dict[str, Any], steady: slice) -> dict[str, Any]:
    batches = run["batches"]
    steady_ms = statistics.median(b["batch_ms"] for b in batches[steady])
    figures: dict[str, Any] = {
        "scenario": name,
        "steady_ms": steady_ms,
        "state_rows": batches[-1]["state_rows"],
    }
    since = run.get("from_s", run.get("at_s"))  # the kill, or (between batches) the inputs' release
    after = [b for b in batches if since is not None and b["ended_s"] > since]
    if since is not None:
        moved = next((b for b in after if b["caught_up"] + b["full_restores"]), None)
        figures["back_s"] = None if moved is None else round(moved["ended_s"] - since, 3)
        figures["recovery"] = moved
        figures["after_ms"] = [b["batch_ms"] for b in after]
        # goal 5's wording: back at the steady-state batch time (not only running again)
        again = None if moved is None else _steady_again(after[after.index(moved) :], steady_ms)
        figures["steady_again_s"] = None if again is None else round(again["ended_s"] - since, 3)
    return figures


#: A batch within this factor of the steady batches' median is back at the steady-state batch time.
STEADY_AGAIN_FACTOR = 1.25


def _steady_again(batches: list[dict[str, Any]], steady_ms: float) -> dict[str, Any] | None:
    """The first of ``batches`` (ended, in order) back at the steady-state batch time, if any."""
    return next(
        (b for b in batches if b["ended_s"] and b["batch_ms"] <= STEADY_AGAIN_FACTOR * steady_ms), None
    )


def main(argv: list[str] | None = None) -> int:
    """Run the scenarios; print a table; write the figures as JSON."""
    import argparse

    from rich.console import Console

    from bench.dstl_bench import _table
    from dstl.backend.spark.demo.run import spark_session

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--state-keys", type=int, default=1_000_000)
    parser.add_argument("--rows", type=int, default=250_000, help="rows a batch (loading: new keys)")
    parser.add_argument("--steady", type=int, default=4, help="batches of updates before the kill or rescale")
    parser.add_argument("--after", type=int, default=4, help="batches after it")
    parser.add_argument("--standby", default="0,1", help="kill runs: dstl.spark.standby-replicas settings")
    parser.add_argument("--scenarios", default="kill,kill-between,rescale")
    parser.add_argument("--memory", type=int, default=3072, help="MB per executor JVM")
    parser.add_argument(
        "--settle", type=float, default=0.0, help="kill-between: idle seconds (snapshots complete) first"
    )
    parser.add_argument(
        "--encoder-niceness",
        type=int,
        default=CHANGELOG_MATERIALIZATION_ENCODER_NICENESS.default,
        help="what the snapshot encoder process adds to the task's niceness",
    )
    parser.add_argument(
        "--locality-wait",
        default=None,
        help="spark.locality.wait (Spark's default: 3s); the README advises above a batch's task time",
    )
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    console = Console(width=160)
    os.environ["DSTL_SPARK_MASTER"] = f"local-cluster[2,1,{args.memory}]"
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    conf = {} if args.locality_wait is None else {"spark.locality.wait": args.locality_wait}
    spark = spark_session("dstl-recovery-bench", conf)
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")
    results: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="dstl-recovery-") as tmp:
            inputs = Path(tmp) / "input"
            load = write_inputs(inputs, args.steady + args.after, args.rows, state_keys=args.state_keys)
            steady = slice(load, load + args.steady)
            scenarios = args.scenarios.split(",")
            for scenario in ("kill", "kill-between"):
                for standby in [int(s) for s in args.standby.split(",")] if scenario in scenarios else []:
                    name = f"{scenario}, standby {standby}"
                    base = Path(tmp) / name.replace(", ", "-").replace(" ", "-")
                    console.print(f"{name}: {load} load batches, then updates")
                    # between batches: the input after the kill waits aside until the loss is known
                    aside = Path(tmp) / "withheld"
                    withheld = _withhold(inputs, aside, load + args.steady) if scenario != "kill" else ()
                    config = _config(base, 2, standby, args.encoder_niceness)
                    settle = args.settle if withheld else 0.0  # one more batch after it, then the kill
                    run = run_query(
                        spark,
                        inputs,
                        base,
                        config,
                        kill_after=load + args.steady + (1 if settle else 0),
                        withheld=withheld,
                        settle=settle,
                    )
                    results.append({**_summary(name, run, steady), "run": run})
            if "rescale" in scenarios:
                base = Path(tmp) / "rescale"
                withheld = _withhold(inputs, Path(tmp) / "withheld", load + args.steady)
                console.print(f"rescale 2 -> 4: {load} load batches, {args.steady} updates")
                first = run_query(spark, inputs, base, _config(base, 2, 0, args.encoder_niceness))
                for path in withheld:
                    path.rename(inputs / path.name)
                second = run_query(spark, inputs, base, _config(base, 4, 0, args.encoder_niceness))
                summary = _summary("rescale 2 -> 4", first, steady)
                summary["first_after"] = second["batches"][0]
                summary["after_ms"] = [b["batch_ms"] for b in second["batches"]]
                results.append({**summary, "run": {"before": first, "after": second}})
    finally:
        app_id = spark.sparkContext.applicationId
        spark.stop()
        remove_executor_dirs(app_id)
    rows = []
    for r in results:
        moved = r.get("recovery") or r.get("first_after") or {}
        rows.append(
            [
                r["scenario"],
                f"{r['state_rows']:,}",
                f"{r['steady_ms']:.0f}",
                "-" if r.get("back_s") is None else f"{r['back_s']:.1f}",
                "-" if r.get("steady_again_s") is None else f"{r['steady_again_s']:.1f}",
                f"{moved.get('batch_ms', 0):.0f}",
                f"{moved.get('caught_up', 0)} / {moved.get('full_restores', 0)}",
                f"{moved.get('restore_ms', 0):.0f}",
                f"{moved.get('restored_bytes', 0) / 1e6:.1f}",
                " ".join(f"{ms:.0f}" for ms in r.get("after_ms", [])),
            ]
        )
    columns = [
        "scenario",
        "state rows",
        "steady batch ms",
        "back s",
        f"steady again s (<= {STEADY_AGAIN_FACTOR}x)",
        "recovery batch ms",
        "caught up / full",
        "bring-up ms",
        "MB read",
        "batches after, ms",
    ]
    console.print(_table(f"{args.state_keys:,} keys, {args.rows:,} rows a batch", columns, rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
