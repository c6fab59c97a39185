"""Working state in process memory (dicts)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

from .base import MappingView, StateDelegate

__all__ = ["HeapDelegate"]


class HeapDelegate(StateDelegate):
    """``state -> key group -> key -> entry`` in dicts; fastest, lives in one process.

    Views are copy-on-write per key group (as Flink's copy-on-write state map, by
    key group): taking one marks every key group's dict shared, and the first
    write to a shared dict replaces it with a copy, so a view costs O(key groups)
    and a materialization copies only the groups written while it runs.
    """

    def __init__(self) -> None:
        self._data: dict[str, dict[int, dict[bytes, Any]]] = {}
        self._shared: set[int] = set()  # ids of group dicts an open view may still read
        self._open_views = 0
        self._views_lock = threading.Lock()

    def _group(self, state: str, key_group: int) -> dict[bytes, Any] | None:
        """The entries of a state in a key group (no throwaway dicts: get runs on every state read)."""
        groups = self._data.get(state)
        return None if groups is None else groups.get(key_group)

    def get(self, state: str, key_group: int, key: bytes) -> Any | None:  # noqa: ANN401
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

    def put(self, state: str, key_group: int, key: bytes, entry: Any) -> None:  # noqa: ANN401
        """Store ``entry``."""
        self._writable(state, key_group)[key] = entry

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

    def states(self) -> list[str]:
        """Names of the states holding entries."""
        return sorted(self._data)

    def clear(self) -> None:
        """Remove every entry (an open view keeps the dicts it shares)."""
        self._data = {}

    def snapshot(self) -> dict[str, dict[int, dict[bytes, Any]]]:
        """Shallow copies suffice: entries are replaced on change, never mutated in place."""
        return {
            state: {kg: dict(group) for kg, group in groups.items()} for state, groups in self._data.items()
        }

    def view(self) -> MappingView:
        """A copy-on-write view: the group dicts as they are now, copied by the next write to each."""
        with self._views_lock:
            frozen = {state: dict(groups) for state, groups in self._data.items()}
            self._shared.update(id(group) for groups in frozen.values() for group in groups.values())
            self._open_views += 1
        return MappingView(frozen, on_close=self._view_closed)

    def _view_closed(self) -> None:
        with self._views_lock:
            self._open_views -= 1
            if self._open_views == 0:
                self._shared.clear()  # nobody reads the shared dicts any more: write them in place
