"""Registers the ``filesystem`` storage (entry point ``dstl.storage: filesystem``)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from dstl.spi import KNOWN_CAPABILITIES, StorageRegistry, StorageSpec, hookimpl

from .options import DFS_OPTIONS

if TYPE_CHECKING:
    from dstl.conformance import ConformanceBackdoor

IDENTIFIER = "filesystem"


@hookimpl
def dstl_register_storages(registry: StorageRegistry) -> None:
    """Register the DFS / object-store storage."""
    registry.add(
        StorageSpec(
            identifier=IDENTIFIER,
            factory="dstl.dfs._private.storage:DfsStorage",
            description="Batched, hedged uploads to any fsspec URL (file://, s3://, memory://, gs://).",
            options=DFS_OPTIONS,
            capabilities=KNOWN_CAPABILITIES,  # every capability the suite knows
            install_hint="pip install 'dstl[s3]'",
        )
    )


@hookimpl
def dstl_conformance_environment(
    identifier: str, workdir: Path
) -> AbstractContextManager[dict[str, str]] | None:
    """A base path for the run (file:// by default; moto S3 with DSTL_DFS_CONFORMANCE_BACKEND=s3)."""
    if identifier != IDENTIFIER:
        return None
    from ._private.conformance import dfs_environment

    return dfs_environment(workdir)


@hookimpl
def dstl_conformance_backdoor(identifier: str) -> ConformanceBackdoor | None:
    """Raw object access."""
    if identifier != IDENTIFIER:
        return None
    from ._private.conformance import DfsBackdoor

    return DfsBackdoor()
