"""The working-state store behind the changelog layer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["StateDelegate"]


class StateDelegate(ABC):
    """Entries by (state name, key group, key bytes).

    An entry is the stored form of one key's state: ``bytes`` for value state,
    ``list[bytes]`` for list state, ``dict[bytes, bytes]`` for map state. The
    changelog layer is the only writer; delegates apply what it tells them.
    """

    @abstractmethod
    def get(self, state: str, key_group: int, key: bytes) -> Any | None:  # noqa: ANN401 - entry
        """The entry, or ``None``."""

    @abstractmethod
    def put(self, state: str, key_group: int, key: bytes, entry: Any) -> None:  # noqa: ANN401
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

    @abstractmethod
    def entries(self, state: str, key_group: int) -> Iterator[tuple[bytes, Any]]:
        """Every ``(key, entry)`` of a state in a key group."""

    @abstractmethod
    def states(self) -> list[str]:
        """Names of the states holding entries."""

    @abstractmethod
    def clear(self) -> None:
        """Remove every entry (before a restore into a working copy that is not current)."""

    @abstractmethod
    def snapshot(self) -> dict[str, dict[int, dict[bytes, Any]]]:
        """A consistent view ``state -> key group -> {key: entry}`` that later changes do not touch."""
