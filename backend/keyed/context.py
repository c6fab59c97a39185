"""What keyed states and timers need from the backend that holds them: a small protocol.

States and timers depend on this, never on the backend's internals, so the
changelog backend (or a test double) is one implementation among others.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from dstl.spi import KeyGroupRange

    from ..delegate import StateDelegate
    from .ops import Op
    from .state import KeySet, StateDescriptor

__all__ = ["KeyedContext"]


class KeyedContext(Protocol):
    """The current key, the working state, and the log of changes, as states see them."""

    #: The working state the states read (writes go through :meth:`log_change`).
    delegate: StateDelegate

    @property
    def key_groups(self) -> KeyGroupRange:
        """The key groups this context holds."""
        ...

    def clock(self) -> float:
        """Wall-clock seconds of state TTL."""
        ...

    def set_current_key(self, key: object) -> None:
        """Bind state access to ``key``."""
        ...

    def current_key(self) -> tuple[int, bytes]:
        """``(key group, stored key bytes)`` of the bound key; ``RuntimeError`` when none is."""
        ...

    def bound_to(self, key_group: int, key: bytes) -> AbstractContextManager[None]:
        """Bind a key by its stored bytes for a block."""
        ...

    def key_set(self, keys: Iterable[Any]) -> KeySet:
        """Bind ``keys`` once for bulk access."""
        ...

    def log_change(self, op: Op, state_id: int, state: str, *args: Any) -> None:
        """Apply ``op`` to the bound key's entry of ``state``, then log it."""
        ...

    def log_changes(
        self, op: Op, state_id: int, state: str, keys: KeySet, args: Iterable[tuple[Any, ...]]
    ) -> None:
        """:meth:`log_change` for each key of ``keys`` with its arguments."""
        ...

    def log_values(self, state_id: int, state: str, keys: KeySet, values: Sequence[bytes]) -> None:
        """Set the stored value of each key of ``keys`` (each once) in ``state``, then log it: bulk puts."""
        ...

    def count_expired(self, entries: int) -> None:
        """A state removed ``entries`` expired values or elements (a metric)."""
        ...

    def register_internal(self, descriptor: StateDescriptor) -> Any:
        """Register one of dstl's own states (a reserved name, e.g. timers')."""
        ...
