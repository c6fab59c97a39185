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
    """The driver's record of whom it asked to snapshot, and when the last batch's tasks ended.

    When the last batch's tasks ended also says whether the next batch's tasks finish
    their background work before they end (:meth:`finish_in_task`).

    :ivar asked_at: per instance, when it was last asked (or when the run started).
    :ivar tasks_ended_at: when the last batch that ran instances ended (``None``: none yet
        in this run).
    :ivar trigger_interval_s: a processing-time trigger's interval (0: none): the least
        gap expected between batches.
    """

    def __init__(self, names: Sequence[str], cfg: Config, trigger_interval_s: float = 0.0) -> None:
        self.names = list(names)
        self.interval = cfg.get(CHANGELOG_MATERIALIZATION_INTERVAL)
        self.policy = MaterializationPolicy(cfg.get(CHANGELOG_MATERIALIZATION_MAX_LOG_RATIO))
        self.gap = cfg.get(SPARK_FINISH_IN_TASK_GAP)
        self.asked_at = dict.fromkeys(self.names, time.monotonic())
        self.tasks_ended_at: float | None = None
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

    def finish_in_task(self) -> bool:
        """Whether the next batch's tasks finish their background work: :func:`finishes_in_task`.

        One answer for every instance: the gap before this batch (since the last one's
        tasks ended) predicts the gap after it. Were one instance's task to wait for
        its snapshot while another's ended, the other's worker would idle through that
        wait; with one answer, tasks wait only when all do. (Counting each instance idle
        from its own task made a batch after one such wait wait again, in another task:
        a recovery batch at 16M keys waited 40 s for a snapshot it did not need to.)
        """
        # a processing-time trigger's interval is the least gap to expect: its first batches come
        # sooner (aligned to the interval), which an observed gap alone would take as the rule
        ended = self.tasks_ended_at
        expected = [time.monotonic() - ended] if ended is not None else []
        if self.trigger_interval_s:
            expected.append(self.trigger_interval_s)
        return finishes_in_task(max(expected, default=None), self.gap)

    def noticed(self, stats: Iterable[InstanceStats]) -> None:
        """The instances that ran in a completed batch: their tasks ended now; which materialized."""
        now = time.monotonic()
        stats = list(stats)
        if stats:
            self.tasks_ended_at = now
        for item in stats:
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

    Spark stops an executor's idle Python workers once none of its tasks ended for a
    minute (its worker factory's idle monitor), and work running past its task ends
    with the worker: with batches further apart than that, a long snapshot would never
    complete and the log would keep growing. How long tasks were idle before this batch
    (``idle_s``; ``None``: unknown, e.g. no batch ran in this run) predicts the gap after
    it. ``gap_s`` 0: always.
    """
    return gap_s <= 0 or (idle_s is not None and idle_s >= gap_s)
