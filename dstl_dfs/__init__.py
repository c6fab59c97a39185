"""DFS / object-store changelog storage (identifier ``filesystem``) through fsspec.

The options are declared here already; the storage itself lands with its issue,
and until then ``dstl.storage=filesystem`` reports an unknown storage.
"""

from __future__ import annotations

from .options import DFS_OPTIONS

__all__ = ["DFS_OPTIONS"]
