"""Raw access to a storage's backing store for the conformance suite."""

from __future__ import annotations

from abc import ABC
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager

from dstl.spi import ChangelogHandle, StateChangelogStorage

__all__ = ["FORGERY_PADDING", "ConformanceBackdoor"]

#: Bytes a backdoor's :meth:`ConformanceBackdoor.forge` puts before the forged change
#: set, so an error that reports offset 0 instead of the change set's is caught.
FORGERY_PADDING = b"padding"


class ConformanceBackdoor(ABC):  # noqa: B024 - every method is optional, by capability
    """What a storage offers the suite beyond the SPI, bypassing the storage under test.

    Each method belongs to a capability; a storage that declares the capability
    must implement it. Defaults raise :class:`NotImplementedError`, which fails the
    test (a declared capability that is not backed by its method is a bug).
    """

    def list_objects(self, storage: StateChangelogStorage) -> list[str]:
        """Every stored object (file, key, row, record batch) of ``storage``'s job.

        Capability ``leak_check``.
        """
        msg = "leak_check declared but list_objects() not implemented"
        raise NotImplementedError(msg)

    def corrupt(self, storage: StateChangelogStorage, handle: ChangelogHandle) -> None:
        """Damage one stored byte of the first change set ``handle`` refers to.

        Capability ``corruption_injection``. The damage must be in the bytes a
        reader verifies (not in a file name or an index the storage rebuilds).
        """
        msg = "corruption_injection declared but corrupt() not implemented"
        raise NotImplementedError(msg)

    def forge(
        self, storage: StateChangelogStorage, handle: ChangelogHandle, data: bytes
    ) -> tuple[ChangelogHandle, int]:
        """Store ``data`` as the bytes of a change set of ``handle``'s log; return a handle to them.

        Capability ``forgery_injection``, for storages that keep each change set in
        dstl's change-set format (:mod:`dstl.spi.kit.changeset_format`). ``handle`` has
        one change set; ``data`` may be anything (a cut header, a body whose count
        or framing lies, under a valid checksum). It goes into a new object, file or
        record behind :data:`FORGERY_PADDING` bytes of padding, and the returned handle
        (``handle`` with one location) reads it. Also returns the offset a
        :class:`~dstl.spi.CorruptedError` about ``data`` must report: where it starts
        in what holds it. :func:`~dstl.conformance.testing.place_forgery` builds both
        around the write.
        """
        msg = "forgery_injection declared but forge() not implemented"
        raise NotImplementedError(msg)

    def unreachable_config(self, config: Mapping[str, str]) -> tuple[dict[str, str], float]:
        """Config overrides under which the backing service cannot be reached.

        Capability ``failure_injection``.

        :returns: the overrides and the time within which ``persist`` (or creating
            the storage) must fail with :class:`~dstl.spi.StorageError`.
        """
        msg = "failure_injection declared but unreachable_config() not implemented"
        raise NotImplementedError(msg)

    def failing_sync(self, storage: StateChangelogStorage) -> AbstractContextManager[list[int]]:
        """A context in which the storage's next write to durable storage fails once.

        Capability ``sync_failure_injection``: the first sync (``fdatasync``,
        ``fsync``) or upload inside the context raises ``EIO``; the yielded list
        receives a 1 for each fault injected, so the suite can check one was.
        """
        msg = "sync_failure_injection declared but failing_sync() not implemented"
        raise NotImplementedError(msg)

    def list_metadata(self, storage: StateChangelogStorage) -> list[str]:
        """Every metadata object the storage keeps for ``storage``'s job besides change data.

        Capability ``metadata_check``: epoch files, epoch markers, claims, owner rows.
        The suite checks that they do not grow with the number of writer epochs.
        """
        msg = "metadata_check declared but list_metadata() not implemented"
        raise NotImplementedError(msg)

    def power_loss(self) -> AbstractContextManager[Callable[[], None]]:
        """A context in which the storages opened inside it run on a layer that can lose power.

        Capability ``survives_power_loss``. The yielded function cuts the power:
        afterwards the backing store holds only what was synced (data, directory
        entries), as after a host crash; the storages opened in the context are not
        used again. :func:`~dstl.conformance.testing.unsynced_writes_lost` does it
        for storages that write files with ``os`` calls.
        """
        msg = "survives_power_loss declared but power_loss() not implemented"
        raise NotImplementedError(msg)
