"""Stable placement: which operator instance owns which key groups, and the Spark columns routing rows.

Instance ``i`` of ``parallelism`` owns the contiguous key groups
:func:`~dstl.backend.keygroups.key_group_range_for_instance` gives; a row's
instance is ``key_group * parallelism div max_parallelism`` (Flink's formula),
computed in Spark SQL from the same ``xxhash64`` as the Python backend.
"""

from __future__ import annotations

from collections.abc import Mapping

from dstl.spi import KeyGroupRange

from ..changelog import BackendSnapshot
from ..keygroups import instance_name, key_group_range_for_instance, parse_instance_name, spark_key_group_expr

__all__ = [
    "instance_for_key_group",
    "instance_name",
    "next_timer_for_range",
    "parse_instance_name",
    "routing_exprs",
    "snapshot_for_range",
]


def instance_for_key_group(key_group: int, parallelism: int, max_parallelism: int) -> int:
    """The operator instance that owns ``key_group``."""
    return key_group * parallelism // max_parallelism


def routing_exprs(key_columns: list[str], parallelism: int, max_parallelism: int) -> tuple[str, str]:
    """Spark SQL expressions of a row's key group and of its operator instance."""
    key_group = spark_key_group_expr(key_columns, max_parallelism)
    return key_group, f"cast(div({key_group} * {parallelism}, {max_parallelism}) as int)"


def instance_ranges(parallelism: int, max_parallelism: int) -> list[KeyGroupRange]:
    """The key groups of every instance."""
    return [key_group_range_for_instance(i, parallelism, max_parallelism) for i in range(parallelism)]


def snapshot_for_range(
    snapshots: Mapping[str, BackendSnapshot], key_groups: KeyGroupRange
) -> BackendSnapshot | None:
    """What instance ``key_groups`` continues from.

    Its own snapshot, or after rescaling every snapshot that overlaps it, as parts:
    each is restored for the key groups its instance owned only (a snapshot of a
    rescaled instance carries history of key groups it never owned).
    """
    same = snapshots.get(instance_name(key_groups))
    if same is not None:
        return same
    owners = [(parse_instance_name(name), snapshot) for name, snapshot in sorted(snapshots.items())]
    parts = tuple((owned, snapshot) for owned, snapshot in owners if _overlaps(owned, key_groups))
    if not parts:
        return None
    return BackendSnapshot(max(s.checkpoint_id for _, s in parts), (), (), (), parts)


def _overlaps(a: KeyGroupRange, b: KeyGroupRange) -> bool:
    return a.start < b.end and b.start < a.end


def next_timer_for_range(next_timers: Mapping[str, int], key_groups: KeyGroupRange) -> int | None:
    """The earliest timer instance ``key_groups`` holds: its own, or after rescaling its overlaps'.

    After a rescale an overlapping instance's earliest timer may belong to key
    groups another instance took: the instance then runs once early and reports
    its own.
    """
    same = next_timers.get(instance_name(key_groups))
    if same is not None:
        return same
    found = [
        expiry for name, expiry in next_timers.items() if _overlaps(parse_instance_name(name), key_groups)
    ]
    return min(found, default=None)
