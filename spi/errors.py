"""The error hierarchy of dstl. Every error dstl raises on purpose is a :class:`DstlError`."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "ClosedError",
    "ConfigError",
    "CorruptedError",
    "DstlError",
    "FencedError",
    "InvalidHandleError",
    "InvalidIdentifierError",
    "PluginError",
    "StorageError",
    "TruncatedError",
    "UnknownStorageError",
]


class DstlError(Exception):
    """Base class of all dstl errors."""


class ConfigError(DstlError, ValueError):
    """A configuration key is unknown or its value has the wrong form."""


class StorageError(DstlError):
    """The backing storage failed; ``retriable`` says whether trying again may help."""

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


class FencedError(StorageError):
    """A writer with a higher epoch exists for the same log; this writer must stop.

    Operators must not retry with the same writer: the newer writer owns the log.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=False)


class TruncatedError(StorageError, ValueError):
    """The requested changes lie below the writer's truncation point."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=False)


class CorruptedError(StorageError):
    """Stored log data failed its checksum or framing; it is never returned as data.

    ``location`` names the object, segment or partition and ``offset`` the byte or
    record offset where the damage was detected.
    """

    def __init__(self, message: str, *, location: str, offset: int | None = None) -> None:
        where = location if offset is None else f"{location} at offset {offset}"
        super().__init__(f"{message} ({where})", retriable=False)
        self.location = location
        self.offset = offset


class ClosedError(DstlError, RuntimeError):
    """A writer, reader or storage was used after it was closed."""


class InvalidHandleError(DstlError, ValueError):
    """A changelog handle (usually read back from shared storage) failed validation."""


class InvalidIdentifierError(DstlError, ValueError):
    """An operator, log or job id cannot be used as a name in storage."""


class PluginError(DstlError):
    """A plugin failed to load, registered a duplicate, or lacks its dependencies."""


class UnknownStorageError(ConfigError):
    """No installed storage plugin has the requested identifier."""

    def __init__(self, identifier: str, installed: Iterable[str]) -> None:
        self.identifier = identifier
        self.installed = sorted(installed)
        listed = ", ".join(self.installed) or "none"
        super().__init__(
            f"unknown storage {identifier!r}; installed storages: {listed}. "
            "Set dstl.storage to one of them, or install the plugin that provides "
            f"{identifier!r} (it must register under the 'dstl.storage' entry-point group)"
        )
