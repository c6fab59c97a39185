"""Registers the ``memory`` storage (entry point ``dstl.storage: memory``)."""

from __future__ import annotations

from ..hookspecs import hookimpl
from ..options import ConfigOption, OptionType
from ..registry import StorageRegistry, StorageSpec

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
            identifier="memory",
            factory="dstl.spi.memory._private.storage:MemoryStorage",
            description="In-process reference storage (not durable); proves the conformance suite.",
            options=MEMORY_OPTIONS,
            capabilities=frozenset({"fencing", "physical_truncation", "leak_check", "corruption_injection"}),
            conformance="dstl.spi.memory._private.conformance:MemoryConformance",
        )
    )
