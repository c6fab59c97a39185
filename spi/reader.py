"""The reader half of the SPI."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from itertools import groupby

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

    def read_change_sets(
        self, handle: ChangelogHandle, key_groups: KeyGroupRange | None = None
    ) -> Iterator[tuple[int, list[tuple[int, bytes]]]]:
        """The changes of :meth:`read`, one ``(sqn, [(key_group, data), ...])`` per change set.

        Same order, filtering and verification as :meth:`read`. Bulk consumers (a
        restore replaying millions of changes) use it to skip one object per change;
        storages that hold decoded change sets override it to hand them over as they are.
        A change set with no change within the filter carries nothing: it may be
        yielded (with an empty list) or left out, as this default built on :meth:`read`
        does; never under another SQN.
        """
        for sqn, changes in groupby(self.read(handle, key_groups), key=lambda change: change.sqn):
            yield sqn if sqn is not None else -1, [(change.key_group, change.data) for change in changes]

    def close(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Release resources (caches, connections); idempotent."""
