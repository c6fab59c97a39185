"""The ``memory`` storage's plugin (entry point ``dstl.storage: memory``)."""

from __future__ import annotations

from ..registry import StorageSpec
from ..storage_plugin import StoragePlugin
from .options import MEMORY_OPTIONS

plugin = StoragePlugin(
    StorageSpec(
        identifier="memory",
        factory="dstl.spi.memory._private.storage:MemoryStorage",
        description="In-process reference storage (not durable); proves the conformance suite.",
        options=MEMORY_OPTIONS,
        capabilities=frozenset(
            {
                "fencing",
                "physical_truncation",
                "leak_check",
                "corruption_injection",
                "forgery_injection",
                "orphan_collection",
                "subsecond_ages",
            }
        ),
    ),
    environment="dstl.spi.memory._private.conformance:memory_environment",
    backdoor="dstl.spi.memory._private.conformance:MemoryBackdoor",
)
