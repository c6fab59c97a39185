"""A reader base for storages that keep change sets in the shared format.

Storages subclass :class:`ChangeSetReader` and implement only
:meth:`ChangeSetReader._fetch`: where the bytes of one change set are. Ordering,
SQN-range and key-group filtering, and the check that the stored change set is
the one the handle names live here once.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar

from ..errors import CorruptedError, InvalidHandleError, StorageError
from ..handle import ChangelogHandle, LocationValue
from ..reader import StateChangelogReader
from ..types import KeyGroupRange, StateChange
from .changeset_format import decode_change_set

__all__ = [
    "OFFSET_LENGTH_FIELDS",
    "ChangeSetReader",
    "FetchedChangeSet",
    "LocationField",
    "checked_locations",
    "decode_fetched",
]

_MAX_OFFSET = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class LocationField:
    """One field of a storage's handle locations: its type and, for ints, the allowed range.

    Locations come back from shared storage (untrusted): a reader checks them
    against its fields before it touches any byte, so a missing or out-of-range
    value is an :class:`~dstl.spi.InvalidHandleError` naming the field, never a
    ``KeyError``, ``OverflowError`` or ``MemoryError``.
    """

    kind: type[int] | type[str]
    low: int = 0
    high: int = _MAX_OFFSET
    required: bool = True

    def check(self, name: str, value: object, where: str) -> None:
        """Raise :class:`InvalidHandleError` unless ``value`` fits."""
        if value is None and not self.required:
            return
        if not isinstance(value, self.kind) or isinstance(value, bool):
            msg = f"{where}: field {name!r} must be {self.kind.__name__}, got {value!r:.60}"
            raise InvalidHandleError(msg)
        if isinstance(value, int) and not self.low <= value <= self.high:
            msg = f"{where}: field {name!r} is {value}, outside [{self.low}, {self.high}]"
            raise InvalidHandleError(msg)


_SQN_FIELD = LocationField(int)
#: Offset and length of a change set inside an object or segment (at most 2 GiB each).
OFFSET_LENGTH_FIELDS: Mapping[str, LocationField] = {
    "offset": LocationField(int),
    "length": LocationField(int, 1, (1 << 31) - 1),
}


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
    """Reads handles whose locations each name one change set (with its ``sqn``).

    :cvar location_fields: the storage's location fields besides ``sqn``, checked
        before any read (see :class:`LocationField`).
    """

    location_fields: ClassVar[Mapping[str, LocationField]] = {}

    def __init__(self, storage_id: str) -> None:
        self._storage_id = storage_id

    @abstractmethod
    def _fetch(self, handle: ChangelogHandle, location: dict[str, LocationValue]) -> FetchedChangeSet:
        """Fetch the change set at ``location``.

        :raises StorageError: when it cannot be fetched (e.g. it was discarded).
        """

    def read(self, handle: ChangelogHandle, key_groups: KeyGroupRange | None = None) -> Iterator[StateChange]:
        """Yield the handle's changes; see :class:`StateChangelogReader`."""
        for sqn, changes in decode_fetched(handle, self._fetch_each(handle), key_groups):  # streamed
            for key_group, change in changes:
                yield StateChange(key_group, change, sqn)

    def read_change_sets(
        self, handle: ChangelogHandle, key_groups: KeyGroupRange | None = None
    ) -> Iterator[tuple[int, list[tuple[int, bytes]]]]:
        """The decoded change sets themselves; see :meth:`StateChangelogReader.read_change_sets`."""
        if not self.fetches_change_sets:  # a subclass reads its own way: follow it
            yield from super().read_change_sets(handle, key_groups)
            return
        yield from decode_fetched(handle, self.fetch_change_sets(handle), key_groups)

    @property
    def fetches_change_sets(self) -> bool:
        """Whether :meth:`fetch_change_sets` + :func:`decode_fetched` read as :meth:`read` does."""
        return type(self).read is ChangeSetReader.read

    def fetch_change_sets(self, handle: ChangelogHandle) -> list[tuple[int, FetchedChangeSet]]:
        """The I/O half of a read: ``(sqn, fetched bytes)`` of each change set, in SQN order.

        :func:`decode_fetched` is the other half (CPU only, so it may run elsewhere,
        e.g. in a forked process, while this process does other work).
        """
        return list(self._fetch_each(handle))

    def _fetch_each(self, handle: ChangelogHandle) -> Iterator[tuple[int, FetchedChangeSet]]:
        """``(sqn, fetched)`` per change set, lazily (locations checked once, here)."""
        if handle.storage_id != self._storage_id:
            msg = f"handle of storage {handle.storage_id!r} cannot be read by storage {self._storage_id!r}"
            raise StorageError(msg)
        yield from self._fetch_wanted(handle, self._wanted_locations(handle))

    def _fetch_wanted(
        self, handle: ChangelogHandle, wanted: list[dict[str, LocationValue]]
    ) -> Iterator[tuple[int, FetchedChangeSet]]:
        """``(sqn, fetched)`` of the checked ``wanted`` locations; storages that fetch in bulk wrap it."""
        for loc in wanted:
            yield int(loc["sqn"]), self._fetch(handle, loc)  # type: ignore[arg-type]

    def _wanted_locations(self, handle: ChangelogHandle) -> list[dict[str, LocationValue]]:
        """The handle's locations inside its SQN range, checked and in SQN order.

        :raises InvalidHandleError: naming the handle's log and the field of a bad location.
        """
        wanted = [
            loc for loc in checked_locations(handle, self.location_fields) if loc["sqn"] in handle.sqn_range
        ]
        wanted.sort(key=lambda entry: entry["sqn"])  # type: ignore[arg-type,return-value]
        return wanted


def checked_locations(
    handle: ChangelogHandle, fields: Mapping[str, LocationField]
) -> list[dict[str, LocationValue]]:
    """Every location of ``handle``, each checked against ``sqn`` and ``fields``.

    Storages call it wherever they use a handle's locations (reads and discards).

    :raises InvalidHandleError: naming the handle's log and the field of a bad location.
    """
    where = f"location of handle of log {handle.log_id!r}"
    locations = handle.location_dicts
    for loc in locations:
        _SQN_FIELD.check("sqn", loc.get("sqn"), where)
        for name, field in fields.items():
            field.check(name, loc.get(name), where)
    return locations


def decode_fetched(
    handle: ChangelogHandle,
    fetched: Iterable[tuple[int, FetchedChangeSet]],
    key_groups: KeyGroupRange | None = None,
) -> Iterator[tuple[int, list[tuple[int, bytes]]]]:
    """Verify and decode fetched change sets: ``(sqn, [(key_group, data), ...])`` of ``key_groups``.

    :raises CorruptedError: when a change set fails its checksum or is not the one the handle names.
    """
    window = (key_groups.start, key_groups.end) if key_groups is not None else None
    for sqn, change_set in fetched:
        decoded = decode_change_set(
            change_set.buffer,
            change_set.offset,
            location=change_set.location,
            base_offset=change_set.base_offset,
            key_groups=window,
        )
        if (decoded.log_id, decoded.epoch, decoded.sqn) != (handle.log_id, handle.epoch, sqn):
            msg = (
                f"stored change set belongs to log {decoded.log_id!r} epoch {decoded.epoch} SQN "
                f"{decoded.sqn}, not to the handle's log {handle.log_id!r} epoch {handle.epoch} SQN {sqn}"
            )
            raise CorruptedError(
                msg, location=change_set.location, offset=change_set.base_offset + change_set.offset
            )
        yield sqn, decoded.changes
