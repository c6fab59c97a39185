"""Delegates keep the working state the changelog layer wraps."""

from __future__ import annotations

from .base import StateDelegate
from .heap import HeapDelegate

__all__ = ["HeapDelegate", "StateDelegate"]
