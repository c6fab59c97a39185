"""The keys changed since the last snapshot, in bounded memory (what an incremental snapshot holds)."""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from operator import le
from typing import Any

from ..delegate import StateView

__all__ = ["ChangedKeys", "ChangedKeysView"]


class ChangedKeys:
    """Changed ``(state, key group, key)``, exact up to ``limit`` keys, then whole key groups.

    Beyond ``limit`` tracked keys, the key groups with the most keys become *whole*:
    their keys are forgotten and an incremental snapshot holds each such group
    entirely, replacing it on restore. Memory stays bounded by ``limit`` whatever the
    state's size or how much of it changes; precision degrades by key group.

    The keys are kept as one set per key group and state, so a batch's keys go in by
    key group with a C-level ``set.update`` each (a Python step per key, or a tuple per
    key, cost more than the state's own write), and coarsening drops whole sets.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            msg = f"the changed-key limit must be positive, got {limit}"
            raise ValueError(msg)
        self.limit = limit
        self._tracked: dict[tuple[int, str], set[bytes]] = {}
        self._count = 0  # keys in all the sets
        self.whole: set[int] = set()

    def _keys(self, key_group: int, state: str) -> set[bytes]:
        keys = self._tracked.get((key_group, state))
        if keys is None:
            keys = self._tracked[(key_group, state)] = set()
        return keys

    def add(self, state: str, key_group: int, key: bytes) -> None:
        """Record one change (the hot path of the per-key API)."""
        if key_group in self.whole:
            return
        keys = self._keys(key_group, state)
        if key not in keys:
            keys.add(key)
            self._count += 1
            if self._count > self.limit:
                self._coarsen()

    def add_many(self, state: str, key_groups: Sequence[int], keys: Sequence[bytes]) -> None:
        """:meth:`add` for each key (the bulk write path); the limit is applied once, for all.

        When the batch could overflow the limit, the key groups to make whole are chosen
        first, from the tracked keys and the batch's own counts: a batch larger than the
        limit then never fills the sets only to be dropped again. Keys sorted by key
        group (a Spark batch's, in the store's order) go in a slice per group.
        """
        if len(key_groups) != len(keys):
            msg = f"{len(key_groups)} key groups for {len(keys)} keys"
            raise ValueError(msg)
        if not keys or (self.whole and self.whole.issuperset(key_groups)):  # e.g. nothing tracked by key
            return
        if self._count + len(keys) > self.limit:
            incoming = Counter(key_groups)
            for key_group in self.whole.intersection(incoming):
                del incoming[key_group]
            if not incoming:  # every key of the batch is in a whole group
                return
            self._coarsen(incoming)
        for key_group, part in _by_key_group(key_groups, keys):
            if key_group not in self.whole:
                tracked = self._keys(key_group, state)
                before = len(tracked)
                tracked.update(part)
                self._count += len(tracked) - before
        if self._count > self.limit:  # only when counts were not known up front (repeated keys)
            self._coarsen()

    def _counts(self) -> Counter[int]:
        counts: Counter[int] = Counter()
        for (key_group, _), keys in self._tracked.items():
            counts[key_group] += len(keys)
        return counts

    def _coarsen(self, incoming: Counter[int] | None = None) -> None:
        """Make the fullest key groups whole until half the limit is tracked (so this runs rarely).

        ``incoming`` counts keys about to be added, by key group (none of them whole):
        the groups are chosen as if they were tracked already.
        """
        counts = self._counts()
        if incoming:
            counts.update(incoming)
        left = counts.total()
        made_whole = set()
        for key_group, count in counts.most_common():
            if left <= self.limit // 2:
                break
            left -= count
            made_whole.add(key_group)
        if made_whole:
            self.make_whole(made_whole)

    def make_whole(self, key_groups: Iterable[int]) -> None:
        """Track ``key_groups`` whole from now on: their keys are forgotten, and not tracked one by one."""
        self.whole.update(key_groups)
        for where in [where for where in self._tracked if where[0] in self.whole]:
            self._count -= len(self._tracked.pop(where))

    def add_all(self, changes: Iterable[tuple[str, int, bytes]]) -> None:
        """Record several changes."""
        for state, key_group, key in changes:
            self.add(state, key_group, key)

    def update(self, other: ChangedKeys) -> None:
        """Take in ``other``'s changes (a failed snapshot hands its keys back)."""
        if not other.whole <= self.whole:
            self.make_whole(other.whole)
        for (key_group, state), keys in other._tracked.items():
            if key_group not in self.whole:
                tracked = self._keys(key_group, state)
                before = len(tracked)
                tracked.update(keys)
                self._count += len(tracked) - before
        if self._count > self.limit:
            self._coarsen()

    def __iter__(self) -> Iterator[tuple[str, int, bytes]]:
        """The tracked keys (not those of whole key groups)."""
        for (key_group, state), keys in self._tracked.items():
            for key in keys:
                yield state, key_group, key

    def by_state(self) -> dict[str, dict[int, list[bytes]]]:
        """The tracked keys by state, then key group (an incremental snapshot's order of work)."""
        grouped: dict[str, dict[int, list[bytes]]] = {}
        for (key_group, state), keys in self._tracked.items():
            if keys:
                grouped.setdefault(state, {})[key_group] = list(keys)
        return grouped

    def __len__(self) -> int:
        """How many keys are tracked one by one."""
        return self._count

    def __bool__(self) -> bool:
        """Whether anything changed."""
        return bool(self._count or self.whole)

    def keys_in(self, key_group: int) -> set[tuple[str, bytes]]:
        """``(state, key)`` tracked in ``key_group`` (empty for a whole one), for inspection."""
        tracked = self._tracked.items()
        return {(state, key) for (group, state), keys in tracked if group == key_group for key in keys}

    def estimate(self, keys_per_group: float) -> float:
        """The keys an incremental would hold, counting a whole key group as ``keys_per_group``."""
        return self._count + len(self.whole) * keys_per_group


def _by_key_group(key_groups: Sequence[int], keys: Sequence[bytes]) -> Iterator[tuple[int, Sequence[bytes]]]:
    """``(key group, its keys)``: slices when ``key_groups`` are sorted, else gathered key by key."""
    if all(map(le, key_groups, islice(key_groups, 1, None))):  # sorted: one slice per key group
        start = 0
        for key_group in sorted(set(key_groups)):
            end = bisect_right(key_groups, key_group, start)
            yield key_group, keys[start:end]
            start = end
        return
    gathered: dict[int, list[bytes]] = {}
    for key_group, key in zip(key_groups, keys, strict=True):
        part = gathered.get(key_group)
        if part is None:
            part = gathered[key_group] = []
        part.append(key)
    yield from gathered.items()


class ChangedKeysView(StateView):
    """The changed keys of a view, as it holds them; ``None`` is a tombstone (removed since).

    A key group whose keys were not tracked one by one (see :class:`ChangedKeys`)
    comes whole, and the snapshot says it replaces that group.

    :param owns: closing it closes ``view`` (not when a full snapshot shares that view).
    """

    def __init__(self, view: StateView, changed: ChangedKeys, *, owns: bool) -> None:
        self._hold(view, changed.by_state(), changed.whole, owns)

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
