"""Materialization: snapshots of the working state that let the log be truncated."""

from __future__ import annotations

from .format import MaterializationRef, SnapshotSections, SnapshotWriter, read_sections, write_snapshot
from .runs import Run, as_runs, checked_runs

__all__ = [
    "MaterializationRef",
    "Run",
    "SnapshotSections",
    "SnapshotWriter",
    "as_runs",
    "checked_runs",
    "read_sections",
    "write_snapshot",
]
