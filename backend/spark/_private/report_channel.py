"""Instance reports back to the driver inside the job that runs the instances (a Spark accumulator).

Without it, the driver runs a job of its own per batch to collect the reports
before the sink's job reads the output: two jobs where moving the rows takes one.
With it, the sink's first action runs the instances (a later action replays
the output each kept, :mod:`.kept_output`, rather than run them again) and every
task sends its partition's reports with its result. Spark
applies a task's accumulator update only when the task succeeds, once per
partition of an action; a partition a shuffle stage computed twice keeps its
latest attempt, the one whose output Spark kept.

Any partition without an update (the sink ran no job over the output) is
collected from the output afterwards, which runs what is missing.

Each task also sends its stage and, if it keeps standby copies, which of them are
warm (:mod:`.standby`): the driver finds where a task ran in Spark's status store
(:meth:`~.affinity.ExecutorHomes.observed`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ReportChannel", "ReportSender", "TaskReports", "TaskStatus", "reporting"]

#: Whether the standby copies a task's executor keeps are warm: ``((instance, warm), ...)``.
Copies = tuple[tuple[int, bool], ...]

#: One task's update: ``(batch id, partition, task attempt id, its instances' encoded reports,
#: stage id, its copies)``.
Update = tuple[int, int, int, tuple[str, ...], int, Copies]

#: What the driver learns of a batch's task besides its reports: ``(partition, task attempt id,
#: stage id, copies)``.
TaskStatus = tuple[int, int, int, Copies]


@dataclass
class TaskReports:
    """What one task reports: its instances' encoded reports, and whether its standby copies are warm."""

    instances: list[str] = field(default_factory=list)
    copies: dict[int, bool] = field(default_factory=dict)


class _Concatenating:
    """Accumulator parameter: lists of task updates, concatenated (``AccumulatorParam``'s protocol)."""

    def zero(self, value: list[Update]) -> list[Update]:
        return []

    def addInPlace(self, value1: list[Update], value2: list[Update]) -> list[Update]:
        value1.extend(value2)
        return value1


@dataclass(frozen=True)
class ReportSender:
    """What a task needs to send its reports: the accumulator and the batch (pickled with the task)."""

    accumulator: Any
    batch_id: int

    def send(self, reports: TaskReports) -> None:
        """Send this task's reports (maybe none: its partition ran no instance)."""
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:  # not in a Spark task: nothing to send to
            return
        copies = tuple(sorted(reports.copies.items()))
        update = (
            self.batch_id,
            context.partitionId(),
            context.taskAttemptId(),
            tuple(reports.instances),
            context.stageId(),
            copies,
        )
        self.accumulator.add([update])


class ReportChannel:
    """Driver side: one accumulator per query, read after each batch's sink."""

    def __init__(self, sc: Any, observe: Callable[[list[TaskStatus]], None] | None = None) -> None:
        self._accumulator = sc.accumulator([], _Concatenating())
        self._observe = observe  # told the batch's tasks: where they ran, their standby copies' warmth

    def sender(self, batch_id: int) -> ReportSender:
        """The tasks' side of batch ``batch_id`` (earlier batches' updates are dropped)."""
        self._accumulator.value = []
        return ReportSender(self._accumulator, batch_id)

    def received(self, batch_id: int, partitions: int) -> list[str] | None:
        """Batch ``batch_id``'s reports, or ``None`` unless all ``partitions`` sent theirs.

        A partition computed more than once (a shuffle stage's retry) counts by its
        latest attempt.
        """
        latest: dict[int, tuple[int, tuple[str, ...], int, Copies]] = {}
        for batch, partition, attempt, reports, stage, copies in self._accumulator.value:
            if batch == batch_id and (partition not in latest or attempt > latest[partition][0]):
                latest[partition] = (attempt, reports, stage, copies)
        if self._observe is not None:
            self._observe([(p, attempt, stage, copies) for p, (attempt, _, stage, copies) in latest.items()])
        if not set(range(partitions)) <= set(latest):  # partitions past them (standby-only) report nothing
            return None
        return [report for partition in sorted(latest) for report in latest[partition][1]]


def reporting(
    process: Callable[[Iterator[Any], TaskReports], Iterator[Any]], sender: ReportSender | None
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A ``mapInArrow`` function from ``process``, whose reports ``sender`` sends once it is done.

    :param process: yields a partition's output batches and notes in the reports it is
        given each report it yields (and its standby copies' warmth).
    """

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        reports = TaskReports()
        yield from process(batches, reports)
        if sender is not None:
            sender.send(reports)

    return run
