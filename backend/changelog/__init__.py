"""The changelog layer: apply every mutation to the delegate and log it to the DSTL."""

from __future__ import annotations

from .backend import BackendSnapshot, ChangelogKeyedStateBackend, rebase

__all__ = ["BackendSnapshot", "ChangelogKeyedStateBackend", "rebase"]
