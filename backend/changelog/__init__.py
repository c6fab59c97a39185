"""The changelog layer: apply every mutation to the delegate and log it to the DSTL.

- :mod:`.backend`: the backend (the states' :class:`~..keyed.KeyedContext`);
- :mod:`.snapshot` and :mod:`.lineage`: the checkpoint document and how checkpoints follow each other;
- :mod:`.writes`, :mod:`.registry`, :mod:`.restore`, :mod:`.expiry`: its write path,
  state registry, loading and TTL cleanup;
- :mod:`.materializer` and :mod:`.policy`: background snapshots and when they are due.
"""

from __future__ import annotations

from .backend import ChangelogKeyedStateBackend
from .lineage import catch_up_delta, rebase
from .policy import MaterializationPolicy
from .settings import BackendSettings
from .snapshot import BackendSnapshot

__all__ = [
    "BackendSettings",
    "BackendSnapshot",
    "ChangelogKeyedStateBackend",
    "MaterializationPolicy",
    "catch_up_delta",
    "rebase",
]
