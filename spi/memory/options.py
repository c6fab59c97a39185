"""Configuration options of the ``memory`` storage."""

from __future__ import annotations

from ..options import ConfigOption, OptionType

__all__ = [
    "MEMORY_OPTIONS",
    "NAMESPACE",
    "PREEMPTIVE_PERSIST_THRESHOLD",
    "UPLOAD_DELAY",
]

NAMESPACE: ConfigOption[str] = ConfigOption(
    "dstl.memory.namespace",
    OptionType.STRING,
    "default",
    "Process-wide namespace the memory storage keeps its objects in; "
    "storage instances with the same namespace see each other's data.",
)

PREEMPTIVE_PERSIST_THRESHOLD: ConfigOption[int | None] = ConfigOption(
    "dstl.memory.preemptive-persist-threshold",
    OptionType.SIZE,
    None,
    "Upload a writer's changes ahead of the checkpoint once this many bytes are buffered "
    "(none: only at persist). The conformance run sets it, so the suite covers uploads ahead.",
    minimum=1,
)

UPLOAD_DELAY: ConfigOption[float] = ConfigOption(
    "dstl.memory.upload-delay",
    OptionType.DURATION,
    0.0,
    "Complete each upload this long after it starts, on another thread, as a remote store does "
    "(0: at once, in the caller). The conformance run sets it, so the suite covers persists that "
    "overlap uploads still in flight.",
    minimum=0.0,
)

MEMORY_OPTIONS = (
    NAMESPACE,
    PREEMPTIVE_PERSIST_THRESHOLD,
    UPLOAD_DELAY,
)
