"""The states of one backend: registered in this run, or known from the checkpoint it continues."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from dstl.spi import ConfigError

from ..delegate import StateDelegate
from ..keyed import (
    RESERVED_PREFIX,
    TTL_SUFFIX,
    KeyedContext,
    ListState,
    MapState,
    ReducingState,
    StateDescriptor,
    StateKind,
    ValueState,
)
from ..serialization import Serializer
from .records import encode_registration

__all__ = ["StateRegistry"]

_STATE_CLASSES = {
    StateKind.VALUE: ValueState,
    StateKind.LIST: ListState,
    StateKind.MAP: MapState,
    StateKind.REDUCING: ReducingState,
}


def _never_called(_a: Any, _b: Any) -> Any:
    msg = "a reducing state known only from the checkpoint cannot be added to: register it with its function"
    raise AssertionError(msg)


class StateRegistry:
    """Registration rules and the log's registration records of one backend's states.

    :param context: what the states are bound to (the backend).
    :param append_meta: appends a registration record to the log.
    :param serializers: the value serializer of a serializer name.
    """

    def __init__(
        self,
        context: KeyedContext,
        append_meta: Callable[[bytes], None],
        serializers: Callable[[str], Serializer],
    ) -> None:
        self._context = context
        self._append_meta = append_meta
        self._serializers = serializers
        self._states: dict[str, Any] = {}
        self._provisional: set[str] = set()  # registered by known(), not by the caller
        #: ``name -> (kind, stored format)`` of the states of the checkpoint continued from.
        self.restored: dict[str, tuple[str, str]] = {}

    def register(self, descriptor: StateDescriptor) -> Any:
        """Register (or return) a user's state; reserved names are refused."""
        if descriptor.name.startswith(RESERVED_PREFIX):
            msg = f"state names starting with {RESERVED_PREFIX!r} are dstl's own: rename {descriptor.name!r}"
            raise ConfigError(msg)
        return self._register(descriptor)

    def register_internal(self, descriptor: StateDescriptor) -> Any:
        """Register one of dstl's own states: only reserved names."""
        if not descriptor.name.startswith(RESERVED_PREFIX):
            msg = f"dstl's own state names start with {RESERVED_PREFIX!r}, not {descriptor.name!r}"
            raise ValueError(msg)
        return self._register(descriptor)

    def _register(self, descriptor: StateDescriptor) -> Any:
        existing = self._states.get(descriptor.name)
        form = (descriptor.kind, descriptor.stored_format)
        if existing is not None:
            if (existing.descriptor.kind, existing.descriptor.stored_format) != form:
                msg = f"state {descriptor.name!r} is already registered as {existing.descriptor.kind.value}"
                raise ConfigError(msg)
            if descriptor.name not in self._provisional:
                return existing
            # the caller's descriptor (its TTL, its reduce function) replaces the provisional one
            self._provisional.discard(descriptor.name)
            return self._bind(existing.state_id, descriptor)
        restored = self.restored.get(descriptor.name)
        if restored is not None and restored != (descriptor.kind.value, descriptor.stored_format):
            msg = (
                f"state {descriptor.name!r} was checkpointed as {restored[0]} state with serializer "
                f"{restored[1]!r}; it cannot be restored as {descriptor.kind.value} "
                f"with {descriptor.stored_format!r} (a '+ttl' suffix means TTL was on)"
            )
            raise ConfigError(msg)
        if descriptor.kind is StateKind.REDUCING and descriptor.reduce is None:
            msg = f"reducing state {descriptor.name!r} needs a reduce function"
            raise ConfigError(msg)
        state_id = len(self._states)
        self._append_meta(
            encode_registration(state_id, descriptor.name, descriptor.kind.value, descriptor.stored_format)
        )
        return self._bind(state_id, descriptor)

    def _bind(self, state_id: int, descriptor: StateDescriptor) -> Any:
        state = _STATE_CLASSES[descriptor.kind](
            self._context, state_id, descriptor, self._serializers(descriptor.serializer)
        )
        self._states[descriptor.name] = state
        return state

    def known(self, name: str) -> Any | None:
        """State ``name`` as registered in this run, or else provisionally as the checkpoint knows it.

        With TTL, a provisional state is unbounded (its length is not recorded, so
        nothing it holds is taken for expired); reducing, it cannot be added to.
        """
        state = self._states.get(name)
        if state is not None:
            return state
        known = self.restored.get(name)
        if known is None:
            return None
        kind, stored = known
        serializer, ttl_marked, _ = stored.partition(TTL_SUFFIX)
        self._provisional.add(name)
        return self._register(
            StateDescriptor(
                name,
                StateKind(kind),
                serializer,
                reduce=_never_called if kind == StateKind.REDUCING.value else None,
                ttl=math.inf if ttl_marked else None,
            )
        )

    def get(self, name: str) -> Any | None:
        """State ``name`` if registered in this run."""
        return self._states.get(name)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._states.values())

    def restored_state(self, name: str, kind: str, stored_format: str) -> None:
        """A registration found in the checkpoint (replay's and snapshot loading's callback)."""
        self.restored[name] = (kind, stored_format)

    def log_registrations(self) -> None:
        """Log every registration again (the log after a snapshot describes its states by itself)."""
        for state in self._states.values():
            spec = state.descriptor
            self._append_meta(
                encode_registration(state.state_id, spec.name, spec.kind.value, spec.stored_format)
            )

    def registrations(self) -> dict[str, tuple[str, str]]:
        """``name -> (kind, stored format)`` of every state known (registered or restored)."""
        known = dict(self.restored)
        for name, state in self._states.items():
            known[name] = (state.descriptor.kind.value, state.descriptor.stored_format)
        return known

    def drop(
        self,
        name: str,
        delegate: StateDelegate,
        bound_to: Callable[[int, bytes], AbstractContextManager[None]],
    ) -> int:
        """Clear state ``name`` of every key that holds it, each clear logged; returns the keys cleared.

        :raises ConfigError: for dstl's own (reserved) names.
        """
        if name.startswith(RESERVED_PREFIX):
            msg = f"state {name!r} is dstl's own and cannot be deleted"
            raise ConfigError(msg)
        state = self.known(name)
        if state is None:
            return 0
        cleared = 0
        for key_group in self._context.key_groups:
            for raw_key in [raw for raw, _ in delegate.entries(name, key_group)]:
                with bound_to(key_group, raw_key):
                    state.clear()
                cleared += 1
        return cleared

    def ttl_states(self) -> dict[str, tuple[str, float]]:
        """``name -> (kind, ttl seconds)`` of the registered states with TTL."""
        return {
            name: (state.descriptor.kind.value, state.descriptor.ttl)
            for name, state in self._states.items()
            if state.descriptor.ttl is not None
        }
