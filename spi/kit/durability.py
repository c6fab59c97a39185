"""Small helpers for making file-system changes durable."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_directory"]


def fsync_directory(path: str | Path) -> None:
    """Make the directory entries of ``path`` durable (new, renamed or removed files in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
