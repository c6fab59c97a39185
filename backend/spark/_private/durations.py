"""Durations as Spark writes them (``"10 seconds"``, ``"1 minute"``) or as milliseconds."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["duration_ms", "processing_interval_s"]

_UNIT_MS = {
    "ms": 1,
    "millisecond": 1,
    "s": 1000,
    "sec": 1000,
    "second": 1000,
    "m": 60_000,
    "min": 60_000,
    "minute": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
    "d": 86_400_000,
    "day": 86_400_000,
    "w": 604_800_000,
    "week": 604_800_000,
}
_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*")


def duration_ms(value: str | float) -> int:
    """``value`` in milliseconds: a number of ms, or text like ``"10 seconds"`` or ``"1 hour 30 minutes"``.

    :raises ValueError: on a negative number or text that is not such a duration.
    """
    if isinstance(value, bool):
        msg = f"a duration is milliseconds or text like '10 seconds', not {value!r}"
        raise ValueError(msg)
    if isinstance(value, int | float):
        if value < 0:
            msg = f"a duration cannot be negative, got {value!r}"
            raise ValueError(msg)
        return int(value)
    text = str(value).strip().lower().removeprefix("interval").strip()
    total, at = 0.0, 0
    for match in _PART.finditer(text):
        if match.start() != at:
            break
        amount, unit = match.groups()
        if unit not in _UNIT_MS:
            unit = unit.removesuffix("s")  # plurals
            if unit not in _UNIT_MS:
                break
        total += float(amount) * _UNIT_MS[unit]
        at = match.end()
    if not text or at != len(text):
        msg = f"{value!r} is not a duration such as '10 seconds', '500 milliseconds' or '1 hour 30 minutes'"
        raise ValueError(msg)
    return int(total)


def processing_interval_s(trigger: Mapping[str, Any] | None) -> float:
    """A processing-time trigger's interval (``DataStreamWriter.trigger``'s keywords), s; 0 for any other.

    Also 0 for text Spark may read but this does not (e.g. microseconds): Spark checks the trigger.
    """
    interval = (trigger or {}).get("processingTime")
    try:
        return duration_ms(interval) / 1000 if interval else 0.0
    except ValueError:
        return 0.0
