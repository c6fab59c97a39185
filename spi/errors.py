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
    "JobConflictError",
    "PluginError",
    "ReadOnlyError",
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

    @classmethod
    def by_owner(cls, log_id: str, epoch: int, owner_epoch: int | None) -> FencedError:
        """The error for a writer at ``epoch`` that found ``owner_epoch`` owning its log.

        The message says what happened: a newer writer, a same-epoch duplicate, or an
        owner record that went missing or backwards (tampering), never "a newer
        writer" with an older epoch.
        """
        writer = f"writer of log {log_id!r} with epoch {epoch}"
        if owner_epoch is None:
            why = (
                "lost its ownership: the log's owner record is gone, replaced or unreadable "
                "(changed outside dstl), so it stops rather than risk two writers"
            )
        elif owner_epoch > epoch:
            why = f"was fenced by a newer writer (epoch {owner_epoch})"
        elif owner_epoch == epoch:
            why = (
                f"was fenced by another writer with the same epoch {epoch} (epochs must be unique per writer)"
            )
        else:
            why = (
                f"found an older epoch ({owner_epoch}) owning its log: the owner record was rolled back "
                "or replaced outside dstl, so it stops rather than risk two writers"
            )
        return cls(f"{writer} {why}")


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
        if not isinstance(message, str) or not message:
            # "None (segment at offset 7)" would say where but not what: every caller says what
            msg = f"a CorruptedError needs a message saying what is damaged, got {message!r}"
            raise TypeError(msg)
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


class JobConflictError(ConfigError):
    """Two jobs (checkpoint locations) claim one job id on one storage: they would delete each other's data.

    Give one of them a job id of its own (or let it derive one from its checkpoint
    location, the default).
    """

    def __init__(self, job_id: str, bound_to: str, claimed_by: str) -> None:
        self.job_id = job_id
        self.bound_to = bound_to
        self.claimed_by = claimed_by
        super().__init__(
            f"job id {job_id!r} on this storage belongs to the job checkpointed at {bound_to!r:.300}, "
            f"but the job checkpointed at {claimed_by!r:.300} claims it too: sharing it, each would "
            "discard and collect the other's data. Give this job a job id of its own (job_id=..., or "
            "leave it unset to derive one from the checkpoint location), or point dstl.local.dir / "
            "dstl.dfs.base-path elsewhere"
        )


class ReadOnlyError(ConfigError):
    """A storage opened read only (``dstl.read-only``) was asked to write or delete."""


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
