"""Snapshot section entries as the materializer writes and loads them: TTL purge and validation."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from dstl.spi import CorruptedError

from ..keyed import purge_expired

__all__ = ["checked_entries", "purged", "replaced_key_groups"]


def replaced_key_groups(meta: dict[str, Any], *, where: str) -> list[int]:
    """The key groups an incremental snapshot replaces whole (validated: the snapshot is untrusted)."""
    replaced = meta.get("replaced_key_groups", [])
    if not isinstance(replaced, list) or not all(type(kg) is int for kg in replaced):
        msg = f"snapshot {where}: 'replaced_key_groups' must be a list of key groups, got {replaced!r:.80}"
        raise CorruptedError(msg, location=where)
    return replaced


def purged(
    section: list[list[Any]],
    ttl_states: dict[str, tuple[str, float]],
    now: float,
    expired: Callable[[str, bytes], None],
) -> list[list[Any]]:
    """``section`` without expired state (a full snapshot is where TTL'd state is cleaned up).

    A collection's first part that expired entirely stays as a tombstone: later parts
    of it may still hold live elements, which then extend nothing stale.

    :param expired: told ``(state, key)`` of every entry that had expired parts.
    """
    kept = []
    for state, key, entry, *continued in section:
        if state in ttl_states:
            kind, ttl = ttl_states[state]
            live = purge_expired(kind, entry, ttl, now)
            if live is None or (kind in ("list", "map") and len(live) < len(entry)):
                expired(state, key)
            if live is None and (continued or kind not in ("list", "map")):
                continue
            entry = live
        kept.append([state, key, entry, *continued])
    return kept


def checked_entries(
    entries: list[Any], key_group: int, where: str
) -> Iterator[tuple[str, bytes, Any, bool]]:
    """``(state, key, entry, continued)`` of a section's entries, each checked (the snapshot is untrusted)."""
    for item in entries:
        valid = isinstance(item, list) and len(item) in (3, 4)
        if valid:
            state, key, entry, *flag = item
            continued = flag == [1]
            valid = (
                isinstance(state, str)
                and isinstance(key, bytes)
                and (not flag or continued)
                and (not continued or isinstance(entry, (list, dict)))
            )
        if not valid:
            msg = f"snapshot section of key group {key_group} holds a malformed entry: {item!r:.80}"
            raise CorruptedError(msg, location=where)
        yield state, key, entry, continued
