"""Materialization: snapshots of the working state that let the log be truncated."""

from __future__ import annotations

from .format import MaterializationRef, SnapshotSections, SnapshotWriter, read_sections, write_snapshot

__all__ = ["MaterializationRef", "SnapshotSections", "SnapshotWriter", "read_sections", "write_snapshot"]
