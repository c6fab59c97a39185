"""``dstl demo``: run the pipeline on local[2] with a live table; ``--verify`` kills and restarts it.

The job runs in a child process (``python -m dstl.backend.spark.demo.run job``) that
prints one ``PROGRESS {json}`` line per batch; this process renders them. With
``--verify`` the first child is SIGKILLed mid-stream, a second one continues
from the checkpoints, and the sink's final per-user figures are compared with a
batch recomputation over the same input files: PASS or FAIL.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

__all__ = ["run_demo"]

PROGRESS = "PROGRESS "
ROWS_PER_FILE = 2000


def spark_session(app: str = "dstl-demo", conf: Mapping[str, str] | None = None) -> Any:
    """A local[2] session (tasks may be retried twice) whose Python workers run this interpreter.

    ``DSTL_SPARK_MASTER`` points it at a cluster instead (docker/compose.yaml does);
    the cluster's workers then run their own Python with dstl installed.

    :param conf: more Spark settings, e.g. ``spark.locality.wait`` (read when the context starts).
    """
    from pyspark.sql import SparkSession

    master = os.environ.get("DSTL_SPARK_MASTER", "local[2,3]")
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    if master.startswith("local"):
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        builder = (
            builder.config("spark.pyspark.python", sys.executable)
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.host", "127.0.0.1")
        )
    return builder.getOrCreate()


# -- the job (child process) -------------------------------------------------------------------------
def job_command(workdir: Path, seconds: float, config: dict[str, str]) -> tuple[list[str], Path]:
    """The child job's command line, and the file only the owner can read that holds its config.

    A secret in the config (an S3 secret key) would show in ``ps`` on a command line.
    """
    path = workdir / "job-config.json"
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        json.dump(config, file)
    module = "dstl.backend.spark.demo.run"
    command = [
        sys.executable,
        "-m",
        module,
        "job",
        "--workdir",
        str(workdir),
        "--seconds",
        str(seconds),
        "--config-file",
        str(path),
    ]
    return command, path


def _read_config(path: str | None) -> dict[str, str]:
    """The options the parent wrote (a JSON object of strings)."""
    if path is None:
        return {}
    config = json.loads(Path(path).read_text())
    if not isinstance(config, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in config.items()
    ):
        msg = f"{path}: the job config must be a JSON object of strings"
        raise SystemExit(msg)
    return config


def _job(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dstl-demo-job")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--config-file", help="JSON object of options (written 0600 by the parent)")
    args = parser.parse_args(argv)
    from .pipeline import start_pipeline, write_input_file

    workdir = Path(args.workdir)
    inputs = workdir / "input"
    next_file = len(list(inputs.glob("events-*.json"))) if inputs.exists() else 0
    if next_file == 0:
        write_input_file(inputs, 0, ROWS_PER_FILE)
        next_file = 1
    spark = spark_session()
    spark.sparkContext.setLogLevel("ERROR")
    query = start_pipeline(spark, workdir, _read_config(args.config_file))
    query.add_listener(lambda p: print(PROGRESS + p.to_json(), flush=True))
    stop = threading.Event()
    written = 0

    def generate() -> None:  # the stream's source: a new file when the query has (nearly) caught up
        nonlocal next_file, written
        while not stop.wait(0.25):
            if written - query.completed_batches < 2:
                write_input_file(inputs, next_file, ROWS_PER_FILE)
                next_file += 1
                written += 1

    generator = threading.Thread(target=generate, daemon=True)
    generator.start()
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline and query.exception() is None:
        time.sleep(0.2)
    stop.set()
    generator.join()
    if query.exception() is None:
        query.process_all_available()  # finish every file written, then stop between batches
    query.stop()
    error = query.exception()
    spark.stop()
    if error is not None:
        print(f"job failed: {error}", file=sys.stderr, flush=True)
        return 1
    return 0


# -- the front end ----------------------------------------------------------------------------------
def _size(count: float) -> str:
    """Bytes in at most five characters: ``812B``, ``12.1K``, ``118M``."""
    for unit in ("B", "K", "M", "G"):
        if count < 1000 or unit == "G":
            return f"{count:.0f}{unit}" if count >= 100 or unit == "B" else f"{count:.1f}{unit}"
        count /= 1024
    return f"{count:.0f}G"


def _table(rows: list[dict[str, Any]], title: str) -> Table:
    """The last batches, readable in an 80-column terminal (units in the caption)."""
    table = Table(
        title=title,
        caption="w/c/f: instances warm/caught up/restored in full; restore, ckpt in ms; mat: materialized",
        box=None,
        header_style="bold underline",
        padding=(0, 1),
    )
    columns = ("run", "batch", "rows", "keys", "w/c/f", "restore", "ckpt", "persist", "state", "mat")
    for column in columns:
        table.add_column(column, justify="right", no_wrap=True)
    for row in rows[-12:]:
        table.add_row(
            str(row["run"]),
            str(row["batch_id"]),
            str(row["rows"]),
            str(row["keys_touched"]),
            f"{row['warm_instances']}/{row.get('caught_up', 0)}/{row.get('full_restores', 0)}",
            f"{row['restore_ms']:.0f}",
            f"{row['checkpoint_ms']:.1f}",
            _size(row["persisted_bytes"]),
            _size(row["full_checkpoint_bytes"]),
            str(len(row["materialized"])) if row["materialized"] else "-",
        )
    return table


#: a dstl error as a Python traceback ends it, e.g. "dstl.spi.errors.ConfigError: ..."
_DSTL_ERROR = re.compile(r"^\s*dstl[.\w]*\.\w*(Error|Exception): ")


def _run_job(  # noqa: PLR0913 - one child run of the demo and where its progress goes
    workdir: Path,
    seconds: float,
    config: dict[str, str],
    run: int,
    rows: list,
    live: Live,
    title: str,
    kill_after_batches: int | None = None,
    progress_file: Path | None = None,
) -> int:
    """Run one child job, streaming its progress into the table; SIGKILL it after N batches if asked.

    :param progress_file: append each batch's progress there as one JSON object per line.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    command, config_file = job_command(workdir, seconds, config)
    log_path = workdir / f"job-{run}.log"
    with open(log_path, "w") as log_file:  # Spark's own output goes here, not over the table
        child = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=log_file, text=True, start_new_session=True
        )
    batches = 0
    assert child.stdout is not None
    for line in child.stdout:
        if not line.startswith(PROGRESS):
            continue
        rows.append({"run": run, **json.loads(line[len(PROGRESS) :])})
        if progress_file is not None:
            with open(progress_file, "a", encoding="utf-8") as sink:
                sink.write(json.dumps(rows[-1]) + "\n")
        batches += 1
        live.update(_table(rows, title))
        if kill_after_batches is not None and batches >= kill_after_batches:
            os.killpg(child.pid, signal.SIGKILL)  # the driver and its Python workers, mid-stream
            break
    code = child.wait()
    config_file.unlink(missing_ok=True)  # it may hold secrets
    if code != 0 and kill_after_batches is None:
        live.console.print(_failure_cause(log_path.read_text()), markup=False, highlight=False)
        live.console.print(f"(Spark's whole output: {log_path})", markup=False, highlight=False)
    return code


def _failure_cause(log: str) -> str:
    """The job's dstl error if it raised one (often on an executor, deep in Spark's trace), else the tail."""
    causes = [line.strip() for line in log.splitlines() if _DSTL_ERROR.search(line)]
    return causes[0] if causes else "\n".join(log.splitlines()[-15:])


def _compare(workdir: Path) -> dict[str, Any]:
    """The sink's output against the batch recomputation.

    Runs in a child process, so Spark's output stays in its log.
    """
    from .pipeline import compare_with_recomputation

    spark = spark_session("dstl-demo-verify")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        return compare_with_recomputation(spark, workdir)
    finally:
        spark.stop()


def _verify(workdir: Path, console: Console) -> bool:
    command = [sys.executable, "-m", "dstl.backend.spark.demo.run", "compare", "--workdir", str(workdir)]
    with open(workdir / "verify.log", "w") as log_file:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=log_file, text=True, check=False)
    if done.returncode != 0:
        console.print(f"[bold red]FAIL[/]: the batch recomputation failed (see {workdir / 'verify.log'})")
        return False
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["wrong_count"] or result["unexpected"]:
        for item in result["wrong"]:
            console.print(f"[red]{item['user']}[/]: expected {item['expected']}, got {item['actual']}")
        console.print(
            f"[bold red]FAIL[/]: {result['wrong_count']} of {result['users']} users differ, "
            f"unexpected users {result['unexpected']}"
        )
        return False
    console.print(
        f"[bold green]PASS[/]: {result['users']} users, {result['events']} events, {result['windows']} "
        f"closed windows, {result['sessions']} closed sessions (watermark {result['watermark_ms']} ms): "
        "totals, counts, recent events, page counts, the windows and sessions the event-time timers "
        "closed equal the batch recomputation"
    )
    return True


def run_demo(args: argparse.Namespace, console: Console) -> int:
    """Entry point of ``dstl demo`` (see module docstring)."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        console.print("[red]the demo runs on PySpark: pip install 'dstl[spark]'[/]")
        return 2
    from dstl.spi import Config
    from dstl.spi.config import parse_key_values

    config = parse_key_values(args.config)
    if args.storage:
        config["dstl.storage"] = args.storage
    config.setdefault("state.changelog.materialization.interval", "3s")
    from ..query import check_storage_for_spark

    check_storage_for_spark(Config.of(config))  # bad keys, values or storages fail before Spark starts
    keep = getattr(args, "workdir", None)
    workdir = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="dstl-demo-"))
    storage = config.get("dstl.storage", "local")
    master = os.environ.get("DSTL_SPARK_MASTER", "local[2]")
    title = f"dstl demo: PySpark {master}, storage {storage}, work dir {workdir}"
    rows: list[dict[str, Any]] = []
    progress_file = Path(args.progress) if getattr(args, "progress", None) else None
    if progress_file is not None:
        progress_file.parent.mkdir(parents=True, exist_ok=True)
        progress_file.write_text("")
    try:
        with Live(_table(rows, title), console=console, refresh_per_second=4) as live:
            if args.verify:
                half = max(args.seconds / 2, 4.0)
                _run_job(
                    workdir,
                    half * 4,
                    config,
                    1,
                    rows,
                    live,
                    title,
                    kill_after_batches=max(3, int(half)),
                    progress_file=progress_file,
                )
                console.print(
                    "[yellow]job killed with SIGKILL mid-stream; restarting from its checkpoints[/]"
                )
                code = _run_job(workdir, half, config, 2, rows, live, title, progress_file=progress_file)
            else:
                code = _run_job(
                    workdir, args.seconds, config, 1, rows, live, title, progress_file=progress_file
                )
        if code != 0:
            console.print(f"[red]the job exited with {code}[/]")
            return 1
        if not rows:
            console.print("[red]no batch completed[/]")
            return 1
        if args.verify:
            return 0 if _verify(workdir, console) else 1
        console.print(f"{len(rows)} batches; output in {workdir / 'output'}")
        return 0
    finally:
        if not keep and args.verify:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "job":
        raise SystemExit(_job(sys.argv[2:]))
    if len(sys.argv) == 4 and sys.argv[1] == "compare" and sys.argv[2] == "--workdir":
        print(json.dumps(_compare(Path(sys.argv[3]))), flush=True)
        raise SystemExit(0)
    usage = "usage: python -m dstl.backend.spark.demo.run job|compare --workdir DIR [--seconds N]"
    raise SystemExit(usage)
