"""Which instance the driver asks to snapshot in the next batch: one a batch, none starved."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ...changelog import MaterializationPolicy

__all__ = ["next_to_materialize"]


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
