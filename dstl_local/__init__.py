"""Local-disk changelog storage (identifier ``local``), the embedded default.

Append-only segment files shared by the writers of a job, change sets framed
with length and CRC32C, one fsync per persist batch shared by all waiting
writers (group commit), torn tails cut on recovery, segments deleted once every
change set in them was discarded, fencing through epoch files under ``flock``.
"""

from __future__ import annotations

from ._private.reader import LocalReader
from ._private.storage import LocalStorage
from ._private.writer import LocalWriter
from .options import LOCAL_OPTIONS

__all__ = ["LOCAL_OPTIONS", "LocalReader", "LocalStorage", "LocalWriter"]
