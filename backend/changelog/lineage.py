"""Lineage of checkpoints: what one adds to another (catch-up) and moving one onto a newer chain (rebase)."""

from __future__ import annotations

from typing import NamedTuple

from dstl.spi import ChangelogHandle, KeyGroupRange

from ..materialization import MaterializationRef
from .materializer import ChainPosition
from .snapshot import BackendSnapshot

__all__ = ["CheckpointBase", "catch_up_delta", "checkpoint_base", "rebase"]


class CheckpointBase(NamedTuple):
    """What a checkpoint stands on: where its log starts, the chain, the handles before its log."""

    start: int
    materialized: tuple[MaterializationRef, ...]
    handles: tuple[ChangelogHandle, ...]
    bridge: tuple[MaterializationRef, ...]
    parts: tuple[tuple[KeyGroupRange, BackendSnapshot], ...]


def checkpoint_base(position: ChainPosition, restored: BackendSnapshot, log_start: int) -> CheckpointBase:
    """The base of a backend's next checkpoint, on ``position``, continuing ``restored`` from ``log_start``.

    A backend that materialized continues its own newest snapshot; before that, the
    restored (or resumed) snapshot and its log come first, then this writer's log.
    """
    if position.own is not None:
        return CheckpointBase(position.own.sqn, position.chain, (), position.bridge, ())
    if position.chain:
        return CheckpointBase(log_start, position.chain, restored.handles, position.bridge, ())
    return CheckpointBase(log_start, restored.materialized, restored.handles, restored.bridge, restored.parts)


def catch_up_delta(held: BackendSnapshot, target: BackendSnapshot) -> BackendSnapshot | None:
    """What ``target`` adds to a state that holds ``held``, or ``None`` when it is no continuation.

    A ``target`` whose chain starts with a new full snapshot continues ``held`` through
    its bridge: the previous chain plus the keys changed up to the full snapshot.
    """
    delta = _chain_delta(held, target)
    if delta is None and target.bridge:
        bridged = (*target.bridge, *target.materialized[1:])
        delta = _chain_delta(held, BackendSnapshot(target.checkpoint_id, target.handles, bridged))
    return delta


def rebase(
    current: BackendSnapshot, materialized_at: BackendSnapshot, rebased: BackendSnapshot
) -> BackendSnapshot | None:
    """``current`` moved onto a snapshot chain that completed after it was taken, or ``None``.

    ``rebased`` is checkpoint ``materialized_at`` as the new chain sees it: the chain
    plus the log from its SQN (see :meth:`ChangelogKeyedStateBackend.checkpoint_materializing`).
    ``current`` must continue ``materialized_at``: the same chain, and its handles
    first, then the ones added since, which stay.
    """
    known = len(materialized_at.handles)
    if current.materialized != materialized_at.materialized or current.parts != materialized_at.parts:
        return None  # materialized otherwise since: another lineage
    if [h.reads for h in current.handles[:known]] != [h.reads for h in materialized_at.handles]:
        return None
    return BackendSnapshot(
        current.checkpoint_id,
        (*rebased.handles, *current.handles[known:]),
        rebased.materialized,
        rebased.bridge,
        rebased.parts,
    )


def _chain_delta(held: BackendSnapshot, target: BackendSnapshot) -> BackendSnapshot | None:
    known = len(held.materialized)
    if tuple(target.materialized[:known]) != tuple(held.materialized) or held.parts != target.parts:
        return None  # a new full snapshot, or another chain
    extra = tuple(target.materialized[known:])
    # Compared by what they read: a handle carried over reports its upload as 0 bytes.
    held_handles = {handle.reads for handle in held.handles}
    target_handles = {handle.reads for handle in target.handles}
    if extra:
        logged_after = _logged_after(held, target)
        if logged_after is not None:
            return BackendSnapshot(target.checkpoint_id, logged_after, ())
        if not held.materialized:
            return None  # the first snapshot of a chain is full
        if held_handles & target_handles:
            # The snapshots were taken before some of what held applied (materialized in the
            # background, then rebased): loading them would take those keys back.
            return None
        return BackendSnapshot(target.checkpoint_id, tuple(target.handles), extra)
    if not held_handles <= target_handles:
        return None  # held is not an ancestor (e.g. a lost attempt's log)
    added = tuple(handle for handle in target.handles if handle.reads not in held_handles)
    return BackendSnapshot(target.checkpoint_id, added, ())


def _logged_after(held: BackendSnapshot, target: BackendSnapshot) -> tuple[ChangelogHandle, ...] | None:
    """``target``'s handles persisted after checkpoint ``held``, when ``held`` holds its new snapshots.

    A committed checkpoint holds every change persisted by it or before. When
    ``target``'s log starts at or before ``held`` (its new snapshots were taken by then,
    then completed in the background and rebased onto), ``held`` holds all they hold:
    only the handles persisted after it are missing, and loading the snapshots would
    take back what ``held`` applied since they were taken. ``None`` otherwise, or when
    a handle's checkpoint is unknown.
    """
    persisted = [handle.checkpoint_id for handle in target.handles if handle.checkpoint_id is not None]
    if not persisted or len(persisted) < len(target.handles) or held.checkpoint_id >= target.checkpoint_id:
        return None  # unknown, or held is no earlier checkpoint
    if persisted[0] > held.checkpoint_id:
        return None  # taken after held: the snapshots hold changes it lacks
    return tuple(h for h, at in zip(target.handles, persisted, strict=True) if at > held.checkpoint_id)
