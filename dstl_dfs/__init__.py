"""DFS / object-store changelog storage (identifier ``filesystem``).

One object per upload batch holding the change sets of many writers, batching
by delay and size, pre-emptive uploads, back-pressure on bytes in flight,
retries with hedging, epoch-marker fencing with conditional puts, and reads
through a download cache. Works on any fsspec URL; s3:// goes through botocore.
"""

from __future__ import annotations

from importlib import import_module

from .options import DFS_OPTIONS

__all__ = ["DFS_OPTIONS", "DfsReader", "DfsStorage", "DfsWriter"]

#: The storage imports fsspec: `import dstl.dfs` stays light for option discovery.
_LAZY = {"DfsStorage": "._private.storage", "DfsReader": "._private.reader", "DfsWriter": "._private.writer"}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(name)
    return getattr(import_module(module, __name__), name)
