"""Working state in process memory (dicts)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

from .base import MappingView, StateDelegate

__all__ = ["HeapDelegate"]


class HeapDelegate(StateDelegate):
    """``state -> key group -> key -> entry`` in dicts; fastest, lives in one process.

    Lists and maps are changed in place, an element at a time, so an append or a
    map put costs the same whatever the collection's size.

    Views are copy-on-write per key group and per collection (as Flink's
    copy-on-write state map): taking one marks every key group's dict shared, and
    the first write to a shared dict replaces it with a copy; a collection that
    an open view may read is copied before its first change in place. A view
    costs O(key groups), and a materialization copies only what changes while
    it runs.
    """

    def __init__(self) -> None:
        self._data: dict[str, dict[int, dict[bytes, Any]]] = {}
        self._shared: set[int] = set()  # ids of group dicts an open view may still read
        # Ids of collections created or copied since the newest view was taken: no view reads
        # them, so they change in place (every other collection is copied first while a view is open).
        self._owned: set[int] = set()
        self._open_views = 0
        self._views_lock = threading.Lock()

    def _group(self, state: str, key_group: int) -> dict[bytes, Any] | None:
        """The entries of a state in a key group (no throwaway dicts: get runs on every state read)."""
        groups = self._data.get(state)
        return None if groups is None else groups.get(key_group)

    def get(self, state: str, key_group: int, key: bytes) -> Any | None:
        """The entry, or ``None``."""
        group = self._group(state, key_group)
        return None if group is None else group.get(key)

    def _writable(self, state: str, key_group: int) -> dict[bytes, Any]:
        """The group's dict, created when new and copied first when a view shares it."""
        groups = self._data.get(state)  # get before setdefault: no throwaway dicts on the hot path
        if groups is None:
            groups = self._data[state] = {}
        group = groups.get(key_group)
        if group is None:
            group = groups[key_group] = {}
        elif self._shared and id(group) in self._shared:
            self._shared.discard(id(group))
            group = groups[key_group] = dict(group)
        return group

    def put(self, state: str, key_group: int, key: bytes, entry: Any) -> None:
        """Store ``entry``."""
        self._writable(state, key_group)[key] = entry

    def _in_place(self, group: dict[bytes, Any], key: bytes) -> Any | None:
        """The key's collection, safe to change in place (copied first when an open view may read it)."""
        entry = group.get(key)
        if entry is not None and self._open_views and id(entry) not in self._owned:
            entry = group[key] = entry.copy()
            self._owned.add(id(entry))
        return entry

    def _created(self, group: dict[bytes, Any], key: bytes, entry: Any) -> None:
        group[key] = entry
        if self._open_views:
            self._owned.add(id(entry))

    def append(self, state: str, key_group: int, key: bytes, element: bytes) -> None:
        """Append in place (O(1))."""
        group = self._writable(state, key_group)
        entry = self._in_place(group, key)
        if entry is None:
            self._created(group, key, [element])
        else:
            entry.append(element)

    def extend(self, state: str, key_group: int, key: bytes, part: list[bytes] | dict[bytes, bytes]) -> None:
        """Extend or update in place (O(len(part)))."""
        group = self._writable(state, key_group)
        entry = self._in_place(group, key)
        if entry is None:
            self._created(group, key, part.copy())
        elif isinstance(entry, list):
            entry.extend(part)
        else:
            entry.update(part)

    def map_get(self, state: str, key_group: int, key: bytes, map_key: bytes) -> bytes | None:
        """One dict lookup."""
        group = self._group(state, key_group)
        entry = None if group is None else group.get(key)
        return None if entry is None else entry.get(map_key)

    def map_put(self, state: str, key_group: int, key: bytes, map_key: bytes, value: bytes) -> None:
        """Set in place (O(1))."""
        group = self._writable(state, key_group)
        entry = self._in_place(group, key)
        if entry is None:
            self._created(group, key, {map_key: value})
        else:
            entry[map_key] = value

    def map_remove(self, state: str, key_group: int, key: bytes, map_key: bytes) -> None:
        """Remove in place (O(1)); an emptied map removes the key."""
        if self.map_get(state, key_group, key, map_key) is None:
            return
        group = self._writable(state, key_group)
        entry = self._in_place(group, key)
        if entry is None:
            return
        del entry[map_key]
        if not entry:
            del group[key]

    def map_items(self, state: str, key_group: int, key: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The map's items over a copy of its keys only (a pointer each), so the map may change meanwhile."""
        group = self._group(state, key_group)
        entry = None if group is None else group.get(key)
        if not entry:
            return iter(())
        return _items_of_keys(entry, list(entry))

    def write_batch(self, state: str, key_group: int, entries: Mapping[bytes, Any]) -> None:
        """One dict update; removals (``None`` entries) only when there are any (checked in C)."""
        group = self._writable(state, key_group)
        group.update(entries)
        if None in entries.values():
            for key, entry in entries.items():
                if entry is None:
                    del group[key]

    def delete(self, state: str, key_group: int, key: bytes) -> None:
        """Remove the entry."""
        group = self._group(state, key_group)
        if group is not None and key in group:
            del self._writable(state, key_group)[key]

    def entries(self, state: str, key_group: int) -> Iterator[tuple[bytes, Any]]:
        """Every entry of a state in a key group (a copy: safe to mutate meanwhile)."""
        return iter(list(self._data.get(state, {}).get(key_group, {}).items()))

    def drop_key_group(self, key_group: int) -> None:
        """Drop the group's dicts (a view keeps its own references)."""
        for groups in self._data.values():
            groups.pop(key_group, None)

    def states(self) -> list[str]:
        """Names of the states holding entries."""
        return sorted(self._data)

    def stored_rows(self) -> int:
        """Keys per state, summed: O(states x key groups)."""
        return sum(len(group) for groups in self._data.values() for group in groups.values())

    def clear(self) -> None:
        """Remove every entry (an open view keeps the dicts it shares)."""
        self._data = {}

    def snapshot(self) -> dict[str, dict[int, dict[bytes, Any]]]:
        """A copy: collections too, since they change in place."""
        return {
            state: {
                kg: {key: entry if type(entry) is bytes else entry.copy() for key, entry in group.items()}
                for kg, group in groups.items()
            }
            for state, groups in self._data.items()
        }

    def view(self) -> MappingView:
        """A copy-on-write view: the group dicts as they are now, copied by the next write to each."""
        with self._views_lock:
            frozen = {state: dict(groups) for state, groups in self._data.items()}
            self._shared.update(id(group) for groups in frozen.values() for group in groups.values())
            self._owned.clear()  # every collection is now one the new view may read
            self._open_views += 1
        return MappingView(frozen, on_close=self._view_closed)

    def _view_closed(self) -> None:
        with self._views_lock:
            self._open_views -= 1
            if self._open_views == 0:
                self._shared.clear()  # nobody reads the shared dicts any more: write them in place
                self._owned.clear()


def _items_of_keys(entry: dict[bytes, bytes], keys: list[bytes]) -> Iterator[tuple[bytes, bytes]]:
    """``entry``'s items of ``keys`` still present: the caller may change the map while it iterates."""
    for key in keys:
        value = entry.get(key)
        if value is not None:
            yield key, value
