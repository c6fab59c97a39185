"""The ``filesystem`` storage's plugin (entry point ``dstl.storage: filesystem``)."""

from __future__ import annotations

from dstl.spi import KNOWN_CAPABILITIES, StorageSpec
from dstl.spi.storage_plugin import StoragePlugin

from .options import DFS_OPTIONS

plugin = StoragePlugin(
    StorageSpec(
        identifier="filesystem",
        factory="dstl.dfs._private.storage:DfsStorage",
        description="Batched, hedged uploads to any fsspec URL (file://, s3://, memory://, gs://).",
        options=DFS_OPTIONS,
        # every capability the suite knows but subsecond ages: S3 counts an object's age in seconds
        capabilities=KNOWN_CAPABILITIES - {"subsecond_ages"},
        install_hint="pip install 'dstl[s3]'",
    ),
    # file:// by default; moto S3 with DSTL_DFS_CONFORMANCE_BACKEND=s3.
    environment="dstl.dfs._private.conformance:dfs_environment",
    backdoor="dstl.dfs._private.conformance:DfsBackdoor",
)
