"""State time-to-live: stored values carry their write time; expired ones are never returned.

Semantics follow Flink's defaults: the timer restarts on create and write
(``OnCreateAndWrite``), expired values are invisible (``NeverReturnExpired``),
and they are dropped from storage when a full snapshot is taken (cleanup in
full snapshot). List elements and map entries expire one by one. A read that
finds an expired value, element or entry also removes it from the working state
(logged, so a restore does not bring it back) and counts it in the backend's
``numberOfExpiredEntriesRemoved``; streaming reads (``MapState.items``) only
skip them.
"""

from __future__ import annotations

from typing import Any

import msgpack

from dstl.spi import CorruptedError

__all__ = ["TTL_SUFFIX", "purge_expired", "stamp", "unstamp"]

TTL_SUFFIX = "+ttl"  # registered serializer name of a state with TTL (changes its stored form)


def stamp(payload: bytes, now: float) -> bytes:
    """``payload`` with its write time (milliseconds)."""
    return msgpack.packb([int(now * 1000), payload], use_bin_type=True)


def unstamp(raw: bytes, ttl: float, now: float) -> bytes | None:
    """The payload of a stamped value, or ``None`` once ``ttl`` seconds have passed since its write."""
    try:
        written_ms, payload = msgpack.unpackb(raw, raw=False)
        written_ms = int(written_ms)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        msg = f"a state value with TTL has no valid write time: {exc}"
        raise CorruptedError(msg, location="a state value with TTL") from exc
    if written_ms + ttl * 1000 <= now * 1000:
        return None
    return payload


def purge_expired(kind: str, entry: Any, ttl: float, now: float) -> Any | None:
    """``entry`` without its expired parts, or ``None`` when nothing is left (for full snapshots)."""
    if kind == "list":
        elements = [element for element in entry if unstamp(element, ttl, now) is not None]
        return elements or None
    if kind == "map":
        entries = {key: value for key, value in entry.items() if unstamp(value, ttl, now) is not None}
        return entries or None
    return entry if unstamp(entry, ttl, now) is not None else None
