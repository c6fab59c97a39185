"""The local reader: change sets by segment and offset."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from dstl.spi import ChangelogHandle
from dstl.spi.kit import OFFSET_LENGTH_FIELDS, ChangeSetReader, FetchedChangeSet, LocationField, LocationValue

from .segments import read_change_set_bytes

__all__ = ["LocalReader"]


class SegmentFiles(Protocol):
    """Where a :class:`LocalReader` finds segment files."""

    @property
    def identifier(self) -> str:
        """The storage identifier."""
        ...

    def segment_path(self, relative: str) -> Path:
        """The file of a segment location."""
        ...


class LocalReader(ChangeSetReader):
    """Reads change sets by segment and offset."""

    location_fields = {"segment": LocationField(str), **OFFSET_LENGTH_FIELDS}

    def __init__(self, files: SegmentFiles) -> None:
        super().__init__(files.identifier)
        self._files = files

    def _fetch(self, handle: ChangelogHandle, location: dict[str, LocationValue]) -> FetchedChangeSet:
        # Reads may cross jobs under the same base (a handle is readable from config + handle
        # JSON, whatever job opened the storage); deletes never do (the storage's own segments only).
        path = self._files.segment_path(str(location["segment"]))
        offset, length = int(location["offset"]), int(location["length"])  # type: ignore[arg-type]
        return FetchedChangeSet(read_change_set_bytes(path, offset, length), 0, str(path), base_offset=offset)
