"""A ``local-cluster`` application's executors: which are live, and the processes to kill to lose one."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

__all__ = ["executor_processes", "kill_all", "remove_executor_dirs", "two_executors"]


def executor_processes(app_id: str, executor_id: str) -> list[int]:
    """The executor's JVM and every process below it (its Python workers), from ``/proc``."""
    parents: dict[int, int] = {}
    jvm = None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        words = [a.decode(errors="replace") for a in args]
        executor = "org.apache.spark.executor.CoarseGrainedExecutorBackend" in words and app_id in words
        if executor and words[words.index("--executor-id") + 1] == executor_id:
            jvm = int(entry.name)
    if jvm is None:
        return []
    family, grew = {jvm}, True
    while grew:
        below = {pid for pid, parent in parents.items() if parent in family} - family
        grew = bool(below)
        family |= below
    return sorted(family)


def kill_all(pids: list[int]) -> None:
    """SIGKILL each process (one that exited meanwhile, a Python worker Spark retired, is skipped)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def two_executors(sc: Any, timeout: float = 120) -> list[str]:
    """The ids of the application's two live executors, in order (waits for a replacement to register)."""
    from dstl.backend.spark._private.affinity import live_executors

    deadline = time.monotonic() + timeout
    while len(executors := live_executors(sc)) < 2:
        if time.monotonic() > deadline:
            msg = f"two executors did not register within {timeout} s: {executors}"
            raise RuntimeError(msg)
        time.sleep(0.5)
    return sorted((executor for executor, _ in executors), key=int)


def remove_executor_dirs(app_id: str | None) -> None:
    """Remove a stopped ``local-cluster`` application's executor directories (``SPARK_HOME/work/<app>``).

    Executors run there, so their working copies (GBs of LMDB at bench sizes) would stay in the
    installed pyspark otherwise, run after run. Nothing for other masters.
    """
    if not app_id:
        return
    import shutil

    import pyspark

    shutil.rmtree(Path(pyspark.__file__).parent / "work" / app_id, ignore_errors=True)
