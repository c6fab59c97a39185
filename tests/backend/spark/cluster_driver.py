"""Driver of the cluster tier: one ``local-cluster[2,1,1024]`` application runs every scenario.

Spark allows one context per process, and the test session already holds a
``local[2]`` one, so the tier's driver is this child process (started once per
test module). Each executor is its own JVM with its own Python workers and its
own working directory, so a relative ``dstl.spark.working-dir`` gives each
executor its own working copies, as on two hosts. Writes one JSON document:

- ``steady``: per-batch progress of a 12-batch run (state placement after warm-up);
- ``executor_kill``: progress around the SIGKILL of one executor (its JVM and
  Python workers) mid-stream, and whether the result is exact;
- ``standby_kill``: with a standby copy of each instance on the other executor (every
  task finishing its snapshot and standby refreshes before it ends), an executor
  killed between two batches (known lost before the next), the driver's balancing
  moves after it, and exactness;
- ``rescale``: progress of a run at parallelism 2, then 3, and whether it is exact.

Usage: ``python -m tests.backend.spark.cluster_driver OUT.json WORKDIR``
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.spark_cluster import executor_processes, kill_all, two_executors

ROWS = 400
MASTER = "local-cluster[2,1,1024]"


def _config(base: Path, **extra: Any) -> dict[str, Any]:
    return {
        "dstl.storage": "filesystem",
        "dstl.dfs.base-path": (base / "dfs").as_uri(),
        "dstl.spark.working-dir": "dstl-wc",  # relative: each executor's own directory
        "state.changelog.materialization.interval": "0s",
        **extra,
    }


def _exact(spark: Any, workdir: Path) -> dict[str, Any]:
    from dstl.backend.spark.demo.pipeline import compare_with_recomputation

    result = compare_with_recomputation(spark, workdir)
    return {
        "users": result["users"],
        "wrong": [item["user"] for item in result["wrong"]],
        "unexpected": result["unexpected"],
    }


def _run_available(spark: Any, workdir: Path, config: dict[str, Any], files: int) -> list[dict]:
    from dstl.backend.spark.demo.pipeline import start_pipeline, write_input_file

    existing = len(list((workdir / "input").glob("events-*.json"))) if (workdir / "input").exists() else 0
    for index in range(existing, files):
        write_input_file(workdir / "input", index, ROWS)
    query = start_pipeline(spark, workdir, config, trigger={"availableNow": True})
    query.await_termination(timeout=600)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return [json.loads(p.to_json()) for p in query.progress]


def _executor_kill(
    spark: Any, workdir: Path, config: dict[str, Any], *, between_batches: bool = False, files: int = 9
) -> dict[str, Any]:
    """Kill an executor while batches run, or between them (after the 4th, known lost before the 5th).

    Also returns the instances the driver moved to balance its executors (its log).
    """
    from dstl.backend.spark._private.affinity import ExecutorHomes, live_executors
    from dstl.backend.spark.demo.pipeline import start_pipeline, write_input_file

    executors = two_executors(spark.sparkContext)  # an earlier kill's replacement registered
    for index in range(4 if between_batches else 3):
        write_input_file(workdir / "input", index, ROWS)
    moves: list[str] = []
    balancing = logging.getLogger("dstl.backend.spark._private.affinity")
    handler = _Recording(moves)
    balancing.addHandler(handler)
    balancing.setLevel(logging.INFO)
    query = start_pipeline(spark, workdir, config)
    try:
        if not query.wait_for_batches(4 if between_batches else 3, timeout=240):
            raise RuntimeError(f"the first batches did not complete: {query.exception()}")
        victims = executor_processes(spark.sparkContext.applicationId, executors[-1])
        if not victims:
            raise RuntimeError(f"executor {executors[-1]} was not found among the processes")
        if between_batches:
            kill_all(victims)
            deadline = time.monotonic() + 120
            while executors[-1] in {e for e, _ in live_executors(spark.sparkContext)}:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"executor {executors[-1]} was never known lost")
                time.sleep(0.5)
            two_executors(spark.sparkContext)  # and its replacement registered
            time.sleep(ExecutorHomes.EXECUTORS_TTL)  # and the driver's list of executors knows it
        for index in range(4 if between_batches else 3, files):  # batches in flight while the executor dies
            write_input_file(workdir / "input", index, ROWS)
            if index == 4 and not between_batches:
                kill_all(victims)
            time.sleep(0.3)
        query.process_all_available()
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
    finally:
        query.stop()
        balancing.removeHandler(handler)
    progress = [json.loads(p.to_json()) for p in query.progress]
    return {"victims": len(victims), "progress": progress, "moves": moves}


class _Recording(logging.Handler):
    """Keeps the messages of the driver's balancing moves."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__()
        self.messages = messages

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "(balancing)" in message:
            self.messages.append(message)


def main() -> None:
    out, base = Path(sys.argv[1]), Path(sys.argv[2])
    os.environ["DSTL_SPARK_MASTER"] = MASTER
    from dstl.backend.spark.demo.run import spark_session

    spark = spark_session("dstl-cluster-tier")
    spark.sparkContext.setLogLevel("ERROR")
    result: dict[str, Any] = {"app_id": spark.sparkContext.applicationId}
    try:
        steady_dir = base / "steady"
        result["steady"] = {"progress": _run_available(spark, steady_dir, _config(steady_dir), 12)}
        result["steady"]["exact"] = _exact(spark, steady_dir)

        kill_dir = base / "kill"
        result["executor_kill"] = _executor_kill(spark, kill_dir, _config(kill_dir))
        result["executor_kill"]["exact"] = _exact(spark, kill_dir)

        standby_dir = base / "standby-kill"
        # every task finishes its background work (snapshot, standby refreshes) as it would with
        # batches a minute apart: that path runs on executors of their own too
        standby_config = _config(
            standby_dir,
            **{
                "dstl.spark.standby-replicas": 1,
                "dstl.spark.standby-refresh-interval": "0s",
                "dstl.spark.finish-in-task-gap": "0s",
            },
        )
        result["standby_kill"] = _executor_kill(
            spark, standby_dir, standby_config, between_batches=True, files=12
        )
        result["standby_kill"]["exact"] = _exact(spark, standby_dir)

        rescale_dir = base / "rescale"
        first = _run_available(spark, rescale_dir, _config(rescale_dir, **{"dstl.spark.parallelism": 2}), 4)
        second = _run_available(spark, rescale_dir, _config(rescale_dir, **{"dstl.spark.parallelism": 3}), 8)
        result["rescale"] = {"progress": first + second, "exact": _exact(spark, rescale_dir)}
    finally:
        out.write_text(json.dumps(result))
        spark.stop()


if __name__ == "__main__":
    main()
