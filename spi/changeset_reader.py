"""A reader base for storages that keep change sets in the shared format.

Storages subclass :class:`ChangeSetReader` and implement only
:meth:`ChangeSetReader._fetch`: where the bytes of one change set are. Ordering,
SQN-range and key-group filtering, and the check that the stored change set is
the one the handle names live here once.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

from .changeset_format import decode_change_set
from .errors import CorruptedError, StorageError
from .handle import ChangelogHandle, LocationValue
from .reader import StateChangelogReader
from .types import KeyGroupRange, StateChange

__all__ = ["ChangeSetReader", "FetchedChangeSet"]


@dataclass(frozen=True, slots=True)
class FetchedChangeSet:
    """Bytes holding one change set at ``offset``.

    :ivar location: names the object, file or record in error messages.
    :ivar base_offset: added to ``offset`` in error messages (the position of
        ``buffer`` in the stored object).
    """

    buffer: bytes | memoryview
    offset: int
    location: str
    base_offset: int = 0


class ChangeSetReader(StateChangelogReader):
    """Reads handles whose locations each name one change set (with its ``sqn``)."""

    def __init__(self, storage_id: str) -> None:
        self._storage_id = storage_id

    @abstractmethod
    def _fetch(self, handle: ChangelogHandle, location: dict[str, LocationValue]) -> FetchedChangeSet:
        """Fetch the change set at ``location``.

        :raises StorageError: when it cannot be fetched (e.g. it was discarded).
        """

    def read(self, handle: ChangelogHandle, key_groups: KeyGroupRange | None = None) -> Iterator[StateChange]:
        """Yield the handle's changes; see :class:`StateChangelogReader`."""
        if handle.storage_id != self._storage_id:
            msg = f"handle of storage {handle.storage_id!r} cannot be read by storage {self._storage_id!r}"
            raise StorageError(msg)
        wanted = [loc for loc in handle.location_dicts if loc.get("sqn") in handle.sqn_range]
        lowest, highest = (key_groups.start, key_groups.end) if key_groups is not None else (0, 0)
        for loc in sorted(wanted, key=lambda entry: entry["sqn"]):  # type: ignore[arg-type,return-value]
            fetched = self._fetch(handle, loc)
            decoded = decode_change_set(
                fetched.buffer, fetched.offset, location=fetched.location, base_offset=fetched.base_offset
            )
            if (decoded.log_id, decoded.epoch, decoded.sqn) != (handle.log_id, handle.epoch, loc["sqn"]):
                msg = (
                    f"stored change set belongs to log {decoded.log_id!r} epoch {decoded.epoch} SQN "
                    f"{decoded.sqn}, not to the handle's log {handle.log_id!r} epoch {handle.epoch} "
                    f"SQN {loc['sqn']}"
                )
                raise CorruptedError(
                    msg, location=fetched.location, offset=fetched.base_offset + fetched.offset
                )
            for key_group, change in decoded.changes:
                if key_groups is None or key_group < 0 or lowest <= key_group < highest:
                    yield StateChange(key_group, change, decoded.sqn)
