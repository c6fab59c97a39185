"""The working-state store behind the changelog layer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any

__all__ = [
    "SECTION_ENTRIES",
    "MappingView",
    "RowBlock",
    "StateDelegate",
    "StateView",
    "chunk_rows",
    "split_entry",
]

#: The most entries in one section (a list or map counts its elements): a key group with more
#: spans consecutive sections, so a materialization holds this many at a time whatever the
#: state's size (or one collection, when a single one is bigger).
SECTION_ENTRIES = 4096

#: Consecutive rows of a section (``[state, key, part]``, or ``[state, key, part, 1]`` for a part
#: that continues a collection) as a view reads them, and whether each is a single value.
RowBlock = tuple[list[list[Any]], bool]


class StateView(ABC):
    """A consistent read view of a delegate's state that later changes do not touch.

    Materialization reads it section by section, in the background, while the
    delegate keeps changing; :meth:`close` releases it.
    """

    @abstractmethod
    def state_names(self) -> list[str]:
        """The states in the view, in name order."""

    @abstractmethod
    def entries(self, state: str, key_group: int) -> Iterable[tuple[bytes, Any]]:
        """``(key, entry)`` of a state in a key group, as the view holds them."""

    @abstractmethod
    def get(self, state: str, key_group: int, key: bytes) -> Any | None:
        """One key's entry as the view holds it, or ``None``."""

    def chunks(self, state: str, key_group: int) -> Iterator[tuple[bytes, Any, bool]]:
        """``(key, part, continued)`` of a state in a key group: :meth:`entries` with big collections split.

        A list or map of more than :data:`SECTION_ENTRIES` elements comes in parts of
        at most that many; every part but the first has ``continued`` set (restores
        extend the entry with it). Views of stores that keep elements apart override
        this to stream them.
        """
        for key, entry in self.entries(state, key_group):
            yield from split_entry(key, entry)

    def key_chunks(self, state: str, key_group: int, key: bytes) -> Iterator[tuple[bytes, Any, bool]]:
        """:meth:`chunks` of one key (``(key, None, False)`` when it has no entry: a tombstone)."""
        return split_entry(key, self.get(state, key_group, key))

    def sections(self, key_groups: Iterable[int]) -> Iterator[tuple[int, list[list[Any]]]]:
        """``(key group, [[state, key, entry(, 1)], ...])`` of ``key_groups``, ascending, empty ones left out.

        A key group with more than :data:`SECTION_ENTRIES` entries (collection
        elements count one by one) comes as several consecutive sections; a part
        that continues a collection carries a fourth element, ``1``.
        """
        states = self.state_names()
        for key_group in sorted(key_groups):
            yield from _sectioned(
                key_group, (block for state in states for block in self.row_blocks(state, key_group))
            )

    def row_blocks(self, state: str, key_group: int) -> Iterator[RowBlock]:
        """A state's rows in a key group, a block at a time: :meth:`chunks` as rows.

        Views that can tell single values apart cheaply override it (a block of them
        is sectioned by slicing, not row by row).
        """
        return chunk_rows(state, self.chunks(state, key_group))

    def detach(self) -> None:  # noqa: B027 - a view that pins nothing of its store has nothing to do
        """Stop holding the live store's storage for the rest of a long read (e.g. a full snapshot).

        A view that keeps the store's replaced pages from reuse while it is open
        (an LMDB read transaction) copies itself out; the others need not.
        """

    def hand_over_copy(self) -> str | None:
        """The directory of the copy a detached view reads, with nothing of it open in this process.

        Another process may then read the copy (``read_copy``) while this one maps none of
        it; a read here opens it again. The copy goes when the view closes.
        ``None`` when the view reads no copy.
        """
        return None

    def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release the view."""

    def __enter__(self) -> StateView:
        """Return the view itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Release the view."""
        self.close()


def split_entry(key: bytes, entry: Any) -> Iterator[tuple[bytes, Any, bool]]:
    """``(key, part, continued)`` of one entry, a collection in parts of :data:`SECTION_ENTRIES` elements."""
    if not isinstance(entry, (list, dict)) or len(entry) <= SECTION_ENTRIES:
        yield key, entry, False
        return
    if isinstance(entry, list):
        for start in range(0, len(entry), SECTION_ENTRIES):
            yield key, entry[start : start + SECTION_ENTRIES], start > 0
        return
    part: dict[bytes, Any] = {}
    continued = False
    for map_key, value in entry.items():
        part[map_key] = value
        if len(part) == SECTION_ENTRIES:
            yield key, part, continued
            part, continued = {}, True
    if part:
        yield key, part, continued


def chunk_rows(state: str, chunks: Iterator[tuple[bytes, Any, bool]]) -> Iterator[RowBlock]:
    """``(key, part, continued)`` chunks of ``state`` as blocks of rows (not marked single values)."""
    while block := list(islice(chunks, SECTION_ENTRIES)):
        yield [[state, key, part, 1] if more else [state, key, part] for key, part, more in block], False


def _sectioned(key_group: int, blocks: Iterable[RowBlock]) -> Iterator[tuple[int, list[list[Any]]]]:
    """Sections of ``blocks``' rows: at most :data:`SECTION_ENTRIES` entries or elements each."""
    section: list[list[Any]] = []
    size = 0
    for rows, single_values in blocks:
        if single_values:  # one element each: fill the section by slices
            start = 0
            while start < len(rows):
                if size == SECTION_ENTRIES:
                    yield key_group, section
                    section, size = [], 0
                taken = rows[start : start + SECTION_ENTRIES - size]
                section.extend(taken)
                size += len(taken)
                start += len(taken)
            continue
        for row in rows:
            part = row[2]
            elements = max(len(part), 1) if isinstance(part, (list, dict)) else 1
            if section and size + elements > SECTION_ENTRIES:
                yield key_group, section
                section, size = [], 0
            section.append(row)
            size += elements
    if section:
        yield key_group, section


class MappingView(StateView):
    """A view over ``state -> key group -> {key: entry}`` mappings held in memory.

    :param on_close: called once when the view is released.
    """

    def __init__(
        self,
        view: Mapping[str, Mapping[int, Mapping[bytes, Any]]],
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._view = view
        self._on_close = on_close

    def state_names(self) -> list[str]:
        """The states in the view, in name order."""
        return sorted(self._view)

    def entries(self, state: str, key_group: int) -> Iterable[tuple[bytes, Any]]:
        """The mapping's items of the state and key group."""
        return self._view[state].get(key_group, {}).items()

    def get(self, state: str, key_group: int, key: bytes) -> Any | None:
        """The mapping's entry of the key, or ``None``."""
        groups = self._view.get(state)
        group = None if groups is None else groups.get(key_group)
        return None if group is None else group.get(key)

    def close(self) -> None:
        """Release the view (idempotent)."""
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()


class StateDelegate(ABC):
    """Entries by (state name, key group, key bytes).

    An entry is the stored form of one key's state: ``bytes`` for value state,
    ``list[bytes]`` for list state, ``dict[bytes, bytes]`` for map state. The
    changelog layer is the only writer; delegates apply what it tells them.

    The element methods (:meth:`append`, :meth:`map_get`, :meth:`map_put`,
    :meth:`map_remove`, :meth:`map_items`) work on one element of a collection.
    The defaults here rewrite the whole entry; the shipped delegates store
    collections per element, so they cost the same whatever the collection's size.
    """

    @abstractmethod
    def get(self, state: str, key_group: int, key: bytes) -> Any | None:
        """The entry, or ``None``."""

    @abstractmethod
    def put(self, state: str, key_group: int, key: bytes, entry: Any) -> None:
        """Store ``entry`` (replacing what was there)."""

    @abstractmethod
    def delete(self, state: str, key_group: int, key: bytes) -> None:
        """Remove the entry (no-op when absent)."""

    def write_batch(self, state: str, key_group: int, entries: Mapping[bytes, Any]) -> None:
        """Store ``key -> entry`` of one state and key group; an entry of ``None`` removes the key.

        Restores hand whole snapshot sections and squashed logs over this way;
        delegates override it to write them in one go.
        """
        for key, entry in entries.items():
            if entry is None:
                self.delete(state, key_group, key)
            else:
                self.put(state, key_group, key, entry)

    def get_many(self, state: str, key_groups: Sequence[int], keys: Sequence[bytes]) -> list[Any]:
        """The entries of ``keys`` (each in its key group), ``None`` where absent; one read for all."""
        get = self.get
        return [get(state, key_group, key) for key_group, key in zip(key_groups, keys, strict=True)]

    def get_values(self, state: str, key_groups: Sequence[int], keys: Sequence[bytes]) -> list[bytes | None]:
        """The entries of ``keys`` of a value or reducing state (entries without elements): :meth:`get_many`.

        Delegates override it when a value is cheaper to find than a collection.
        """
        return self.get_many(state, key_groups, keys)

    def put_values(
        self, state: str, key_groups: Sequence[int], keys: Sequence[bytes], values: Sequence[bytes]
    ) -> None:
        """Store a value entry per key, each in its key group (each key once): a bulk write.

        By default one :meth:`write_batch` per key group; delegates override it to
        write all in one go.
        """
        by_group: dict[int, dict[bytes, Any]] = {}
        for key_group, key, value in zip(key_groups, keys, values, strict=True):
            entries = by_group.get(key_group)
            if entries is None:
                entries = by_group[key_group] = {}
            entries[key] = value
        for key_group, entries in by_group.items():
            self.write_batch(state, key_group, entries)

    def append(self, state: str, key_group: int, key: bytes, element: bytes) -> None:
        """Append ``element`` to the key's list (creating it)."""
        self.put(state, key_group, key, [*(self.get(state, key_group, key) or []), element])

    def map_get(self, state: str, key_group: int, key: bytes, map_key: bytes) -> bytes | None:
        """The value under ``map_key`` in the key's map, or ``None``."""
        entry = self.get(state, key_group, key)
        return None if entry is None else entry.get(map_key)

    def map_put(self, state: str, key_group: int, key: bytes, map_key: bytes, value: bytes) -> None:
        """Set ``map_key`` to ``value`` in the key's map (creating it)."""
        self.put(state, key_group, key, {**(self.get(state, key_group, key) or {}), map_key: value})

    def map_remove(self, state: str, key_group: int, key: bytes, map_key: bytes) -> None:
        """Remove ``map_key`` from the key's map; an emptied map removes the key."""
        entry = dict(self.get(state, key_group, key) or {})
        if entry.pop(map_key, None) is None:
            return
        if entry:
            self.put(state, key_group, key, entry)
        else:
            self.delete(state, key_group, key)

    def map_items(self, state: str, key_group: int, key: bytes) -> Iterator[tuple[bytes, bytes]]:
        """``(map key, value)`` of the key's map (safe to change the map meanwhile)."""
        return iter(list((self.get(state, key_group, key) or {}).items()))

    def extend(self, state: str, key_group: int, key: bytes, part: list[bytes] | dict[bytes, bytes]) -> None:
        """Add a part of a collection to the key's entry (a restore of a collection split in parts)."""
        current = self.get(state, key_group, key)
        if isinstance(part, list):
            self.put(state, key_group, key, [*(current or []), *part])
        else:
            self.put(state, key_group, key, {**(current or {}), **part})

    @abstractmethod
    def entries(self, state: str, key_group: int) -> Iterator[tuple[bytes, Any]]:
        """Every ``(key, entry)`` of a state in a key group."""

    #: Whether :meth:`entries_after` is a cheap seek (stores kept in key order).
    ordered: bool = False

    def entries_after(
        self, state: str, key_group: int, after: bytes | None, limit: int
    ) -> list[tuple[bytes, Any]]:
        """Up to ``limit`` entries whose keys sort after ``after`` (``None``: from the first).

        Key order is the key's length, then its bytes (for keys of one length: their
        bytes). This default sorts every entry of the group; ordered stores seek.
        """
        keys = sorted(
            (len(key), key, entry)
            for key, entry in self.entries(state, key_group)
            if after is None or (len(key), key) > (len(after), after)
        )
        return [(key, entry) for _, key, entry in keys[:limit]]

    def drop_key_group(self, key_group: int) -> None:
        """Remove every entry of ``key_group`` (an incremental snapshot that replaces it whole)."""
        for state in self.states():
            for key, _ in list(self.entries(state, key_group)):
                self.delete(state, key_group, key)

    @abstractmethod
    def states(self) -> list[str]:
        """Names of the states holding entries."""

    @abstractmethod
    def clear(self) -> None:
        """Remove every entry (before a restore into a working copy that is not current)."""

    @abstractmethod
    def snapshot(self) -> dict[str, dict[int, dict[bytes, Any]]]:
        """A consistent view ``state -> key group -> {key: entry}`` that later changes do not touch."""

    def stored_rows(self) -> int:
        """Rows the store holds (Spark's ``numRowsTotal``): a key's entry in one state is one row.

        This default counts a :meth:`snapshot`; the shipped delegates count without reading entries.
        """
        return sum(len(group) for groups in self.snapshot().values() for group in groups.values())

    def stored_bytes(self) -> int | None:
        """Bytes the store's data takes (Spark's ``memoryUsedBytes``); ``None``: it cannot tell cheaply."""
        return None

    def view(self) -> StateView:
        """A consistent view to read section by section (by default over :meth:`snapshot`)."""
        return MappingView(self.snapshot())
