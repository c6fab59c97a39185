"""The working-state store behind the changelog layer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

__all__ = ["SECTION_ENTRIES", "MappingView", "StateDelegate", "StateView"]

#: The most entries in one section: a key group with more spans consecutive sections, so
#: a materialization holds this many entries at a time whatever the state's size.
SECTION_ENTRIES = 4096


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

    def sections(self, key_groups: Iterable[int]) -> Iterator[tuple[int, list[list[Any]]]]:
        """``(key group, [[state, key, entry], ...])`` of ``key_groups``, ascending, empty ones left out.

        A key group with more than :data:`SECTION_ENTRIES` entries comes as several
        consecutive sections.
        """
        states = self.state_names()
        for key_group in sorted(key_groups):
            section: list[list[Any]] = []
            for state in states:
                for key, entry in self.entries(state, key_group):
                    section.append([state, key, entry])
                    if len(section) == SECTION_ENTRIES:
                        yield key_group, section
                        section = []
            if section:
                yield key_group, section

    def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release the view."""

    def __enter__(self) -> StateView:
        """Return the view itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Release the view."""
        self.close()


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

    def view(self) -> StateView:
        """A consistent view to read section by section (by default over :meth:`snapshot`)."""
        return MappingView(self.snapshot())
