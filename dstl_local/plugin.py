"""The ``local`` storage's plugin (entry point ``dstl.storage: local``)."""

from __future__ import annotations

from dstl.spi import KNOWN_CAPABILITIES, StorageSpec
from dstl.spi.storage_plugin import StoragePlugin

from .options import LOCAL_OPTIONS

plugin = StoragePlugin(
    StorageSpec(
        identifier="local",
        factory="dstl.local._private.storage:LocalStorage",
        description="Append-only segment files on local disk, group-commit fsync (embedded default).",
        options=LOCAL_OPTIONS,
        capabilities=KNOWN_CAPABILITIES,  # every capability the suite knows
    ),
    environment="dstl.local._private.conformance:local_environment",
    backdoor="dstl.local._private.conformance:LocalBackdoor",
)
