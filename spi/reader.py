"""The reader half of the SPI."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator

from .handle import ChangelogHandle
from .types import KeyGroupRange, StateChange

__all__ = ["StateChangelogReader"]


class StateChangelogReader(ABC):
    """Reads the changes a handle refers to.

    Readers verify checksums: damaged data raises :class:`~dstl.spi.CorruptedError`
    naming the object and offset and is never yielded.
    """

    @abstractmethod
    def read(self, handle: ChangelogHandle, key_groups: KeyGroupRange | None = None) -> Iterator[StateChange]:
        """Yield the handle's changes in SQN order, appends in order within a change set.

        Only changes of ``handle.log_id`` and ``handle.epoch`` with SQN in
        ``handle.sqn_range`` are yielded; when ``key_groups`` is given, only those
        key groups plus metadata records. Each yielded change carries its ``sqn``.

        :raises CorruptedError: when stored bytes fail verification.
        :raises StorageError: when the data cannot be fetched.
        """

    def close(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Release resources (caches, connections); idempotent."""
