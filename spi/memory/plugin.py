"""Registers the ``memory`` storage (entry point ``dstl.storage: memory``)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from ..hookspecs import hookimpl
from ..options import ConfigOption, OptionType
from ..registry import StorageRegistry, StorageSpec

if TYPE_CHECKING:
    from dstl.conformance import ConformanceBackdoor

IDENTIFIER = "memory"

MEMORY_OPTIONS = (
    ConfigOption(
        "dstl.memory.namespace",
        OptionType.STRING,
        "default",
        "Process-wide namespace the memory storage keeps its objects in; "
        "storage instances with the same namespace see each other's data.",
    ),
)


@hookimpl
def dstl_register_storages(registry: StorageRegistry) -> None:
    """Register the in-memory reference storage."""
    registry.add(
        StorageSpec(
            identifier=IDENTIFIER,
            factory="dstl.spi.memory._private.storage:MemoryStorage",
            description="In-process reference storage (not durable); proves the conformance suite.",
            options=MEMORY_OPTIONS,
            capabilities=frozenset({"fencing", "physical_truncation", "leak_check", "corruption_injection"}),
        )
    )


@hookimpl
def dstl_conformance_environment(
    identifier: str, workdir: Path
) -> AbstractContextManager[dict[str, str]] | None:
    """Give the run a namespace of its own."""
    if identifier != IDENTIFIER:
        return None
    from ._private.conformance import memory_environment

    return memory_environment()


@hookimpl
def dstl_conformance_backdoor(identifier: str) -> ConformanceBackdoor | None:
    """Direct access to the namespace's objects."""
    if identifier != IDENTIFIER:
        return None
    from ._private.conformance import MemoryBackdoor

    return MemoryBackdoor()
