"""The DFS writer: its persists join the storage's next upload batch."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from dstl.spi.kit import ChangeSet, ChangeSetWriter, Location, WriterHost, mapped

from .scheduler import UploadRequest

__all__ = ["DfsWriter", "UploadHost"]


class UploadHost(WriterHost, Protocol):
    """What a :class:`DfsWriter` needs of the DFS storage."""

    def submit_upload(self, request: UploadRequest) -> Future[Any]:
        """Queue change sets for the next upload batch: ``(key, offset, length)`` of each."""
        ...

    def pin(self, key: str, offset: int) -> None:
        """The writer holds the change set at ``offset`` of object ``key`` for reuse."""
        ...

    def unpin(self, locations: list[Location]) -> None:
        """The writer released these change sets."""
        ...


class DfsWriter(ChangeSetWriter):
    """Writer whose persists join the storage's next upload batch."""

    _storage: UploadHost

    def _upload(self, change_sets: Sequence[ChangeSet], checkpoint_id: int) -> Future[list[Location]]:
        host = self._storage
        blobs = [(cs.sqn, self._encoded(cs)) for cs in change_sets]
        request = UploadRequest(self.log_id, self.epoch, self._token, blobs)

        def to_locations(stored: list[tuple[str, int, int]]) -> list[Location]:
            locations: list[Location] = []
            for (sqn, _), (key, offset, length) in zip(blobs, stored, strict=True):
                locations.append({"object": key, "offset": offset, "length": length, "sqn": sqn})
                host.pin(key, offset)
            return locations

        return mapped(host.submit_upload(request), to_locations)

    def _released(self, locations: list[Location]) -> None:
        self._storage.unpin(locations)
