"""Expired keys a full snapshot found, removed from the working state a budget per checkpoint."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dstl.spi import KeyGroupRange

__all__ = ["ExpiryQueue"]

#: ``(state name, key group, stored key)`` of one expired entry.
Expired = tuple[str, int, bytes]


class ExpiryQueue:
    """The queue of expired entries, and how many are taken per checkpoint.

    A mass expiry does not stall one batch: at most ``per_checkpoint`` keys are
    taken at a time (each is checked again when removed: a write may have revived it).
    """

    def __init__(self, per_checkpoint: int) -> None:
        self.per_checkpoint = per_checkpoint
        self._queue: collections.deque[Expired] = collections.deque()

    def replace(self, found: Iterable[Expired]) -> None:
        """The newest findings replace older ones (what is still expired is found again)."""
        self._queue = collections.deque(found)

    def take(self) -> list[Expired]:
        """The next entries within the budget."""
        queue = self._queue
        return [queue.popleft() for _ in range(min(len(queue), self.per_checkpoint))]

    def remove_due(
        self,
        found: list[Expired],
        state_of: Callable[[str], Any | None],
        bound_to: Callable[[int, bytes], AbstractContextManager[None]],
        key_groups: KeyGroupRange,
    ) -> None:
        """Take ``found`` (a full snapshot's newest findings, if any), then remove the budget's share.

        Each key is checked again by its state: a write since made it live. A state
        not registered in this run is skipped (the next full snapshot leaves it out again).
        """
        if found:
            self.replace(found)
        for name, key_group, key in self.take():
            state = state_of(name)
            if state is None or state.descriptor.ttl is None or key_group not in key_groups:
                continue
            with bound_to(key_group, key):
                state.remove_expired()

    def pending(self) -> list[Expired]:
        """Entries the budget has not reached yet."""
        return list(self._queue)
