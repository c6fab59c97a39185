"""DFS / object-store changelog storage (identifier ``filesystem``).

One object per upload batch holding the change sets of many writers, batching
by delay and size, pre-emptive uploads, back-pressure on bytes in flight,
retries with hedging, epoch-marker fencing with conditional puts, and reads
through a download cache. Works on any fsspec URL; s3:// goes through botocore.
"""

from __future__ import annotations

from .options import DFS_OPTIONS

__all__ = ["DFS_OPTIONS", "DfsStorage"]


def __getattr__(name: str) -> object:
    # The storage imports fsspec; keep `import dstl.dfs` light for option discovery.
    if name == "DfsStorage":
        from ._private.storage import DfsStorage

        return DfsStorage
    raise AttributeError(name)
