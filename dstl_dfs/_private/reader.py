"""The DFS reader: change sets through the storage's shared download cache."""

from __future__ import annotations

from typing import Protocol

from dstl.spi import ChangelogHandle, CorruptedError
from dstl.spi.kit import (
    OFFSET_LENGTH_FIELDS,
    ChangeSetReader,
    FetchedChangeSet,
    LocationField,
    LocationValue,
    check_relative_path,
)

from .cache import DownloadCache
from .object_store import ObjectStore

__all__ = ["DfsReader"]


class CachedObjects(Protocol):
    """What a :class:`DfsReader` needs of the DFS storage."""

    cache: DownloadCache
    store: ObjectStore

    @property
    def identifier(self) -> str:
        """The storage identifier."""
        ...

    def check_open(self) -> None:
        """Raise once the storage is closed."""
        ...


class DfsReader(ChangeSetReader):
    """Reads change sets through the storage's download cache."""

    location_fields = {"object": LocationField(str), **OFFSET_LENGTH_FIELDS}

    def __init__(self, objects: CachedObjects) -> None:
        super().__init__(objects.identifier)
        self._objects = objects

    def _fetch(self, handle: ChangelogHandle, location: dict[str, LocationValue]) -> FetchedChangeSet:
        objects = self._objects
        objects.check_open()  # its download pool is gone: say so, not RuntimeError
        key = check_relative_path(str(location["object"]), "object location")
        data = objects.cache.acquire(key)
        objects.cache.release(key)
        offset, length = int(location["offset"]), int(location["length"])  # type: ignore[arg-type]
        if offset + length > len(data):
            msg = f"object is {len(data)} bytes, the change set ends at {offset + length}"
            raise CorruptedError(msg, location=objects.store.describe(key), offset=offset)
        return FetchedChangeSet(data, offset, objects.store.describe(key))
