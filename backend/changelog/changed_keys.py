"""The keys changed since the last snapshot, in bounded memory (what an incremental snapshot holds)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from itertools import compress, repeat
from operator import itemgetter
from typing import Any

from ..delegate import StateView

__all__ = ["ChangedKeys", "ChangedKeysView"]


class ChangedKeys:
    """Changed ``(state, key group, key)``, exact up to ``limit`` keys, then whole key groups.

    Beyond ``limit`` tracked keys, the key groups with the most keys become *whole*:
    their keys are forgotten and an incremental snapshot holds each such group
    entirely, replacing it on restore. Memory stays bounded by ``limit`` whatever the
    state's size or how much of it changes; precision degrades by key group.

    The keys are one flat set of ``(key group, state, key)``, so a batch's keys go in
    with one C-level ``set.update`` (a Python loop per key cost more than the state's
    own write); coarsening, which needs them by key group, is rare.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            msg = f"the changed-key limit must be positive, got {limit}"
            raise ValueError(msg)
        self.limit = limit
        self._tracked: set[tuple[int, str, bytes]] = set()
        self.whole: set[int] = set()

    def add(self, state: str, key_group: int, key: bytes) -> None:
        """Record one change (the hot path of the per-key API)."""
        if key_group in self.whole:
            return
        self._tracked.add((key_group, state, key))
        if len(self._tracked) > self.limit:
            self._coarsen()

    def add_many(self, state: str, key_groups: Sequence[int], keys: Sequence[bytes]) -> None:
        """:meth:`add` for each key (the bulk write path); the limit is applied once, for all.

        When the batch could overflow the limit, the key groups to make whole are chosen
        first, from the tracked keys and the batch's own counts: a batch larger than the
        limit then never fills the set only to be filtered again (which cost more than
        the state's own write, every batch).
        """
        if len(key_groups) != len(keys):
            msg = f"{len(key_groups)} key groups for {len(keys)} keys"
            raise ValueError(msg)
        if self.whole and self.whole.issuperset(key_groups):  # e.g. nothing is tracked one by one
            return
        if len(self._tracked) + len(keys) > self.limit:
            incoming = Counter(key_groups)
            for key_group in self.whole.intersection(incoming):
                del incoming[key_group]
            if not incoming:  # every key of the batch is in a whole group
                return
            self._coarsen(incoming)
        if self.whole and not self.whole.isdisjoint(key_groups):
            tracked_groups = set(key_groups) - self.whole
            kept = list(map(tracked_groups.__contains__, key_groups))  # a tuple only for a kept key
            key_groups, keys = list(compress(key_groups, kept)), list(compress(keys, kept))
        self._tracked.update(zip(key_groups, repeat(state), keys))
        if len(self._tracked) > self.limit:  # only when counts were not known up front
            self._coarsen()

    def _coarsen(self, incoming: Counter[int] | None = None) -> None:
        """Make the fullest key groups whole until half the limit is tracked (so this runs rarely).

        ``incoming`` counts keys about to be added, by key group (none of them whole):
        the groups are chosen as if they were tracked already.
        """
        counts = Counter(map(itemgetter(0), self._tracked))
        if incoming:
            counts.update(incoming)
        left = counts.total()
        made_whole = set()
        for key_group, count in counts.most_common():
            if left <= self.limit // 2:
                break
            left -= count
            made_whole.add(key_group)
        if not made_whole:
            return
        self.whole |= made_whole
        self._tracked = {change for change in self._tracked if change[0] not in made_whole}

    def make_whole(self, key_groups: Iterable[int]) -> None:
        """Track ``key_groups`` whole from now on: their keys are forgotten, and not tracked one by one."""
        self.whole.update(key_groups)
        self._tracked = {change for change in self._tracked if change[0] not in self.whole}

    def add_all(self, changes: Iterable[tuple[str, int, bytes]]) -> None:
        """Record several changes."""
        for state, key_group, key in changes:
            self.add(state, key_group, key)

    def update(self, other: ChangedKeys) -> None:
        """Take in ``other``'s changes (a failed snapshot hands its keys back)."""
        if not other.whole <= self.whole:
            self.whole |= other.whole
            self._tracked = {change for change in self._tracked if change[0] not in self.whole}
        whole = self.whole
        self._tracked.update(change for change in other._tracked if change[0] not in whole)
        if len(self._tracked) > self.limit:
            self._coarsen()

    def __iter__(self) -> Iterator[tuple[str, int, bytes]]:
        """The tracked keys (not those of whole key groups)."""
        for key_group, state, key in self._tracked:
            yield state, key_group, key

    def __len__(self) -> int:
        """How many keys are tracked one by one."""
        return len(self._tracked)

    def __bool__(self) -> bool:
        """Whether anything changed."""
        return bool(self._tracked or self.whole)

    def keys_in(self, key_group: int) -> set[tuple[str, bytes]]:
        """``(state, key)`` tracked in ``key_group`` (empty for a whole one): a scan, for inspection."""
        return {(state, key) for group, state, key in self._tracked if group == key_group}

    def estimate(self, keys_per_group: float) -> float:
        """The keys an incremental would hold, counting a whole key group as ``keys_per_group``."""
        return len(self._tracked) + len(self.whole) * keys_per_group


class ChangedKeysView(StateView):
    """The changed keys of a view, as it holds them; ``None`` is a tombstone (removed since).

    A key group whose keys were not tracked one by one (see :class:`ChangedKeys`)
    comes whole, and the snapshot says it replaces that group.

    :param owns: closing it closes ``view`` (not when a full snapshot shares that view).
    """

    def __init__(self, view: StateView, changed: ChangedKeys, *, owns: bool) -> None:
        by_state: dict[str, dict[int, list[bytes]]] = {}
        for state, key_group, key in changed:
            by_state.setdefault(state, {}).setdefault(key_group, []).append(key)
        self._hold(view, by_state, changed.whole, owns)

    def _hold(
        self, view: StateView, by_state: dict[str, dict[int, list[bytes]]], whole: Iterable[int], owns: bool
    ) -> None:
        self._view = view
        self._owns = owns
        self._whole = frozenset(whole)
        #: key groups held entirely: a restore drops what it had of them first
        self.replaced_key_groups = sorted(self._whole)
        self._by_state = by_state

    def changes(self) -> dict[str, Any]:
        """The changed keys as plain data, for :meth:`over` in another process (msgpack encodes it)."""
        return {"whole": self.replaced_key_groups, "keys": self._by_state}

    @classmethod
    def over(cls, view: StateView, changes: dict[str, Any]) -> ChangedKeysView:
        """The view of :meth:`changes` in ``view`` (the same copy, opened by another process); owns it."""
        self = cls.__new__(cls)
        self._hold(view, changes["keys"], changes["whole"], owns=True)
        return self

    def state_names(self) -> list[str]:
        """The states with changed keys (every state of the view when a key group is whole)."""
        names = set(self._by_state)
        if self.replaced_key_groups:
            names.update(self._view.state_names())
        return sorted(names)

    def entries(self, state: str, key_group: int) -> Iterator[tuple[bytes, Any]]:
        """Each changed key of the state and key group with its entry in the view."""
        if key_group in self._whole:
            yield from self._view.entries(state, key_group)
            return
        get = self._view.get
        for key in self._by_state.get(state, {}).get(key_group, ()):
            yield key, get(state, key_group, key)

    def get(self, state: str, key_group: int, key: bytes) -> Any | None:
        """The underlying view's entry."""
        return self._view.get(state, key_group, key)

    def chunks(self, state: str, key_group: int) -> Iterator[tuple[bytes, Any, bool]]:
        """The changed keys' parts, streamed by the underlying view."""
        if key_group in self._whole:
            yield from self._view.chunks(state, key_group)
            return
        for key in self._by_state.get(state, {}).get(key_group, ()):
            yield from self._view.key_chunks(state, key_group, key)

    def hand_over_copy(self) -> str | None:
        """The underlying view's copy (the changed keys are read from it)."""
        return self._view.hand_over_copy()

    def close(self) -> None:
        """Close the underlying view when it is this view's own."""
        if self._owns:
            self._view.close()
