"""Registers the ``local`` storage (entry point ``dstl.storage: local``)."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from dstl.spi import KNOWN_CAPABILITIES, StorageRegistry, StorageSpec, hookimpl

from .options import LOCAL_OPTIONS

if TYPE_CHECKING:
    from dstl.conformance import ConformanceBackdoor

IDENTIFIER = "local"


@hookimpl
def dstl_register_storages(registry: StorageRegistry) -> None:
    """Register the local-disk storage."""
    registry.add(
        StorageSpec(
            identifier=IDENTIFIER,
            factory="dstl.local._private.storage:LocalStorage",
            description="Append-only segment files on local disk, group-commit fsync (embedded default).",
            options=LOCAL_OPTIONS,
            capabilities=KNOWN_CAPABILITIES,  # every capability the suite knows
        )
    )


@hookimpl
def dstl_conformance_environment(
    identifier: str, workdir: Path
) -> AbstractContextManager[dict[str, str]] | None:
    """A directory of its own for the run."""
    if identifier != IDENTIFIER:
        return None
    return contextlib.nullcontext({"dstl.local.dir": str(workdir / "local")})


@hookimpl
def dstl_conformance_backdoor(identifier: str) -> ConformanceBackdoor | None:
    """Direct access to segment files."""
    if identifier != IDENTIFIER:
        return None
    from ._private.conformance import LocalBackdoor

    return LocalBackdoor()
