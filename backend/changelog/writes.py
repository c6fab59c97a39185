"""The write path: a change goes to the working state first, then to the log (replaced ones squashed)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import Any, Protocol

from dstl.spi import StateChangelogWriter

from ..delegate import StateDelegate
from ..keyed import REPLACING, KeySet, Op
from .records import encode_change, encode_value_puts
from .replay import apply_change

__all__ = ["ChangeTracker", "ChangeWriter"]

#: Changes that remove: Spark counts them in ``numRowsRemoved``, every other one in ``numRowsUpdated``.
_REMOVING = frozenset({Op.CLEAR, Op.MAP_REMOVE})


class ChangeTracker(Protocol):
    """Told of every changed ``(state, key group, key)``: what an incremental snapshot holds."""

    def changed(self, state: str, key_group: int, key: bytes) -> None:
        """One key changed or was removed."""
        ...

    def changed_many(self, state: str, key_groups: Sequence[int], keys: Sequence[bytes]) -> None:
        """Many keys changed at once (the bulk write path)."""
        ...


class ChangeWriter:
    """Applies changes to ``delegate`` and appends their records to ``writer``.

    :param tracker: told of every changed key (incremental snapshots).
    :param squash: a change that replaces a key's entry waits until the next flush or
        non-replacing change of that entry; a newer one replaces it in the log.
    """

    def __init__(
        self,
        delegate: StateDelegate,
        writer: StateChangelogWriter,
        tracker: ChangeTracker,
        *,
        squash: bool,
    ) -> None:
        self._delegate = delegate
        self._writer = writer
        self._changed = tracker.changed
        self._changed_many = tracker.changed_many
        self._squash = squash
        self._pending: dict[tuple[int, int, bytes], bytes] = {}
        #: changes applied so far that update and that remove (see :meth:`take_counts`)
        self._updated = 0
        self._removed = 0

    def take_counts(self) -> tuple[int, int]:
        """``(updates, removals)`` applied since the previous call."""
        counts = (self._updated, self._removed)
        self._updated = self._removed = 0
        return counts

    def apply(
        self, op: Op, state_id: int, state: str, key_group: int, key: bytes, args: tuple[Any, ...]
    ) -> None:
        """One change of one key's entry."""
        record = encode_change(op, state_id, key, *args)
        if op in _REMOVING:
            self._removed += 1
        else:
            self._updated += 1
        # The working state first: a write it refuses (a full disk) must not be in the log either.
        apply_change(self._delegate, state, key_group, key, op, list(args))
        self._log(op, state_id, key_group, key, record)
        self._changed(state, key_group, key)

    def apply_many(
        self, op: Op, state_id: int, state: str, keys: KeySet, args: Iterable[tuple[Any, ...]]
    ) -> None:
        """:meth:`apply` for each key with its arguments (value puts in bulk: :meth:`put_values`).

        Each change is logged only once the working state took it.
        """
        log, changed, delegate = self._log, self._changed, self._delegate
        if op in _REMOVING:
            self._removed += len(keys.raw)
        else:
            self._updated += len(keys.raw)
        for key_group, key, key_args in zip(keys.groups, keys.raw, args, strict=True):
            record = encode_change(op, state_id, key, *key_args)
            apply_change(delegate, state, key_group, key, op, list(key_args))
            log(op, state_id, key_group, key, record)
            changed(state, key_group, key)

    def put_values(self, state_id: int, state: str, keys: KeySet, values: Sequence[bytes]) -> None:
        """Set a stored value per key (each key once), the working state in one write, then the log.

        The value state's bulk path: records encoded with one packer, the delegate's
        one-transaction write, squashed records queued at once. A write the delegate
        refuses leaves neither state nor log changed.
        """
        groups, raw = keys.groups, keys.raw
        records = encode_value_puts(state_id, raw, values)
        self._delegate.put_values(state, groups, raw, values)
        self._updated += len(raw)
        if self._squash:  # a value put replaces: as _log does for each, it waits for the flush
            entries = zip(groups, repeat(state_id), raw)  # repeat is endless: zip stops with the keys
            self._pending.update(zip(entries, records, strict=True))
        else:  # nothing is pending without squashing: straight to the log
            self._writer.append_all(groups, records)
        self._changed_many(state, groups, raw)

    def flush(self) -> None:
        """Append the squashed changes waiting for the next checkpoint or materialization."""
        pending, self._pending = self._pending, {}
        for (key_group, _, _), record in pending.items():
            self._writer.append(key_group, record)

    def _log(self, op: Op, state_id: int, key_group: int, key: bytes, record: bytes) -> None:
        if self._squash and op in REPLACING:
            self._pending[(key_group, state_id, key)] = record
            return
        if self._pending:  # an earlier replacing change of this entry goes first
            earlier = self._pending.pop((key_group, state_id, key), None)
            if earlier is not None:
                self._writer.append(key_group, earlier)
        self._writer.append(key_group, record)
