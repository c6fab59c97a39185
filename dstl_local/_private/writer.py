"""The local writer: its persists join the storage's group commit."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from dstl.spi import KeyGroupRange
from dstl.spi.kit import ChangeSet, ChangeSetWriter, Location, WriterHost, mapped

from .fencing import OwnerCheck
from .group_commit import CommitRequest

__all__ = ["LocalWriter", "SegmentHost"]


class SegmentHost(WriterHost, Protocol):
    """What a :class:`LocalWriter` needs of the local storage."""

    def submit_commit(self, request: CommitRequest) -> Future[tuple[str, int]]:
        """Queue change sets for the next group commit: their segment and first offset."""
        ...

    def relative_segment(self, segment: str) -> str:
        """The location of a segment file, as handles hold it."""
        ...

    def pin(self, segment: str, offset: int) -> None:
        """The writer holds the change set at ``offset`` for reuse."""
        ...

    def unpin(self, locations: list[Location]) -> None:
        """The writer released these change sets."""
        ...


class LocalWriter(ChangeSetWriter):
    """Writer whose persists go through the storage's group commit.

    :param owner_check: the log's epoch file, checked by the commit that writes this
        writer's change sets (fencing); closed with the writer.
    """

    _storage: SegmentHost

    def __init__(
        self,
        host: SegmentHost,
        log_id: str,
        key_groups: KeyGroupRange,
        epoch: int,
        token: str,
        *,
        owner_check: OwnerCheck,
        **kwargs: Any,
    ) -> None:
        super().__init__(host, log_id, key_groups, epoch, token, **kwargs)
        self._owner_check = owner_check

    def _upload(self, change_sets: Sequence[ChangeSet], checkpoint_id: int) -> Future[list[Location]]:
        blobs = [self._encoded(cs) for cs in change_sets]
        request = CommitRequest(self.log_id, self.epoch, self._token, self._owner_check.owner, blobs)
        host = self._storage

        def to_locations(written: tuple[str, int]) -> list[Location]:
            segment, offset = written
            locations: list[Location] = []
            for cs, blob in zip(change_sets, blobs, strict=True):
                where = host.relative_segment(segment)
                locations.append({"segment": where, "offset": offset, "length": len(blob), "sqn": cs.sqn})
                host.pin(segment, offset)
                offset += len(blob)
            return locations

        return mapped(host.submit_commit(request), to_locations)

    def _released(self, locations: list[Location]) -> None:
        self._storage.unpin(locations)

    def close(self) -> None:
        """Close the writer and its epoch-file descriptor."""
        super().close()
        self._owner_check.close()
