"""Delegates keep the working state the changelog layer wraps."""

from __future__ import annotations

from .base import MappingView, StateDelegate, StateView
from .heap import HeapDelegate
from .lmdb_store import LmdbDelegate

__all__ = ["HeapDelegate", "LmdbDelegate", "MappingView", "StateDelegate", "StateView"]
