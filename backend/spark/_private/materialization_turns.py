"""Which instance the driver asks to snapshot in the next batch: one a batch, none starved."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

from dstl.spi import Config

from ...changelog import BackendSnapshot, MaterializationPolicy
from ...options import CHANGELOG_MATERIALIZATION_INTERVAL, CHANGELOG_MATERIALIZATION_MAX_LOG_RATIO
from ..options import SPARK_FINISH_IN_TASK_GAP
from .protocol import InstanceStats

__all__ = ["MaterializationTurns", "finishes_in_task", "next_to_materialize"]


class MaterializationTurns:
    """The driver's record of whom it asked to snapshot, and when each instance last ran.

    When an instance last ran also says whether its next task finishes its background
    work before it ends (:meth:`finish_in_task`).

    :ivar asked_at: per instance, when it was last asked (or when the run started).
    :ivar ran_at: per instance, when its last task ended (absent: not yet in this run).
    :ivar trigger_interval_s: a processing-time trigger's interval (0: none): the least
        gap expected between an instance's batches.
    """

    def __init__(self, names: Sequence[str], cfg: Config, trigger_interval_s: float = 0.0) -> None:
        self.names = list(names)
        self.interval = cfg.get(CHANGELOG_MATERIALIZATION_INTERVAL)
        self.policy = MaterializationPolicy(cfg.get(CHANGELOG_MATERIALIZATION_MAX_LOG_RATIO))
        self.gap = cfg.get(SPARK_FINISH_IN_TASK_GAP)
        self.asked_at = dict.fromkeys(self.names, time.monotonic())
        self.ran_at: dict[str, float] = {}
        self.trigger_interval_s = trigger_interval_s

    def due(self, previous: Mapping[str, BackendSnapshot]) -> int | None:
        """The instance (by index) to materialize in the next batch, if any: :func:`next_to_materialize`.

        ``previous``: the instances' snapshots in the batch's base checkpoint.
        """
        sizes = {
            name: (sum(h.size for h in s.all_handles), sum(m.size for m in s.all_materialized))
            for name, s in previous.items()
            if s is not None
        }
        now = time.monotonic()
        chosen = next_to_materialize(self.names, sizes, self.asked_at, now, self.interval, self.policy)
        if chosen is None:
            return None
        self.asked_at[chosen] = now  # asked: the next batch asks another first
        return self.names.index(chosen)

    def finish_in_task(self, name: str) -> bool:
        """Whether ``name``'s next task finishes its background work: :func:`finishes_in_task`."""
        last_ran = self.ran_at.get(name)
        # a processing-time trigger's interval is the least gap to expect: its first batches come
        # sooner (aligned to the interval), which an observed gap alone would take as the rule
        expected = [time.monotonic() - last_ran] if last_ran is not None else []
        if self.trigger_interval_s:
            expected.append(self.trigger_interval_s)
        return finishes_in_task(max(expected, default=None), self.gap)

    def noticed(self, stats: Iterable[InstanceStats]) -> None:
        """The instances that ran in a completed batch: when, and which materialized.

        A task that waited for its snapshot kept the batch going: the others had ended
        that much earlier (and their workers were idle meanwhile).
        """
        now = time.monotonic()
        stats = list(stats)
        waits = {item.instance: item.phases_ms.get("snapshot", 0.0) / 1000 for item in stats}
        longest = max(waits.values(), default=0.0)
        for item in stats:
            self.ran_at[item.instance] = now - (longest - waits[item.instance])
            if item.materialized:
                self.asked_at[item.instance] = now


def next_to_materialize(
    names: Sequence[str],
    sizes: Mapping[str, tuple[int, int]],
    asked_at: Mapping[str, float],
    now: float,
    interval: float,
    policy: MaterializationPolicy,
) -> str | None:
    """The instance to materialize in the next batch, or ``None``.

    First the instances whose log outgrew ``max-log-ratio`` times their snapshots,
    else any once ``interval`` passed since it was last asked; among them, the one
    asked longest ago. The caller notes each one asked (``asked_at``): one whose log
    still outgrows its snapshots (its snapshot runs for minutes) then waits its turn
    behind the others, rather than being asked every batch while the others' logs grow
    (at 16M keys the second of two instances was never asked, and its restore replayed
    all of its log).

    :param sizes: per instance, ``(log bytes, snapshot bytes)`` of its last checkpoint.
    :param asked_at: per instance, when it was last asked (an instance missing: just now).
    """
    outgrown = [name for name in names if name in sizes and policy.log_outgrew(*sizes[name])]
    chosen = min(outgrown or names, key=lambda name: asked_at.get(name, now), default=None)
    if chosen is None or (not outgrown and now - asked_at.get(chosen, now) < interval):
        return None
    return chosen


def finishes_in_task(idle_s: float | None, gap_s: float) -> bool:
    """Whether an instance's task finishes its background work (its snapshot, standby refreshes), waiting.

    Spark stops a Python worker that ran no task for a minute (its worker factory's idle
    monitor), and work running past its task ends with the worker: with batches further
    apart than that, a long snapshot would never complete and the log would keep
    growing. How long the instance was idle before this batch (``idle_s``; ``None``:
    unknown, e.g. it has not run in this run) predicts the gap after it. ``gap_s`` 0: always.
    """
    return gap_s <= 0 or (idle_s is not None and idle_s >= gap_s)
