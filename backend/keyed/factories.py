"""Typed shortcuts to register each kind of state, for any holder of states with a ``register``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .state import ListState, MapState, ReducingState, StateDescriptor, StateKind, ValueState

__all__ = ["StateFactories"]


class StateFactories:
    """``value_state``, ``list_state``, ``map_state`` and ``reducing_state`` over :meth:`register`."""

    def register(self, descriptor: StateDescriptor) -> Any:
        """Register (or return) the state ``descriptor`` describes (implemented by the holder)."""
        raise NotImplementedError

    def value_state(self, name: str, serializer: str = "msgpack", *, ttl: float | None = None) -> ValueState:
        """A :class:`ValueState` (``ttl``: seconds after a write at which the value expires)."""
        return self.register(StateDescriptor(name, StateKind.VALUE, serializer, ttl=ttl))

    def list_state(self, name: str, serializer: str = "msgpack", *, ttl: float | None = None) -> ListState:
        """A :class:`ListState` (with ``ttl`` each element expires on its own)."""
        return self.register(StateDescriptor(name, StateKind.LIST, serializer, ttl=ttl))

    def map_state(self, name: str, serializer: str = "msgpack", *, ttl: float | None = None) -> MapState:
        """A :class:`MapState` (with ``ttl`` each entry expires on its own)."""
        return self.register(StateDescriptor(name, StateKind.MAP, serializer, ttl=ttl))

    def reducing_state(
        self,
        name: str,
        reduce: Callable[[Any, Any], Any],
        serializer: str = "msgpack",
        *,
        ttl: float | None = None,
    ) -> ReducingState:
        """A :class:`ReducingState` folding with ``reduce`` (an expired value restarts the fold)."""
        return self.register(StateDescriptor(name, StateKind.REDUCING, serializer, reduce, ttl=ttl))
