"""Delegates keep the working state the changelog layer wraps.

:class:`LmdbDelegate` is imported on first use: the heap is the default, and a
process that never uses LMDB does not load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import SECTION_ENTRIES, MappingView, StateDelegate, StateView
from .heap import HeapDelegate

if TYPE_CHECKING:
    from .lmdb_store import LmdbDelegate
    from .lmdb_view import read_copy

__all__ = [
    "SECTION_ENTRIES",
    "HeapDelegate",
    "LmdbDelegate",
    "MappingView",
    "StateDelegate",
    "StateView",
    "read_copy",
]


def __getattr__(name: str) -> Any:
    if name == "LmdbDelegate":
        from .lmdb_store import LmdbDelegate

        return LmdbDelegate
    if name == "read_copy":
        from .lmdb_view import read_copy

        return read_copy
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
