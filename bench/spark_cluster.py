"""The processes of a ``local-cluster`` executor: what a test or bench kills to lose it."""

from __future__ import annotations

from pathlib import Path

__all__ = ["executor_processes"]


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
