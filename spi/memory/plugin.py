"""The ``memory`` storage's plugin (entry point ``dstl.storage: memory``)."""

from __future__ import annotations

from ..options import ConfigOption, OptionType
from ..registry import StorageSpec
from ..storage_plugin import StoragePlugin

MEMORY_OPTIONS = (
    ConfigOption(
        "dstl.memory.namespace",
        OptionType.STRING,
        "default",
        "Process-wide namespace the memory storage keeps its objects in; "
        "storage instances with the same namespace see each other's data.",
    ),
    ConfigOption(
        "dstl.memory.preemptive-persist-threshold",
        OptionType.SIZE,
        None,
        "Upload a writer's changes ahead of the checkpoint once this many bytes are buffered "
        "(none: only at persist). The conformance run sets it, so the suite covers uploads ahead.",
        minimum=1,
    ),
    ConfigOption(
        "dstl.memory.upload-delay",
        OptionType.DURATION,
        0.0,
        "Complete each upload this long after it starts, on another thread, as a remote store does "
        "(0: at once, in the caller). The conformance run sets it, so the suite covers persists that "
        "overlap uploads still in flight.",
        minimum=0.0,
    ),
)

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
            }
        ),
    ),
    environment="dstl.spi.memory._private.conformance:memory_environment",
    backdoor="dstl.spi.memory._private.conformance:MemoryBackdoor",
)
