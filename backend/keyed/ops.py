"""The operations a keyed state performs on one key's entry (the change records' op codes)."""

from __future__ import annotations

import enum

__all__ = ["REPLACING", "Op"]


class Op(enum.IntEnum):
    """What a change record does to one key's entry."""

    VALUE_PUT = 0
    CLEAR = 1
    LIST_ADD = 2
    LIST_SET = 3
    MAP_PUT = 4
    MAP_REMOVE = 5


#: Ops whose entry ignores what came before: a later one of the same entry may replace it in the log.
REPLACING = frozenset({Op.VALUE_PUT, Op.CLEAR, Op.LIST_SET})
