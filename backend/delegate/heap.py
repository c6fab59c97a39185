"""Working state in process memory (dicts)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from .base import StateDelegate

__all__ = ["HeapDelegate"]


class HeapDelegate(StateDelegate):
    """``state -> key group -> key -> entry`` in dicts; fastest, lives in one process."""

    def __init__(self) -> None:
        self._data: dict[str, dict[int, dict[bytes, Any]]] = {}

    def _group(self, state: str, key_group: int) -> dict[bytes, Any] | None:
        """The entries of a state in a key group (no throwaway dicts: get runs on every state read)."""
        groups = self._data.get(state)
        return None if groups is None else groups.get(key_group)

    def get(self, state: str, key_group: int, key: bytes) -> Any | None:  # noqa: ANN401
        """The entry, or ``None``."""
        group = self._group(state, key_group)
        return None if group is None else group.get(key)

    def put(self, state: str, key_group: int, key: bytes, entry: Any) -> None:  # noqa: ANN401
        """Store ``entry``."""
        groups = self._data.get(state)  # get before setdefault: no throwaway dicts on the hot path
        if groups is None:
            groups = self._data[state] = {}
        group = groups.get(key_group)
        if group is None:
            group = groups[key_group] = {}
        group[key] = entry

    def write_batch(self, state: str, key_group: int, entries: Mapping[bytes, Any]) -> None:
        """One dict update; removals (``None`` entries) only when there are any (checked in C)."""
        groups = self._data.get(state)
        if groups is None:
            groups = self._data[state] = {}
        group = groups.get(key_group)
        if group is None:
            group = groups[key_group] = {}
        group.update(entries)
        if None in entries.values():
            for key, entry in entries.items():
                if entry is None:
                    del group[key]

    def delete(self, state: str, key_group: int, key: bytes) -> None:
        """Remove the entry."""
        group = self._group(state, key_group)
        if group is not None:
            group.pop(key, None)

    def entries(self, state: str, key_group: int) -> Iterator[tuple[bytes, Any]]:
        """Every entry of a state in a key group (a copy: safe to mutate meanwhile)."""
        return iter(list(self._data.get(state, {}).get(key_group, {}).items()))

    def states(self) -> list[str]:
        """Names of the states holding entries."""
        return sorted(self._data)

    def clear(self) -> None:
        """Remove every entry."""
        self._data.clear()

    def snapshot(self) -> dict[str, dict[int, dict[bytes, Any]]]:
        """Shallow copies suffice: entries are replaced on change, never mutated in place."""
        return {
            state: {kg: dict(group) for kg, group in groups.items()} for state, groups in self._data.items()
        }
